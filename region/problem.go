package region

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

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

func (p *Problem) Error() string { return p.Title + ": " + p.Detail }

func newProblem(status int, typ, detail string, errs ...quota.FieldError) *Problem {
	return &Problem{Type: typ, Title: http.StatusText(status), Status: status, Detail: detail, Errors: errs}
}

func invalid(field, format string, args ...any) *Problem {
	reason := fmt.Sprintf(format, args...)
	return newProblem(http.StatusBadRequest, ProblemInvalid, describe(field, reason), quota.FieldError{Field: field, Reason: reason})
}

func describe(field, reason string) string {
	if field == "" {
		return reason
	}
	return field + ": " + reason
}

// fromValidation turns a *quota.ValidationError into a 400 problem that
// names every field; prefix is prepended to each field path.
func fromValidation(err error, prefix string) (*Problem, bool) {
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
	return newProblem(http.StatusBadRequest, ProblemInvalid, detail, errs...), true
}

// Header values shared by every answer: assigning one of these slices to a
// header key replaces that key's values without allocating. No code may
// write into them (Header.Set and Header.Add never do: they replace or
// grow the slice).
var (
	hdrJSON    = []string{"application/json"}
	hdrProblem = []string{"application/problem+json"}
	hdrNoStore = []string{"no-store"}
)

// writeProblem writes p as application/problem+json. The instance is the
// request path unless p names one.
func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	bp := bodyBufs.Get().(*[]byte)
	defer putBody(bp)
	body, ok := appendProblem((*bp)[:0], p)
	*bp = body
	if !ok {
		var err error
		if body, err = json.Marshal(p); err != nil { // cannot happen: every member is a plain value
			body = []byte(`{"type":"` + ProblemInternal + `","title":"Internal Server Error","status":500}`)
			p.Status = http.StatusInternalServerError
		}
	}
	h := w.Header()
	h["Content-Type"] = hdrProblem
	if p.Status == http.StatusTooManyRequests {
		h["Cache-Control"] = hdrNoStore // RFC 6585: 429 must not be stored
	}
	writeBody(w, p.Status, append(body, '\n'))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	if d, ok := v.(Decision); ok {
		writeDecision(w, status, &d)
		return
	}
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, nil, newProblem(http.StatusInternalServerError, ProblemInternal, "encoding the response failed"))
		return
	}
	w.Header()["Content-Type"] = hdrJSON
	writeBody(w, status, append(body, '\n'))
}

// writeDecision is writeJSON for the body of a check; a *Decision is not
// copied into an interface value, which saves an allocation per check.
func writeDecision(w http.ResponseWriter, status int, d *Decision) {
	bp := bodyBufs.Get().(*[]byte)
	defer putBody(bp) // Write keeps no reference to its argument (io.Writer)
	body, ok := appendDecision((*bp)[:0], d)
	*bp = body
	if !ok {
		// A copy, so that d itself does not escape to the heap on the
		// common path.
		b, err := json.Marshal(*d)
		if err != nil {
			writeProblem(w, nil, newProblem(http.StatusInternalServerError, ProblemInternal, "encoding the response failed"))
			return
		}
		body = b
	}
	w.Header()["Content-Type"] = hdrJSON
	writeBody(w, status, append(body, '\n'))
}

// chunkingThreshold is the size below which net/http buffers a whole
// answer and sets its Content-Length itself (the server's
// bufferBeforeChunkingSize): a body written at once and smaller than this
// needs no header of ours, which saves formatting it on every check.
const chunkingThreshold = 2048

// writeBody writes the status and body, with a Content-Length when the
// server would not set it.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	if len(body) >= chunkingThreshold {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	w.Write(body)
}
