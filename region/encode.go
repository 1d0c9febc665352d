package region

import (
	"math"
	"strconv"
)

// The body of every check is a Decision. encoding/json spends a third of
// the HTTP path's time on it through reflection, so the common case is
// written by hand here, byte for byte what json.Marshal writes (a test and
// a fuzz target compare the two). Anything unusual — exemptions (their
// times), a string needing escapes, a scale that is not a finite number —
// is left to encoding/json: ok is false and b is returned unchanged.

// appendDecision appends d as JSON to b.
func appendDecision(b []byte, d *Decision) ([]byte, bool) {
	if len(d.Exempt) > 0 {
		return b, false
	}
	start := len(b)
	fail := func() ([]byte, bool) { return b[:start], false }
	var ok bool
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, d.Allowed)
	if b, ok = appendField(b, `,"subject":`, d.Subject); !ok {
		return fail()
	}
	if b, ok = appendField(b, `,"tier":`, d.Tier); !ok {
		return fail()
	}
	if d.Policy != "" {
		if b, ok = appendField(b, `,"policy":`, d.Policy); !ok {
			return fail()
		}
	}
	if d.Mode != "" {
		if b, ok = appendField(b, `,"mode":`, d.Mode); !ok {
			return fail()
		}
	}
	b = appendInt(b, `,"limit":`, d.Limit)
	b = appendInt(b, `,"remaining":`, d.Remaining)
	b = appendInt(b, `,"reset_ms":`, d.ResetMS)
	b = appendInt(b, `,"retry_after_ms":`, d.RetryAfterMS)
	b = append(b, `,"would_reject":`...)
	b = strconv.AppendBool(b, d.WouldReject)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, d.Degraded)
	if b, ok = appendField(b, `,"source":`, d.Source); !ok {
		return fail()
	}
	b = append(b, `,"policies":`...)
	if d.Policies == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range d.Policies {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendPolicyResult(b, &d.Policies[i]); !ok {
				return fail()
			}
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

func appendPolicyResult(b []byte, p *PolicyResult) ([]byte, bool) {
	var ok bool
	if b, ok = appendField(b, `{"id":`, p.ID); !ok {
		return b, false
	}
	b = appendInt(b, `,"version":`, int64(p.Version))
	for _, f := range [...]struct{ key, v string }{{`,"mode":`, p.Mode}, {`,"class":`, p.Class}, {`,"scope":`, p.Scope}} {
		if b, ok = appendField(b, f.key, f.v); !ok {
			return b, false
		}
	}
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, p.Allowed)
	if p.WouldReject {
		b = append(b, `,"would_reject":true`...)
	}
	b = append(b, `,"evaluated":`...)
	b = strconv.AppendBool(b, p.Evaluated)
	b = appendInt(b, `,"cost":`, p.Cost)
	b = appendInt(b, `,"limit":`, p.Limit)
	b = appendInt(b, `,"remaining":`, p.Remaining)
	b = appendInt(b, `,"reset_ms":`, p.ResetMS)
	b = appendInt(b, `,"retry_after_ms":`, p.RetryAfterMS)
	if p.Scale != 0 {
		if b, ok = appendFloat(append(b, `,"scale":`...), p.Scale); !ok {
			return b, false
		}
	}
	if p.Override != "" {
		if b, ok = appendField(b, `,"override":`, p.Override); !ok {
			return b, false
		}
	}
	if p.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	return append(b, '}'), true
}

func appendInt(b []byte, key string, v int64) []byte {
	return strconv.AppendInt(append(b, key...), v, 10)
}

// appendField appends key and s as a JSON string, if s needs no escaping
// under encoding/json's rules (which also escape <, > and & for HTML).
func appendField(b []byte, key, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, key...)
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendFloat formats a float64 the way encoding/json does (ES6 number
// formatting); NaN and infinities have no JSON form.
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

// appendRejection appends c as JSON to b, as appendDecision does: the
// problem members, then the decision's. The detail quotes a policy id, so
// here a string may hold '"' and '\', which encoding/json escapes as \"
// and \\; anything else unusual is left to encoding/json.
func appendRejection(b []byte, c *checkRejection) ([]byte, bool) {
	start := len(b)
	fail := func() ([]byte, bool) { return b[:start], false }
	var ok bool
	if b, ok = appendQuoted(b, `{"type":`, c.Type); !ok {
		return fail()
	}
	if b, ok = appendQuoted(b, `,"title":`, c.Title); !ok {
		return fail()
	}
	b = appendInt(b, `,"status":`, int64(c.Status))
	if b, ok = appendQuoted(b, `,"detail":`, c.Detail); !ok {
		return fail()
	}
	if c.Instance != "" {
		if b, ok = appendQuoted(b, `,"instance":`, c.Instance); !ok {
			return fail()
		}
	}
	if b, ok = appendViolated(b, c.ViolatedPolicies); !ok {
		return fail()
	}
	open := len(b)
	if b, ok = appendDecision(b, &c.Decision); !ok {
		return fail()
	}
	b[open] = ',' // the decision's members continue the object
	return b, true
}

// appendQuoted is appendField that also takes '"' and '\'.
func appendQuoted(b []byte, key, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '<' || c == '>' || c == '&' {
			return b, false
		}
	}
	b = append(b, key...)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"'), true
}

// appendProblem appends p as JSON to b, as appendRejection does, for a
// problem without field errors (a rejection, a 404); one with errors, or
// anything unusual, is left to encoding/json.
func appendProblem(b []byte, p *Problem) ([]byte, bool) {
	if len(p.Errors) > 0 {
		return b, false
	}
	start := len(b)
	fail := func() ([]byte, bool) { return b[:start], false }
	var ok bool
	if b, ok = appendQuoted(b, `{"type":`, p.Type); !ok {
		return fail()
	}
	if b, ok = appendQuoted(b, `,"title":`, p.Title); !ok {
		return fail()
	}
	b = appendInt(b, `,"status":`, int64(p.Status))
	for _, f := range [...]struct{ key, v string }{{`,"detail":`, p.Detail}, {`,"instance":`, p.Instance}} {
		if f.v == "" {
			continue
		}
		if b, ok = appendQuoted(b, f.key, f.v); !ok {
			return fail()
		}
	}
	if b, ok = appendViolated(b, p.ViolatedPolicies); !ok {
		return fail()
	}
	if p.RetryAfterMS != nil {
		b = appendInt(b, `,"retry_after_ms":`, *p.RetryAfterMS)
	}
	return append(b, '}'), true
}

// appendViolated appends `,"violated-policies":[...]` for a non-empty ids,
// nothing for an empty one; ok is false when an id needs escaping, as for
// appendQuoted.
func appendViolated(b []byte, ids []string) ([]byte, bool) {
	if len(ids) == 0 {
		return b, true
	}
	b = append(b, `,"violated-policies":`...)
	ok := true
	for i, id := range ids {
		key := ","
		if i == 0 {
			key = "["
		}
		if b, ok = appendQuoted(b, key, id); !ok {
			return b, false
		}
	}
	return append(b, ']'), true
}
