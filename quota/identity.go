package quota

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// TierAnonymous is the tier of a request without a known API key or a
// trusted tier.
const TierAnonymous = "anonymous"

// IdentityConfig says where Identify finds a request's identity.
type IdentityConfig struct {
	// KeyHeaders are read in order; the first present one gives the API
	// key. "Authorization" is read as "Bearer <key>" (other schemes are
	// skipped). Nil means DefaultKeyHeaders(); an empty non-nil slice reads
	// no key.
	KeyHeaders []string
	// UserHeader carries the user id set by a trusted gateway after it
	// authenticated the user. Read only from trusted peers; "" disables it.
	UserHeader string
	// TierHeader carries the tier set by a trusted gateway. Read only from
	// trusted peers; "" disables it.
	TierHeader string
	// TrustedProxies are the networks of the proxies and gateways whose
	// Forwarded / X-Forwarded-For, user and tier headers are believed.
	// Empty: every peer is a client, and only its socket address counts.
	TrustedProxies []netip.Prefix
	// MaxHeaderBytes bounds each header Identify reads (all of its lines
	// together); a longer one is an *IdentityError. Zero means 8192.
	MaxHeaderBytes int
}

// DefaultKeyHeaders returns where an API key is looked for by default:
// "Authorization" (as "Bearer <key>"), then "X-API-Key".
func DefaultKeyHeaders() []string { return []string{"Authorization", "X-API-Key"} }

// DefaultIdentityConfig is the configuration for a daemon that clients
// reach directly: API key from the default headers, no trusted proxies, so
// the socket address is the client address. Add TrustedProxies (and
// UserHeader / TierHeader) when it sits behind a gateway.
func DefaultIdentityConfig() IdentityConfig {
	return IdentityConfig{KeyHeaders: DefaultKeyHeaders(), MaxHeaderBytes: 8192}
}

// Validate reports a configuration Identify cannot use: an invalid header
// name, a negative size, an invalid or IPv4-mapped trusted prefix (peers
// are compared unmapped, so "::ffff:10.0.0.0/104" would never match).
func (c IdentityConfig) Validate() error {
	names := append(slices.Clone(c.KeyHeaders), c.UserHeader, c.TierHeader)
	for i, h := range names {
		if h == "" && i >= len(c.KeyHeaders) {
			continue
		}
		if !validHeaderName(h) {
			return fmt.Errorf("identity: invalid header name %q", h)
		}
	}
	if c.MaxHeaderBytes < 0 {
		return fmt.Errorf("identity: MaxHeaderBytes must not be negative, got %d", c.MaxHeaderBytes)
	}
	for _, p := range c.TrustedProxies {
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return fmt.Errorf("identity: trusted proxy prefix %v is invalid, IPv4-mapped or zoned", p)
		}
	}
	return nil
}

// maxHops bounds how many Forwarded / X-Forwarded-For entries are walked.
const maxHops = 32

// maxKeyLen bounds an API key in bytes.
const maxKeyLen = 512

// IdentityError is a malformed or oversized identity header. The HTTP layer
// answers it with 400 naming Header.
type IdentityError struct {
	Header string
	Reason string
}

func (e *IdentityError) Error() string { return e.Header + ": " + e.Reason }

// ErrNoSubject means a request carries nothing to count it by.
var ErrNoSubject = errors.New("no api key, user or client address to identify the request")

// Identity is what is known about who made a request. Identify (from
// headers) and SubjectFields.Identity (from a check API body) produce the
// same Identity, and so the same Subject, for the same requester.
type Identity struct {
	// APIKey is the raw key. It is a secret: never log or store it.
	APIKey string
	// KeyID is KeyID(APIKey), or "".
	KeyID string
	// User is the user id, or "".
	User string
	// IP is the client address (IPv4, or IPv6 without zone); it is invalid
	// when unknown.
	IP netip.Addr
	// Tier is the tier a trusted gateway named, or "".
	Tier string
	// Raw is a subject the caller chose explicitly (check API "subject").
	Raw string
}

// keyIDLen is the length of a KeyID in hex digits (128 bits).
const keyIDLen = 32

// KeyID returns a stable, non-secret id for an API key: the first 128 bits
// of its SHA-256, in hex. Subjects, the key registry, stores and the audit
// log use it so that keys never leave the request.
func KeyID(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(sum[:keyIDLen/2])
}

// Subject returns the string limits are counted by: Raw if set, else
// "key:<KeyID>", "user:<id>", "ip:<IPv4>" or "ip6:<IPv6 /64 prefix>" (e.g.
// "ip6:2001:db8:1:2::/64"), or "" when nothing is known.
func (id Identity) Subject() string {
	switch {
	case id.Raw != "":
		return id.Raw
	case id.KeyID != "":
		return "key:" + id.KeyID
	case id.User != "":
		return "user:" + id.User
	}
	return id.IPSubject()
}

