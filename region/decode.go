package region

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/sluice-rl/sluice/internal/strictjson"
)

// bodyBufs holds the buffers request bodies are read into: every decoder
// copies what it keeps (encoding/json does, and decodeCheck converts the
// body to a string of its own), so a buffer goes back as soon as the body
// is decoded.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledBody is the largest buffer put back into bodyBufs: a rare large
// body must not pin its buffer.
const maxPooledBody = 64 << 10

// readBody reads r's body into a buffer from bodyBufs, at most limit bytes;
// a longer body is a 413 problem, and the server is told so (through
// http.MaxBytesReader) that it closes the connection. The caller returns
// the buffer with putBody.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) (*[]byte, *Problem) {
	limit = max(limit, 0)
	bp := bodyBufs.Get().(*[]byte)
	b := (*bp)[:0]
	if n := r.ContentLength; n > 0 && n <= limit && int(n) >= cap(b) {
		b = make([]byte, 0, n+1) // +1: room to see the end of the body
	}
	if r.Body != nil {
		for {
			if len(b) == cap(b) {
				b = append(b, 0)[:len(b)]
			}
			n, err := r.Body.Read(b[len(b):cap(b)])
			b = b[:len(b)+n]
			if int64(len(b)) > limit {
				*bp = b
				putBody(bp)
				return nil, tooLarge(w, b, r.Body, limit)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				*bp = b
				putBody(bp)
				return nil, invalid("", "reading the body: %v", err)
			}
		}
	}
	*bp = b
	return bp, nil
}

// tooLarge is the problem of a body longer than limit, of which read has
// been read: it replays the body through http.MaxBytesReader, which tells
// the server to close the connection after the answer.
func tooLarge(w http.ResponseWriter, read []byte, rest io.ReadCloser, limit int64) *Problem {
	body := struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(read), rest), rest}
	_, err := io.ReadAll(http.MaxBytesReader(w, body, limit))
	var mbe *http.MaxBytesError
	if err != nil && !errors.As(err, &mbe) {
		return invalid("", "reading the body: %v", err)
	}
	return tooLargeProblem(limit)
}

// tooLargeProblem is the 413 problem of a body longer than limit bytes.
func tooLargeProblem(limit int64) *Problem {
	return newProblem(http.StatusRequestEntityTooLarge, ProblemTooLarge, fmt.Sprintf("the body must be at most %d bytes", limit))
}

// putBody returns a buffer from readBody.
func putBody(bp *[]byte) {
	if cap(*bp) > maxPooledBody {
		return
	}
	*bp = (*bp)[:0]
	bodyBufs.Put(bp)
}

// decodeCheck decodes a CheckRequest exactly as decodeBytes does. The
// common body — one object of distinct, exactly spelled members with plain
// ASCII strings and a small integer cost — is parsed by hand, the fields
// sharing one string; anything else (escapes, other case, duplicates,
// null, a malformed document) goes to strictjson, which describes what is
// wrong. A test and a fuzz target compare the two.
func decodeCheck(body []byte, in *CheckRequest) *Problem {
	if decodeCheckFast(body, in) {
		return nil
	}
	*in = CheckRequest{}
	return decodeCheckStrict(body, in)
}

// decodeCheckStrict is decodeCheck's slow path, apart so that only it puts
// a CheckRequest on the heap.
func decodeCheckStrict(body []byte, in *CheckRequest) *Problem {
	var tmp CheckRequest
	if e := strictjson.Decode(body, &tmp); e != nil {
		return invalid(e.Field, "%s", e.Reason)
	}
	*in = tmp
	return nil
}

// decodeCheckFast parses body into the zero *in and reports whether it
// could; when it could not, *in is partly filled.
func decodeCheckFast(body []byte, in *CheckRequest) bool {
	// Cheap checks first, so that a body the fast path will refuse is
	// not copied.
	if len(body) == 0 || bytes.IndexByte(body, '\\') >= 0 {
		return false
	}
	s := string(body)
	i := skipJSONSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return false
	}
	i = skipJSONSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipJSONSpace(s, i+1) == len(s)
	}
	var seen uint8
	for {
		key, j, ok := plainJSONString(s, i)
		if !ok {
			return false
		}
		i = skipJSONSpace(s, j)
		if i == len(s) || s[i] != ':' {
			return false
		}
		i = skipJSONSpace(s, i+1)
		var dst *string
		var bit uint8
		switch key {
		case "api_key":
			dst, bit = &in.APIKey, 1<<0
		case "user":
			dst, bit = &in.User, 1<<1
		case "ip":
			dst, bit = &in.IP, 1<<2
		case "subject":
			dst, bit = &in.Subject, 1<<3
		case "tier":
			dst, bit = &in.Tier, 1<<4
		case "method":
			dst, bit = &in.Method, 1<<5
		case "route":
			dst, bit = &in.Route, 1<<6
		case "cost":
			bit = 1 << 7
		}
		if bit == 0 || seen&bit != 0 {
			return false
		}
		seen |= bit
		if dst != nil {
			if *dst, i, ok = plainJSONString(s, i); !ok {
				return false
			}
		} else {
			var n int64
			if n, i, ok = smallJSONInt(s, i); !ok {
				return false
			}
			in.Cost = &n
		}
		i = skipJSONSpace(s, i)
		if i == len(s) {
			return false
		}
		switch s[i] {
		case ',':
			i = skipJSONSpace(s, i+1)
			continue
		case '}':
			return skipJSONSpace(s, i+1) == len(s)
		}
		return false
	}
}

func skipJSONSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// plainJSONString reads the string at s[i]: printable ASCII without
// escapes only.
func plainJSONString(s string, i int) (string, int, bool) {
	if i == len(s) || s[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			return s[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", i, false
		}
	}
	return "", i, false
}

// smallJSONInt reads the JSON integer at s[i], of at most 18 digits (it
// cannot overflow an int64).
func smallJSONInt(s string, i int) (int64, int, bool) {
	neg := i < len(s) && s[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		n = n*10 + int64(s[i]-'0')
		i++
	}
	switch d := i - start; {
	case d == 0 || d > 18 || (d > 1 && s[start] == '0'):
		return 0, i, false
	case i < len(s) && (s[i] == '.' || s[i] == 'e' || s[i] == 'E'):
		return 0, i, false
	}
	if neg {
		n = -n
	}
	return n, i, true
}
