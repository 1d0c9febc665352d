package decide

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The RateLimit fields follow draft-ietf-httpapi-ratelimit-headers-11
// exactly: each is a Structured Field List (RFC 9651) of Items whose value
// is the policy name as a String, with Integer parameters:
//
//	RateLimit-Policy: "pro-default";q=200;w=2
//	RateLimit: "pro-default";r=57;t=1
//
// One item per enforced policy that is not class security; shadow policies
// and security policies never appear.

// HeaderItem is one policy in the RateLimit fields.
type HeaderItem struct {
	Name string
	// Quota (q) and Window (w, seconds, at least 1) for RateLimit-Policy.
	Quota, Window int64
	// Available (r) and Effective window (t, seconds) for RateLimit.
	Available, T int64
}

// ceilSeconds rounds a duration up to whole seconds (delay-seconds): 10 ms
// is 1, 1 s is 1, 1.001 s is 2, zero and negative are 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// windowSeconds is a policy's w: the window of a window algorithm, or the
// time a bucket takes to refill from empty (burst / rate), whole seconds
// rounded up and at least 1 (the draft's w is a non-zero Integer).
func windowSeconds(windowed bool, window time.Duration, rate, burst float64) int64 {
	var s float64
	if windowed {
		s = window.Seconds()
	} else if rate > 0 {
		s = burst / rate
	}
	if !(s >= 1) || math.IsNaN(s) {
		return 1
	}
	if s > 1e15 {
		return 1e15
	}
	return int64(math.Ceil(s - 1e-9))
}

// sfString serializes a Structured Field String (RFC 9651 §4.1.6). Policy
// ids never need escaping, but the serializer must not emit an invalid
// field for any input: characters outside printable ASCII become "?".
func sfString(s string) string {
	var b strings.Builder
	b.Grow(sfStringLen(s))
	writeSFString(&b, s)
	return b.String()
}

// sfStringLen is the length of s serialized by writeSFString.
func sfStringLen(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			n++
		}
	}
	return n
}

// writeSFString writes s as a Structured Field String (see sfString).
func writeSFString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// decimalLen is the length of strconv.FormatInt(v, 10).
func decimalLen(v int64) int {
	n := 1
	if v < 0 {
		n++ // the sign; -v may overflow, so count on v itself
	}
	for v <= -10 || v >= 10 {
		v /= 10
		n++
	}
	return n
}

// The two fields' parameters: RateLimit-Policy has q and w (at least 1),
// RateLimit has r and t.
var (
	policyParams    = itemParams{";q=", ";w=", func(it *HeaderItem) (int64, int64) { return max(it.Quota, 0), max(it.Window, 1) }}
	rateLimitParams = itemParams{";r=", ";t=", func(it *HeaderItem) (int64, int64) { return max(it.Available, 0), max(it.T, 0) }}
)

// itemParams names an Item's two Integer parameters (each ";k=") and
// reads their values.
type itemParams struct {
	k1, k2 string
	values func(*HeaderItem) (int64, int64)
}

// FormatPolicyHeader formats items as a RateLimit-Policy value. It and
// FormatRateLimitHeader are on the path of every check: each sizes its
// value first and allocates it once.
func FormatPolicyHeader(items []HeaderItem) string {
	var b strings.Builder
	b.Grow(policyParams.len(items))
	policyParams.write(&b, items)
	return b.String()
}

// FormatRateLimitHeader formats items as a RateLimit value.
func FormatRateLimitHeader(items []HeaderItem) string {
	var b strings.Builder
	b.Grow(rateLimitParams.len(items))
	rateLimitParams.write(&b, items)
	return b.String()
}

// SetRateLimitFields sets RateLimit-Policy and RateLimit from items with
// two allocations in all, where two Header.Set calls of the formatted
// values take six: both values share one string and one slice, and the
// keys are given in canonical form ("Ratelimit-Policy"), which Set would
// otherwise recompute on every call.
func SetRateLimitFields(h http.Header, items []HeaderItem) {
	if len(items) == 0 {
		return
	}
	np := policyParams.len(items)
	var b strings.Builder
	b.Grow(np + rateLimitParams.len(items))
	policyParams.write(&b, items)
	rateLimitParams.write(&b, items)
	both := b.String()
	vals := []string{both[:np], both[np:]}
	h["Ratelimit-Policy"] = vals[0:1:1]
	h["Ratelimit"] = vals[1:2:2]
}