// IPSubject returns the subject of the client address alone: an IPv4
// address counts by itself, an IPv6 address by its /64 prefix (one
// customer's allocation), "" when unknown.
func (id Identity) IPSubject() string {
	if !id.IP.IsValid() {
		return ""
	}
	return IPSubject(id.IP)
}

// IPSubject returns "ip:1.2.3.4" for IPv4 (and IPv4-mapped IPv6), and
// "ip6:<prefix>/64" for IPv6.
func IPSubject(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return "ip:" + a.String()
	}
	p, _ := a.Prefix(64)
	return "ip6:" + p.String()
}

// SubjectFields are the identity fields of a check API body. Exactly one
// must be set.
type SubjectFields struct {
	APIKey  string `json:"api_key,omitempty"`
	User    string `json:"user,omitempty"`
	IP      string `json:"ip,omitempty"`
	Subject string `json:"subject,omitempty"`
}

// Identity validates the fields and returns the Identity they name, whose
// Subject equals that of Identify for the same key, user or address.
// Errors are *ValidationError naming the JSON field.
func (f SubjectFields) Identity() (Identity, error) {
	var id Identity
	ve := &ValidationError{}
	n := 0
	if f.APIKey != "" {
		n++
		if err := validKey(f.APIKey); err != nil {
			ve.add("api_key", "%v", err)
		}
		id.APIKey, id.KeyID = f.APIKey, KeyID(f.APIKey)
	}
	if f.User != "" {
		n++
		if err := validSubject(f.User); err != nil {
			ve.add("user", "%v", err)
		}
		id.User = f.User
	}
	if f.IP != "" {
		n++
		a, err := netip.ParseAddr(f.IP)
		if err != nil {
			ve.add("ip", "must be an IPv4 or IPv6 address, got %q", clip(f.IP))
		}
		id.IP = a.Unmap().WithZone("")
	}
	if f.Subject != "" {
		n++
		if err := validSubject(f.Subject); err != nil {
			ve.add("subject", "%v", err)
		}
		id.Raw = f.Subject
	}
	if n != 1 && len(ve.Problems) == 0 {
		ve.add("", "exactly one of api_key, user, ip, subject must be set, got %d", n)
	}
	if err := ve.err(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// Identify reads a request's identity (see IdentityConfig). It never
// panics; a malformed or oversized header is an *IdentityError, and a
// request with no key, user or parsable peer address is ErrNoSubject.
//
// The client address is the socket peer (r.RemoteAddr) unless that peer is
// a trusted proxy. Then Forwarded (RFC 7239; preferred) or X-Forwarded-For
// is walked from the right, skipping trusted proxies; the first untrusted
// address is the client. If the walk meets an entry that is not an address
// ("unknown", an obfuscated name, garbage), the last trusted hop is taken
// as the client, so that no client can choose its address. Headers from an
// untrusted peer are ignored.
func Identify(r *http.Request, cfg IdentityConfig) (Identity, error) {
	var id Identity
	limit := cfg.MaxHeaderBytes
	if limit <= 0 {
		limit = 8192
	}
	peer := parsePeer(r.RemoteAddr)
	trusted := peer.IsValid() && isTrusted(peer, cfg.TrustedProxies)

	keyHeaders := cfg.KeyHeaders
	if keyHeaders == nil {
		keyHeaders = DefaultKeyHeaders()
	}
	for _, h := range keyHeaders {
		v, ok, err := headerValue(r.Header, h, limit)
		if err != nil {
			return Identity{}, err
		}
		if !ok {
			continue
		}
		if strings.EqualFold(h, "Authorization") {
			scheme, tok, _ := strings.Cut(strings.TrimSpace(v), " ")
			if !strings.EqualFold(scheme, "Bearer") {
				continue
			}
			v = tok
		}
		v = strings.TrimSpace(v)
		if err := validKey(v); err != nil {
			return Identity{}, &IdentityError{Header: h, Reason: err.Error()}
		}
		id.APIKey, id.KeyID = v, KeyID(v)
		break
	}

	if trusted {
		for _, hs := range []struct {
			name string
			dst  *string
		}{{cfg.UserHeader, &id.User}, {cfg.TierHeader, &id.Tier}} {
			if hs.name == "" {
				continue
			}
			v, ok, err := headerValue(r.Header, hs.name, limit)
			if err != nil {
				return Identity{}, err
			}
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			if err := validSubject(v); err != nil {
				return Identity{}, &IdentityError{Header: hs.name, Reason: err.Error()}
			}
			*hs.dst = v
		}
		if id.Tier != "" && !idPattern.MatchString(id.Tier) {
			return Identity{}, &IdentityError{Header: cfg.TierHeader, Reason: fmt.Sprintf("not a tier name: %q", clip(id.Tier))}
		}
		ip, err := forwardedClient(r.Header, peer, cfg.TrustedProxies, limit)
		if err != nil {
			return Identity{}, err
		}
		id.IP = ip
	} else {
		id.IP = peer
	}
	if id.Subject() == "" {
		return Identity{}, ErrNoSubject
	}
	return id, nil
}

// validHeaderName reports whether h is an RFC 9110 token.
func validHeaderName(h string) bool {
	if h == "" || len(h) > 256 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// headerValue joins all lines of a header with ", " after checking their
// total size.
func headerValue(h http.Header, name string, limit int) (string, bool, error) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", false, nil
	}
	n := 0
	for _, v := range vs {
		n += len(v) + 2
	}
	if n > limit+2 {
		return "", false, &IdentityError{Header: name, Reason: fmt.Sprintf("longer than %d bytes", limit)}
	}
	if len(vs) == 1 {
		return vs[0], true, nil
	}
	return strings.Join(vs, ", "), true, nil
}

// validKey accepts an API key: 1 to 512 bytes of visible ASCII.
func validKey(k string) error {
	if k == "" {
		return fmt.Errorf("empty API key")
	}
	if len(k) > maxKeyLen {
		return fmt.Errorf("API key longer than %d bytes", maxKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] >= 0x7f {
			return fmt.Errorf("API key must be visible ASCII without spaces")
		}
	}
	return nil
}

func parsePeer(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap().WithZone("")
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return a.Unmap().WithZone("")
	}
	return netip.Addr{}
}

