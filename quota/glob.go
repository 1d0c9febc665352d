package quota

import (
	"fmt"
	"strings"
)

// maxGlobLen bounds a route glob in bytes.
const maxGlobLen = 512

// glob is a compiled route glob. It is immutable once compiled.
type glob struct {
	src  string
	segs []string // pattern segments, each possibly containing '*'
	rest bool     // further path segments are allowed after segs
}

// compileGlob validates and compiles a route glob.
func compileGlob(p string) (*glob, error) {
	if p == "" {
		return nil, fmt.Errorf("must not be empty")
	}
	if len(p) > maxGlobLen {
		return nil, fmt.Errorf("must be at most %d bytes, got %d", maxGlobLen, len(p))
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("must start with '/', got %q", p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c <= ' ' || c == 0x7f:
			return nil, fmt.Errorf("must not contain spaces or control characters (byte %d)", i)
		case strings.IndexByte("?[]{}\\#", c) >= 0:
			return nil, fmt.Errorf("unsupported character %q at byte %d (only '*' and a final \"**\" are wildcards)", c, i)
		}
	}
	g := &glob{src: p}
	if strings.Contains(p, "//") {
		return nil, fmt.Errorf("empty path segment in %q", p)
	}
	// Requests are matched in NormalizeRoute's form, so the pattern is
	// too: "/login/" matches what "/login" matches.
	segs := strings.Split(NormalizeRoute(p)[1:], "/")
	for i, s := range segs {
		last := i == len(segs)-1
		if s == "" && !last {
			return nil, fmt.Errorf("empty path segment in %q", p)
		}
		if strings.Contains(s, "**") {
			if s != "**" || !last {
				return nil, fmt.Errorf(`"**" is allowed only as the whole last segment, in %q`, p)
			}
			g.rest = true
			segs = segs[:i]
			break
		}
	}
	if !g.rest && strings.HasSuffix(p, "*") {
		g.rest = true
	}
	g.segs = segs
	return g, nil
}

// match reports whether path matches the glob. It does not allocate.
func (g *glob) match(path string) bool {
	if len(path) == 0 || path[0] != '/' {
		return false
	}
	rem := path[1:]
	for i, ps := range g.segs {
		var seg string
		j := strings.IndexByte(rem, '/')
		last := j < 0
		if last {
			seg, rem = rem, ""
		} else {
			seg, rem = rem[:j], rem[j+1:]
		}
		if !matchSegment(ps, seg) {
			return false
		}
		if last {
			// The path has no more segments: it matches only if the
			// pattern has none left either.
			return i == len(g.segs)-1
		}
	}
	if len(g.segs) == 0 {
		return g.rest // "/**"
	}
	// The path has segments left (possibly one empty one after a trailing
	// slash).
	return g.rest
}

// matchSegment matches one path segment against a pattern segment in which
// '*' matches any run of characters. Neither contains '/'. It is the classic
// greedy match with one backtrack point, linear in practice.
func matchSegment(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// mayOverlap reports whether some path could match both globs. It never
// answers false for globs that share a path; it may answer true for some
// that do not (it compares only literal prefixes and suffixes of segments).
func (g *glob) mayOverlap(h *glob) bool {
	n, m := len(g.segs), len(h.segs)
	switch {
	case n < m && !g.rest, m < n && !h.rest:
		return false
	}
	for i := 0; i < n && i < m; i++ {
		if !segmentsMayOverlap(g.segs[i], h.segs[i]) {
			return false
		}
	}
	return true
}

func segmentsMayOverlap(a, b string) bool {
	ai, bi := strings.IndexByte(a, '*'), strings.IndexByte(b, '*')
	if ai < 0 && bi < 0 {
		return a == b
	}
	// Literal prefixes before the first star must agree.
	ap, bp := a, b
	if ai >= 0 {
		ap = a[:ai]
	}
	if bi >= 0 {
		bp = b[:bi]
	}
	if !strings.HasPrefix(ap, bp) && !strings.HasPrefix(bp, ap) {
		return false
	}
	// Literal suffixes after the last star must agree.
	as, bs := a, b
	if ai >= 0 {
		as = a[strings.LastIndexByte(a, '*')+1:]
	}
	if bi >= 0 {
		bs = b[strings.LastIndexByte(b, '*')+1:]
	}
	return strings.HasSuffix(as, bs) || strings.HasSuffix(bs, as)
}
