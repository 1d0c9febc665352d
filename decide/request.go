package decide

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/engine"

	"github.com/sluice-rl/sluice/quota"
)

// CheckRequest is the body of POST /v1/check and one element of a batch.
// Exactly one of api_key, user, ip, subject names the requester; ip may
// also accompany api_key or user, to count an unknown key by address.
type CheckRequest struct {
	quota.SubjectFields
	// Tier is the requester's tier as the calling gateway knows it; empty
	// means the key registry decides (or "anonymous").
	Tier string `json:"tier,omitempty"`
	// Method is the HTTP method of the request being limited; default GET.
	Method string `json:"method,omitempty"`
	// Route is its path (a query string is ignored); required. It is
	// matched in quota.NormalizeRoute's canonical form.
	Route string `json:"route"`
	// Cost, when given, replaces every policy's cost-table cost; zero
	// reads the state without spending.
	Cost *int64 `json:"cost,omitempty"`
	// Reservation, when given, holds the cost this check spends, when it
	// is allowed, as an estimate under this id, for POST /v1/charge to
	// settle with the real cost within ReservationTTLMS (default
	// DefaultReservationTTL, at most engine.MaxReservationTTL).
	Reservation      string `json:"reservation,omitempty"`
	ReservationTTLMS int64  `json:"reservation_ttl_ms,omitempty"`
}

// Target is a validated request to limit: who asks, for which method and
// route, at what cost.
type Target struct {
	ID quota.Identity
	// Method is upper case; Route is in quota.NormalizeRoute's form.
	Method, Route string
	// Cost, when not nil, replaces every policy's cost.
	Cost *int64
	// Field prefixes the field names in problems ("" or "checks[3]").
	Field string
	// Reservation, when not empty, holds the enforced policies' costs of
	// an allowed check for ReservationTTL (zero: DefaultReservationTTL).
	Reservation    string
	ReservationTTL time.Duration
}

// MaxRouteLen bounds a route, in bytes.
const MaxRouteLen = 4096

// ValidMethod reports whether m is an HTTP method name: 1 to 32 ASCII
// letters. It uses no regular expression: it is on the path of every
// check.
func ValidMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// ValidRoute reports why route cannot be limited: empty, longer than
// MaxRouteLen, not starting with / or holding control characters; nil if
// it can.
func ValidRoute(route string) error {
	switch {
	case route == "":
		return errors.New("required: the path of the request being limited, e.g. /v1/orders")
	case len(route) > MaxRouteLen:
		return fmt.Errorf("longer than %d bytes", MaxRouteLen)
	case route[0] != '/':
		return fmt.Errorf("must start with /, got %q", Clip(route))
	}
	for i := 0; i < len(route); i++ {
		if c := route[i]; c < 0x20 || c == 0x7f {
			return errors.New("must not contain control characters")
		}
	}
	return nil
}

// Clip shortens s to 64 bytes and an ellipsis, for quoting input in a
// problem.
func Clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Target validates in into a Target; prefix names in's place in a larger
// request ("" or "checks[3]") in the fields of a problem.
func (in *CheckRequest) Target(prefix string) (Target, *Problem) {
	at := func(f string) string {
		if prefix == "" {
			return f
		}
		if f == "" {
			return prefix
		}
		return prefix + "." + f
	}
	id, err := in.SubjectFields.Identity()
	if err != nil {
		if p, ok := FromValidation(err, prefix); ok {
			return Target{}, p
		}
		return Target{}, Invalid(at(""), "%v", err)
	}
	if in.Tier != "" {
		if !quota.ValidID(in.Tier) {
			return Target{}, Invalid(at("tier"), "must match %s, got %q", quota.IDPattern, Clip(in.Tier))
		}
		id.Tier = in.Tier
	}
	method := in.Method
	if method == "" {
		method = http.MethodGet
	} else if !ValidMethod(method) {
		return Target{}, Invalid(at("method"), "must be an HTTP method such as GET, got %q", Clip(method))
	}
	if err := ValidRoute(in.Route); err != nil {
		return Target{}, Invalid(at("route"), "%v", err)
	}
	if in.Cost != nil && *in.Cost < 0 {
		return Target{}, Invalid(at("cost"), "must not be negative, got %d", *in.Cost)
	}
	if len(in.Reservation) > engine.MaxReservationID {
		return Target{}, Invalid(at("reservation"), "must be at most %d bytes", engine.MaxReservationID)
	}
	if ms := in.ReservationTTLMS; ms < 0 || ms > engine.MaxReservationTTL.Milliseconds() || (ms != 0 && in.Reservation == "") {
		return Target{}, Invalid(at("reservation_ttl_ms"), "must be from 1 to %d, with a reservation, got %d", engine.MaxReservationTTL.Milliseconds(), ms)
	}
	return Target{ID: id, Method: strings.ToUpper(method), Route: quota.NormalizeRoute(in.Route), Cost: in.Cost, Field: prefix,
		Reservation: in.Reservation, ReservationTTL: time.Duration(in.ReservationTTLMS) * time.Millisecond}, nil
}