func isTrusted(a netip.Addr, nets []netip.Prefix) bool {
	for _, p := range nets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedClient walks Forwarded (or, without it, X-Forwarded-For) from
// the right. peer is trusted.
func forwardedClient(h http.Header, peer netip.Addr, trusted []netip.Prefix, limit int) (netip.Addr, error) {
	name := "Forwarded"
	v, ok, err := headerValue(h, name, limit)
	if !ok && err == nil {
		name = "X-Forwarded-For"
		v, ok, err = headerValue(h, name, limit)
	}
	if err != nil {
		return netip.Addr{}, err
	}
	if !ok {
		return peer, nil
	}
	client := peer
	rest := v
	for hops := 0; hops < maxHops && rest != ""; hops++ {
		var elem string
		if i := lastTopLevelComma(rest); i >= 0 {
			elem, rest = rest[i+1:], rest[:i]
		} else {
			elem, rest = rest, ""
		}
		var a netip.Addr
		var ok bool
		if name == "Forwarded" {
			a, ok = forwardedFor(elem)
		} else {
			a, ok = parseNode(strings.TrimSpace(elem))
		}
		if !ok {
			return client, nil // the last trusted hop
		}
		client = a
		if !isTrusted(a, trusted) {
			return a, nil
		}
	}
	return client, nil
}

// lastTopLevelComma finds the last comma outside a quoted string.
func lastTopLevelComma(s string) int {
	// Forwarded values may quote commas; X-Forwarded-For has no quotes, so
	// this is exact for both. Scan forward to know the quoting state.
	last, inQuote := -1, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if inQuote {
				i++
			}
		case '"':
			inQuote = !inQuote
		case ',':
			if !inQuote {
				last = i
			}
		}
	}
	return last
}

// forwardedFor extracts the for= node of one Forwarded element.
func forwardedFor(elem string) (netip.Addr, bool) {
	for pair := range strings.SplitSeq(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return parseNode(v)
	}
	return netip.Addr{}, false
}

// parseNode parses an address as proxies write it: "1.2.3.4",
// "1.2.3.4:80", "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:80".
func parseNode(s string) (netip.Addr, bool) {
	if s == "" {
		return netip.Addr{}, false
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// Principal is who a request counts against, and in which tier.
type Principal struct {
	Subject string
	Tier    string
	// UnknownKey is set when the request named an API key that neither the
	// registry nor a trusted gateway vouches for. Such a request is counted
	// by user or address, not by key, so that inventing keys does not
	// multiply quota.
	UnknownKey bool
}

// Resolve decides the tier and subject of an identity: the trusted tier
// (id.Tier) if any, else the registered tier of its key, else
// TierAnonymous. See "Tiers" in the package documentation.
func (r *Registry) Resolve(id Identity) Principal {
	p := Principal{Tier: id.Tier, Subject: id.Subject()}
	if id.KeyID != "" && p.Tier == "" {
		if t, ok := r.KeyTier(id.KeyID); ok {
			p.Tier = t
		} else {
			p.UnknownKey = true
			if id.Raw == "" {
				fallback := id
				fallback.KeyID, fallback.APIKey = "", ""
				if s := fallback.Subject(); s != "" {
					p.Subject = s
				}
			}
		}
	}
	if p.Tier == "" {
		p.Tier = TierAnonymous
	}
	return p
}