// len is the length of what write writes.
func (ps itemParams) len(items []HeaderItem) int {
	n := 0
	for i := range items {
		a, c := ps.values(&items[i])
		n += sfStringLen(items[i].Name) + len(ps.k1) + decimalLen(a) + len(ps.k2) + decimalLen(c)
	}
	if len(items) > 1 {
		n += 2 * (len(items) - 1)
	}
	return n
}

// write writes each item as its String name and the two parameters,
// separated by ", ".
func (ps itemParams) write(b *strings.Builder, items []HeaderItem) {
	var num [20]byte
	for i := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		a, c := ps.values(&items[i])
		writeSFString(b, items[i].Name)
		b.WriteString(ps.k1)
		b.Write(strconv.AppendInt(num[:0], a, 10))
		b.WriteString(ps.k2)
		b.Write(strconv.AppendInt(num[:0], c, 10))
	}
}

// SFItem is one parsed Item of a RateLimit or RateLimit-Policy field: a
// String value and its Integer or String parameters.
type SFItem struct {
	Name   string
	Params map[string]string
}

var errSF = errors.New("malformed structured field list")

// ParseRateLimitList parses a RateLimit or RateLimit-Policy field value as
// the draft defines it (a List of String Items with parameters). It accepts
// the subset of RFC 9651 those fields use, which is what a client such as a
// test or a gateway script needs; anything else is an error, and clients
// must then ignore the field (draft -11 §5).
func ParseRateLimitList(v string) ([]SFItem, error) {
	var out []SFItem
	i := 0
	skipOWS := func() {
		for i < len(v) && (v[i] == ' ' || v[i] == '\t') {
			i++
		}
	}
	skipOWS()
	if i == len(v) {
		return nil, nil
	}
	for {
		if i >= len(v) || v[i] != '"' {
			return nil, errSF
		}
		name, n, err := parseSFString(v[i:])
		if err != nil {
			return nil, err
		}
		i += n
		it := SFItem{Name: name, Params: map[string]string{}}
		for i < len(v) && v[i] == ';' {
			i++
			for i < len(v) && v[i] == ' ' {
				i++
			}
			start := i
			for i < len(v) && (v[i] >= 'a' && v[i] <= 'z' || v[i] >= '0' && v[i] <= '9' || v[i] == '_' || v[i] == '-' || v[i] == '.' || v[i] == '*') {
				i++
			}
			if start == i || !(v[start] >= 'a' && v[start] <= 'z' || v[start] == '*') {
				return nil, errSF
			}
			key := v[start:i]
			val := "?1"
			if i < len(v) && v[i] == '=' {
				i++
				if i < len(v) && v[i] == '"' {
					s, n, err := parseSFString(v[i:])
					if err != nil {
						return nil, err
					}
					i += n
					val = s
				} else {
					start := i
					if i < len(v) && v[i] == '-' {
						i++
					}
					for i < len(v) && v[i] >= '0' && v[i] <= '9' {
						i++
					}
					if i == start || i-start > 16 || v[i-1] == '-' {
						return nil, errSF
					}
					val = v[start:i]
				}
			}
			it.Params[key] = val
		}
		out = append(out, it)
		skipOWS()
		if i == len(v) {
			return out, nil
		}
		if v[i] != ',' {
			return nil, errSF
		}
		i++
		skipOWS()
		if i == len(v) {
			return nil, errSF // trailing comma
		}
	}
}

// parseSFString parses the String at the start of v, returning it and the
// bytes it took.
func parseSFString(v string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", 0, errSF
			}
			b.WriteByte(v[i])
		case c == '"':
			return b.String(), i + 1, nil
		case c < 0x20 || c > 0x7e:
			return "", 0, errSF
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, errSF
}
