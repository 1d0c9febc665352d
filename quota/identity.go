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
	// client-address (ClientIPHeader), user and tier headers are believed.
	// Empty: every peer is a client, and only its socket address counts.
	TrustedProxies []netip.Prefix
	// ClientIPHeader is the one header that names the client address when
	// the socket peer is a trusted proxy: ClientIPXForwardedFor (also ""),
	// ClientIPXRealIP, ClientIPForwarded or ClientIPNone (the socket peer
	// always). No other forwarding header is ever read.
	ClientIPHeader string
	// MaxHeaderBytes bounds each key, user and tier header Identify reads
	// (all of its lines together): a longer key header is no key, a longer
	// user or tier header an *IdentityError. The client-address header is
	// not bounded: it is read once, from the right. Zero means 8192.
	MaxHeaderBytes int
}

// The values of IdentityConfig.ClientIPHeader.
const (
	// ClientIPXForwardedFor walks X-Forwarded-For from the right and takes
	// the first address that is not a trusted proxy.
	ClientIPXForwardedFor = "X-Forwarded-For"
	// ClientIPXRealIP takes the single address of X-Real-IP.
	ClientIPXRealIP = "X-Real-IP"
	// ClientIPForwarded walks the for= parameters of Forwarded (RFC 7239)
	// from the right, like X-Forwarded-For.
	ClientIPForwarded = "Forwarded"
	// ClientIPNone believes no header: the socket peer is the client.
	ClientIPNone = "none"
)

