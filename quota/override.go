package quota

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/engine"
)

// Override changes a policy's parameters for one subject until ExpiresAt,
// or, with Unlimited, exempts the subject from the policy until then.
// A zero parameter keeps the policy's value. Overrides outlive policy
// versions: they apply to whatever version of Policy is in force, and an
// override whose parameters no longer fit that version (or an exemption of
// a policy that has become class security) is ignored.
type Override struct {
	// ID names the override: ^[a-z0-9][a-z0-9._-]{0,63}$.
	ID string `json:"id"`
	// Subject is the subject string, as Identity.Subject or
	// SubjectFields.Identity produce it, e.g. "user:42" or "ip:192.0.2.1".
	Subject string `json:"subject"`
	// Policy is the id of the policy it overrides.
	Policy     string  `json:"policy"`
	RatePerSec float64 `json:"rate_per_sec,omitempty"`
	Burst      float64 `json:"burst,omitempty"`
	Count      float64 `json:"limit,omitempty"`
	Window     float64 `json:"window,omitempty"` // seconds
	// Unlimited exempts the subject from the policy: while the override
	// is in force the policy is not evaluated for the subject at all (no
	// state is read or written, it is in no RateLimit header) and Match
	// reports it as an Exemption instead of an Applied. An unlimited
	// override sets none of the parameters above, and a class security
	// policy cannot be exempted (see validateFor).
	Unlimited bool `json:"unlimited,omitempty"`
	// ExpiresAt (RFC 3339) is when the override stops applying. It must be
	// in the future when the override is created.
	ExpiresAt time.Time `json:"expires_at"`
}

// ParseOverride decodes an override document strictly. It checks the
// fields that do not depend on the policy; Registry.PutOverride checks the
// rest against the policy in force.
func ParseOverride(data []byte) (Override, error) {
	var o Override
	if len(data) > MaxPolicyBytes {
		return o, &ValidationError{Problems: []FieldError{{Reason: fmt.Sprintf("document is %d bytes, at most %d allowed", len(data), MaxPolicyBytes)}}}
	}
	if err := decodeStrict(data, &o); err != nil {
		return Override{}, err
	}
	if err := o.validateShape(); err != nil {
		return Override{}, err
	}
	return o, nil
}

func (o Override) validateShape() error {
	ve := &ValidationError{}
	if !idPattern.MatchString(o.ID) {
		ve.add("id", "must match ^[a-z0-9][a-z0-9._-]{0,63}$, got %q", clip(o.ID))
	}
	if err := validSubject(o.Subject); err != nil {
		ve.add("subject", "%v", err)
	}
	if !idPattern.MatchString(o.Policy) {
		ve.add("policy", "must be a policy id, got %q", clip(o.Policy))
	}
	if o.Unlimited {
		// An exemption has no limit to tune: a parameter beside it is a
		// mistake (which one did the operator mean?), not a no-op.
		for _, f := range []struct {
			name string
			v    float64
		}{{"rate_per_sec", o.RatePerSec}, {"burst", o.Burst}, {"limit", o.Count}, {"window", o.Window}} {
			if f.v != 0 {
				ve.add(f.name, "must not be set with unlimited: an exemption has no limit (drop %s, or drop unlimited to change the limit instead)", f.name)
			}
		}
	} else if o.RatePerSec == 0 && o.Burst == 0 && o.Count == 0 && o.Window == 0 {
		ve.add("", "must set at least one of rate_per_sec, burst, limit, window, or unlimited")
	}
	if o.ExpiresAt.IsZero() {
		ve.add("expires_at", "is required (RFC 3339)")
	}
	return ve.err()
}

// validateFor checks the override against the policy it overrides.
func (o Override) validateFor(p Policy, now time.Time) error {
	ve := &ValidationError{}
	if err := o.validateShape(); err != nil {
		ve = err.(*ValidationError)
	}
	if !o.ExpiresAt.IsZero() && !o.ExpiresAt.After(now) {
		ve.add("expires_at", "must be in the future, got %s", o.ExpiresAt.Format(time.RFC3339))
	}
	if o.Unlimited {
		if err := exemptable(p); err != nil {
			ve.add("unlimited", "%v", err)
		}
		return ve.err()
	}
	l := p.Limit()
	if l.Algorithm.Windowed() {
		if o.RatePerSec != 0 {
			ve.add("rate_per_sec", "not used by policy %s (%s)", p.ID, l.Algorithm)
		}
		if o.Burst != 0 {
			ve.add("burst", "not used by policy %s (%s)", p.ID, l.Algorithm)
		}
	} else {
		if o.Count != 0 {
			ve.add("limit", "not used by policy %s (%s)", p.ID, l.Algorithm)
		}
		if o.Window != 0 {
			ve.add("window", "not used by policy %s (%s)", p.ID, l.Algorithm)
		}
	}
	eff := o.apply(l)
	burst, count := p.Burst, p.Count
	if o.Burst != 0 {
		burst = o.Burst
	}
	if o.Count != 0 {
		count = o.Count
	}
	validateLimit(ve, "", eff, burst, count)
	return ve.err()
}

// exemptable reports why p cannot be exempted, or nil. A class security
// policy (login, OTP, password reset) bounds how fast anyone can guess a
// secret; an exemption would give its subject unlimited guesses, and since
// security policies are never shown in headers or named to clients,
// nothing would show it. A partner that needs more attempts gets an
// ordinary override that raises the limit and still bounds guessing.
func exemptable(p Policy) error {
	if p.Class == ClassSecurity {
		return fmt.Errorf("policy %s is class security and cannot be exempted: an exempt subject could guess without limit; raise its limit with an override (rate_per_sec, burst, limit, window) instead", p.ID)
	}
	return nil
}

// fits reports whether every parameter the override sets is used by a.
func (o Override) fits(a engine.Algorithm) bool {
	if a.Windowed() {
		return o.RatePerSec == 0 && o.Burst == 0
	}
	return o.Count == 0 && o.Window == 0
}

// apply returns l with the override's non-zero parameters.
func (o Override) apply(l engine.Limit) engine.Limit {
	if o.RatePerSec != 0 {
		l.Rate = o.RatePerSec
	}
	if o.Burst != 0 {
		l.Burst = o.Burst
	}
	if o.Count != 0 {
		l.Count = o.Count
	}
	if o.Window != 0 {
		l.Window = windowDuration(o.Window)
	}
	return l
}

// maxSubjectLen bounds a subject string in bytes.
const maxSubjectLen = 256

// validSubject accepts what may be a subject: at most 256 bytes of UTF-8
// without spaces, control characters or braces (braces would break the
// Redis hash tag built around the subject).
func validSubject(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > maxSubjectLen {
		return fmt.Errorf("must be at most %d bytes, got %d", maxSubjectLen, len(s))
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("must be valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == '{' || r == '}' || r == utf8.RuneError {
			return fmt.Errorf("must not contain spaces, control characters or braces, got %q", clip(s))
		}
	}
	return nil
}
