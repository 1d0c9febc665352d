package decide

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/sluice-rl/sluice/quota"
)

// Problem types. The rate-limit ones are those proposed by
// draft-ietf-httpapi-ratelimit-headers-11 for IANA's HTTP Problem Types
// registry; the others are Sluice's own, documented in docs/api.md.
const (
	ProblemQuotaExceeded   = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	ProblemAbnormalUsage   = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"

	problemBase         = "https://sluice-rl.github.io/problems/"
	ProblemInvalid      = problemBase + "invalid-request"
	ProblemUnauthorized = problemBase + "unauthorized"
	ProblemForbidden    = problemBase + "forbidden"
	ProblemNotFound     = problemBase + "not-found"
	ProblemConflict     = problemBase + "conflict"
	ProblemPrecondition = problemBase + "precondition-failed"
	ProblemTooLarge     = problemBase + "body-too-large"
	ProblemMethod       = "about:blank"
	ProblemUnavailable  = problemBase + "policy-store-unavailable"
	ProblemStateStore   = problemBase + "state-store-unavailable"
	ProblemInternal     = problemBase + "internal-error"
)

// Problem is an RFC 9457 problem details object. Errors lists each field
// that was wrong (a Sluice extension member); ViolatedPolicies is the
// member the RateLimit draft's problem types add.
type Problem struct {
	Type             string             `json:"type"`
	Title            string             `json:"title"`
	Status           int                `json:"status"`
	Detail           string             `json:"detail,omitempty"`
	Instance         string             `json:"instance,omitempty"`
	Errors           []quota.FieldError `json:"errors,omitempty"`
	ViolatedPolicies []string           `json:"violated-policies,omitempty"`
	// RetryAfterMS repeats Retry-After in milliseconds for 429 and 503.
	RetryAfterMS *int64 `json:"retry_after_ms,omitempty"`
}

// Error returns the title and the detail, so that a *Problem is an error.
func (p *Problem) Error() string { return p.Title + ": " + p.Detail }

// NewProblem returns a problem of status and type typ; its title is the
// status text and errs, when given, name the fields that were wrong.
func NewProblem(status int, typ, detail string, errs ...quota.FieldError) *Problem {
	return &Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail, Errors: errs}
}

// Invalid returns a 400 problem saying that field (empty for the whole
// request) is wrong for the reason format and args spell.
func Invalid(field, format string, args ...any) *Problem {
	reason := fmt.Sprintf(format, args...)
	return NewProblem(http.StatusBadRequest, ProblemInvalid, describe(field, reason), quota.FieldError{Field: field, Reason: reason})
}

// describe is reason, prefixed by field when there is one.
func describe(field, reason string) string {
	if field == "" {
		return reason
	}
	return field + ": " + reason
}

// FromValidation turns a *quota.ValidationError into a 400 problem that
// names every field; prefix is prepended to each field path.
func FromValidation(err error, prefix string) (*Problem, bool) {
	var ve *quota.ValidationError
	if !errors.As(err, &ve) {
		return nil, false
	}
	errs := make([]quota.FieldError, len(ve.Problems))
	for i, fe := range ve.Problems {
		f := fe.Field
		if prefix != "" {
			switch {
			case f == "":
				f = prefix
			case f[0] == '[':
				f = prefix + f
			default:
				f = prefix + "." + f
			}
		}
		errs[i] = quota.FieldError{Field: f, Reason: fe.Reason}
	}
	detail := "the request is invalid"
	if len(errs) > 0 {
		detail = describe(errs[0].Field, errs[0].Reason)
		if len(errs) > 1 {
			detail += fmt.Sprintf(" (and %d more)", len(errs)-1)
		}
	}
	return NewProblem(http.StatusBadRequest, ProblemInvalid, detail, errs...), true
}
