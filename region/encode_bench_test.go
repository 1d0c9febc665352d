package region

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/sluice-rl/sluice/internal/strictjson"
)

// The hand-written JSON of the check path beside the libraries it stands
// in for: each benchmark runs the hand-written code (hand, fast) and
// encoding/json (and, for the request, strictjson, the decoder the fast
// path falls back to) on the same value, writing into a reused buffer as
// the server does. bench/summary.awk prints the ratios.

// BenchmarkJSONEncodeDecision is the body of an allowed check: one
// policy's figures.
func BenchmarkJSONEncodeDecision(b *testing.B) {
	d := encodingCases()[2]
	benchEncode(b, func(buf []byte) ([]byte, bool) { return appendDecision(buf, &d) }, d)
}

// BenchmarkJSONEncodeRejection is the body of a 429: the problem members
// and the decision's.
func BenchmarkJSONEncodeRejection(b *testing.B) {
	c := rejectionCases()[0]
	benchEncode(b, func(buf []byte) ([]byte, bool) { return appendRejection(buf, &c) }, c)
}

// BenchmarkJSONEncodeProblem is a problem document without field errors,
// as forward-auth's 403 is.
func BenchmarkJSONEncodeProblem(b *testing.B) {
	ms := int64(1500)
	p := Problem{Type: ProblemQuotaExceeded, Title: "Forbidden", Status: 403, Detail: `Policy "p" allows 1 requests per 1 s`,
		Instance: "/bench", ViolatedPolicies: []string{"p", "q"}, RetryAfterMS: &ms}
	benchEncode(b, func(buf []byte) ([]byte, bool) { return appendProblem(buf, &p) }, p)
}

func benchEncode(b *testing.B, hand func([]byte) ([]byte, bool), v any) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var ok bool
			if buf, ok = hand(buf[:0]); !ok {
				b.Fatal("the hand-written encoder declined")
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for b.Loop() {
			buf.Reset()
			if err := enc.Encode(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkJSONDecodeCheck is the body of POST /v1/check as a gateway
// sends it, decoded by the fast path, by strictjson and by encoding/json.
func BenchmarkJSONDecodeCheck(b *testing.B) {
	body := []byte(checkBodies[0])
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in CheckRequest
			if !decodeCheckFast(body, &in) {
				b.Fatal("the fast path declined")
			}
		}
	})
	b.Run("strictjson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in CheckRequest
			if e := strictjson.Decode(body, &in); e != nil {
				b.Fatal(e)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in CheckRequest
			if err := json.Unmarshal(body, &in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