// ParseClientIPHeader returns the canonical spelling of a ClientIPHeader
// value, compared case-insensitively ("" is ClientIPXForwardedFor), or an
// error naming the accepted values.
func ParseClientIPHeader(s string) (string, error) {
	for _, v := range []string{ClientIPXForwardedFor, ClientIPXRealIP, ClientIPForwarded, ClientIPNone} {
		if strings.EqualFold(s, v) {
			return v, nil
		}
	}
	if s == "" {
		return ClientIPXForwardedFor, nil
	}
	return "", fmt.Errorf("client IP header must be X-Forwarded-For, X-Real-IP, Forwarded or none, got %q", clip(s))
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
// name, an unknown ClientIPHeader, a negative size, an invalid, zoned or
// IPv4-mapped trusted prefix (peers are compared unmapped and without zone,
// so "::ffff:10.0.0.0/104" would never match).
func (c IdentityConfig) Validate() error {
	if _, err := ParseClientIPHeader(c.ClientIPHeader); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	names := append(slices.Clone(c.KeyHeaders), c.UserHeader, c.TierHeader)
	for i, h := range names {
		if h == "" && i >= len(c.KeyHeaders) {
			continue
		}
		if !ValidHeaderName(h) {
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

// UnknownKeySubject is the one subject shared by every request whose API
// key is unknown (or malformed) and that has no user or address to be
// counted by: inventing keys never buys a bucket of its own. A KeyID is 32
// hex digits, so no registered key can have this subject.
const UnknownKeySubject = "key:unknown"

// maxKeyLen bounds an API key in bytes.
const maxKeyLen = 512

// IdentityError is a malformed or oversized user or tier header from a
// trusted gateway. The HTTP layer answers it with 400 naming Header. A bad
// API key or forwarding header is never an IdentityError (see Identify).
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
	// KeyInvalid is set when an API key was presented but was oversized or
	// malformed, and so was dropped (APIKey and KeyID stay ""). Resolve
	// counts such a request as one with an unknown key.
	KeyInvalid bool
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

// hasSubject reports whether Subject is not "", without formatting it.
func (id Identity) hasSubject() bool {
	return id.Raw != "" || id.KeyID != "" || id.User != "" || id.IP.IsValid()
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
	// Formatted in place: on the path of every check by address.
	var buf [64]byte
	if a.Is4() {
		return string(a.AppendTo(append(buf[:0], "ip:"...)))
	}
	p, _ := a.Prefix(64)
	if !p.IsValid() {
		return "ip6:" + p.String() // as String spells the invalid prefix
	}
	return string(p.AppendTo(append(buf[:0], "ip6:"...)))
}

// SubjectFields are the identity fields of a check API body: exactly one
// of APIKey, User, IP and Subject, or IP together with APIKey or User (the
// address an unknown key is then counted by).
type SubjectFields struct {
	APIKey  string `json:"api_key,omitempty"`
	User    string `json:"user,omitempty"`
	IP      string `json:"ip,omitempty"`
	Subject string `json:"subject,omitempty"`
}

// Identity validates the fields and returns the Identity they name, whose
// Subject equals that of Identify for the same key, user or address.
// Errors are *ValidationError naming the JSON field. An oversized or
// malformed api_key is not an error: like a bad key header it is dropped
// and marked KeyInvalid.
func (f SubjectFields) Identity() (Identity, error) {
	var id Identity
	ve := &ValidationError{}
	n := 0
	if f.APIKey != "" {
		n++
		if validKey(f.APIKey) == nil {
			id.APIKey, id.KeyID = f.APIKey, KeyID(f.APIKey)
		} else {
			id.KeyInvalid = true
		}
	}
	if f.User != "" {
		n++
		if err := validSubject(f.User); err != nil {
			ve.add("user", "%v", err)
		}
		id.User = f.User
	}
	if f.IP != "" {
		if f.APIKey == "" && f.User == "" {
			n++ // else it only accompanies them
		}
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
		ve.add("", "exactly one of api_key, user, ip, subject must be set (ip may accompany api_key or user), got %d", n)
	}
	if err := ve.err(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// Identify reads a request's identity (see IdentityConfig). It never
// panics. A request with no key, user or parsable peer address is
// ErrNoSubject; a malformed or oversized user or tier header from a trusted
// peer is an *IdentityError.
//
// The API key is the first well-formed one among KeyHeaders. A key header
// that is oversized or malformed (e.g. a 900-byte JWT, longer than any API
// key) is skipped and the Identity marked KeyInvalid: a bad key is no key,
// never an error, so a gateway never turns it into a 5xx.
//
// The client address is the socket peer (r.RemoteAddr) unless that peer is
// a trusted proxy. Then the one header ClientIPHeader names is read:
// X-Forwarded-For or Forwarded (RFC 7239, its for= parameters) is walked
// from the right, skipping trusted proxies, and the first untrusted address
// is the client; X-Real-IP must hold exactly one address. If the walk meets
// an entry that is not an address ("unknown", an obfuscated name, garbage),
// or X-Real-IP is missing, repeated or not an address, the last trusted hop
// is taken as the client, so that no client can choose its address. Headers
// from an untrusted peer are ignored.
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
			id.KeyInvalid = true
			continue
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
		if validKey(v) != nil {
			id.KeyInvalid = true
			continue
		}
		id.APIKey, id.KeyID, id.KeyInvalid = v, KeyID(v), false
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
		id.IP = clientAddr(r.Header, peer, cfg)
	} else {
		id.IP = peer
	}
	if !id.hasSubject() && !id.KeyInvalid {
		return Identity{}, ErrNoSubject
	}
	return id, nil
}

// ValidHeaderName reports whether h can name a header: an RFC 9110 token
// of at most 256 bytes.
func ValidHeaderName(h string) bool {
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

// clientAddr reads the client address from the one header cfg names; peer
// is trusted. It never fails: whatever it cannot read yields the last
// trusted hop.
func clientAddr(h http.Header, peer netip.Addr, cfg IdentityConfig) netip.Addr {
	name, err := ParseClientIPHeader(cfg.ClientIPHeader)
	if err != nil || name == ClientIPNone {
		return peer
	}
	vs := h.Values(name)
	if len(vs) == 0 {
		return peer
	}
	if name == ClientIPXRealIP {
		if len(vs) != 1 {
			return peer // a second line was not set by the trusted proxy
		}
		if a, ok := parseNode(strings.TrimSpace(vs[0])); ok {
			return a
		}
		return peer
	}
	return walkForwarded(strings.Join(vs, ", "), name == ClientIPForwarded, peer, cfg.TrustedProxies)
}

// walkForwarded walks the elements of an X-Forwarded-For or (forwarded)
// Forwarded value from the right, at most maxHops of them, and returns the
// first untrusted address, or the last trusted hop when it meets an entry
// that is not an address or runs out. It reads v once, so its cost is
// linear in len(v) whatever the number of elements.
func walkForwarded(v string, forwarded bool, peer netip.Addr, trusted []netip.Prefix) netip.Addr {
	client := peer
	end := len(v)
	cuts := topLevelCommas(v, forwarded)
	for hops := 0; hops < maxHops && end >= 0; hops++ {
		start := 0
		if len(cuts) > 0 {
			start = cuts[len(cuts)-1] + 1
			cuts = cuts[:len(cuts)-1]
		}
		elem := v[start:end]
		end = start - 1
		var a netip.Addr
		var ok bool
		if forwarded {
			a, ok = forwardedFor(elem)
		} else {
			a, ok = parseNode(strings.TrimSpace(elem))
		}
		if !ok {
			return client // the last trusted hop
		}
		client = a
		if !isTrusted(a, trusted) {
			return a
		}
	}
	return client
}

// topLevelCommas returns the offsets of the commas that separate elements:
// for Forwarded those outside quoted strings, for X-Forwarded-For (which
// has no quoting) all of them. Only the last maxHops are kept.
func topLevelCommas(s string, quoting bool) []int {
	var cuts []int
	inQuote := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if inQuote {
				i++
			}
		case '"':
			if quoting {
				inQuote = !inQuote
			}
		case ',':
			if !inQuote {
				if len(cuts) == maxHops {
					cuts = append(cuts[:0], cuts[1:]...)
				}
				cuts = append(cuts, i)
			}
		}
	}
	return cuts
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
	// registry nor a trusted gateway vouches for, or a malformed one. Such
	// a request is counted by user or address, not by key, so that
	// inventing keys does not multiply quota; with neither, by the one
	// shared UnknownKeySubject.
	UnknownKey bool
}

// Resolve decides the tier and subject of an identity: the trusted tier
// (id.Tier) if any, else the registered tier of its key, else
// TierAnonymous. A key that no tier vouches for (unregistered, or
// KeyInvalid) never gets a subject of its own: the request counts by its
// user, else its address, else UnknownKeySubject. An explicit subject
// (id.Raw) is kept as given. See "Tiers" in the package documentation.
func (r *Registry) Resolve(id Identity) Principal {
	p := Principal{Tier: id.Tier, Subject: id.Subject()}
	if p.Tier == "" {
		switch {
		case id.KeyID != "":
			if t, ok := r.KeyTier(id.KeyID); ok {
				p.Tier = t
			} else {
				p.UnknownKey = true
			}
		case id.KeyInvalid:
			p.UnknownKey = true
		}
	}
	if p.UnknownKey && id.Raw == "" {
		fallback := id
		fallback.KeyID, fallback.APIKey = "", ""
		p.Subject = fallback.Subject()
	}
	if p.Subject == "" && (p.UnknownKey || id.KeyInvalid) {
		p.Subject = UnknownKeySubject
	}
	if p.Tier == "" {
		p.Tier = TierAnonymous
	}
	return p
}
