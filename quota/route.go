package quota

import "strings"

// NormalizeRoute returns the one canonical form of a request path that
// policies are matched against, so that every spelling a server would
// serve as the same resource is limited as that resource:
//
//   - the query ("?…") and fragment ("#…") are dropped;
//   - percent-escapes of unreserved characters (RFC 3986 §2.3: letters,
//     digits, "-", ".", "_", "~") are decoded, and so is "%2F": "/a%2Fb"
//     is matched as "/a/b", the reading that limits the most;
//   - every other escape is kept with upper-case hex digits ("%3f" is
//     "%3F"); a "%" that starts no valid escape becomes "%25", and a byte
//     that may not appear raw in a path (space, quote, backslash, non-ASCII,
//     control) is percent-encoded, so that raw and encoded spellings agree;
//   - "." and ".." segments are resolved (RFC 3986 §5.2.4); ".." above the
//     root stays at the root, as browsers and servers do ("/../login" is
//     "/login");
//   - repeated slashes are merged and a trailing slash is dropped: "/login/"
//     and "//login" are "/login".
//
// The result always starts with "/", and NormalizeRoute(NormalizeRoute(x))
// equals NormalizeRoute(x). Letter case is kept: "/Login" is not "/login".
// A path that is already canonical is returned without allocating.
func NormalizeRoute(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if isCanonicalRoute(raw) {
		return raw
	}
	return normalizePath(raw)
}

// normalizePath is NormalizeRoute for a path without query or fragment,
// without the fast path.
func normalizePath(raw string) string {
	// Pass 1: escapes and raw bytes.
	var b strings.Builder
	b.Grow(len(raw) + 1)
	b.WriteByte('/')
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%' && i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]):
			v := unhex(raw[i+1])<<4 | unhex(raw[i+2])
			if isUnreserved(v) || v == '/' {
				b.WriteByte(v)
			} else {
				writeEscape(&b, v)
			}
			i += 2
		case c == '/' || (c != '%' && isPathChar(c)):
			b.WriteByte(c)
		default:
			writeEscape(&b, c)
		}
	}
	// Pass 2: segments.
	segs := make([]string, 0, 8)
	for seg := range strings.SplitSeq(b.String(), "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
		default:
			segs = append(segs, seg)
		}
	}
	return "/" + strings.Join(segs, "/")
}

// isCanonicalRoute reports whether NormalizeRoute would return p unchanged.
func isCanonicalRoute(p string) bool {
	if p == "/" {
		return true
	}
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' {
		return false
	}
	segStart := 1
	for i := 1; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			switch p[segStart:i] {
			case "", ".", "..":
				return false
			}
			segStart = i + 1
			continue
		}
		c := p[i]
		if c == '%' {
			if i+2 >= len(p) || !isUpperHex(p[i+1]) || !isUpperHex(p[i+2]) {
				return false
			}
			if v := unhex(p[i+1])<<4 | unhex(p[i+2]); isUnreserved(v) || v == '/' {
				return false
			}
			i += 2
			continue
		}
		if !isPathChar(c) {
			return false
		}
	}
	return true
}

// isUnreserved reports RFC 3986 §2.3 unreserved characters.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// isPathChar reports the bytes other than "/" and "%" that a path segment
// may hold raw (RFC 3986 pchar: unreserved, sub-delims, ":" and "@").
func isPathChar(c byte) bool {
	return isUnreserved(c) || strings.IndexByte("!$&'()*+,;=:@", c) >= 0
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func writeEscape(b *strings.Builder, c byte) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('%')
	b.WriteByte(hex[c>>4])
	b.WriteByte(hex[c&15])
}
