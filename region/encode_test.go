package region

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// encodingCases are Decisions the hand-written encoder must write exactly
// as encoding/json does, and some it must leave to encoding/json.
func encodingCases() []Decision {
	full := PolicyResult{ID: "pro-default", Version: 3, Mode: "enforce", Class: "abuse", Scope: "global", Allowed: true,
		Evaluated: true, Cost: 2, Limit: 1000, Remaining: -1, ResetMS: 999, RetryAfterMS: 1, Scale: 0.25, Override: "ov-1", Degraded: true}
	return []Decision{
		{},
		{Allowed: true, Subject: "user:u1", Tier: "anonymous", Source: "none", Policies: []PolicyResult{}},
		{Allowed: true, Subject: "user:u1", Tier: "anonymous", Policy: "bench", Mode: "enforce", Limit: 1000, Remaining: 999,
			ResetMS: 1, Source: "store", Policies: []PolicyResult{{ID: "bench", Version: 1, Mode: "enforce", Class: "abuse", Scope: "region", Allowed: true, Evaluated: true, Cost: 1, Limit: 1000, Remaining: 999, ResetMS: 1}}},
		{Allowed: false, Subject: "key:0123abcd", Tier: "pro", Policy: "p", Mode: "shadow", Limit: math.MaxInt64, Remaining: math.MinInt64,
			RetryAfterMS: 86400000, WouldReject: true, Degraded: true, Source: "fallback",
			Policies: []PolicyResult{full, {ID: "s", WouldReject: true, Scale: 1e-7}, {ID: "big", Scale: 1e21}, {ID: "third", Scale: 1.0 / 3}}},
		// Left to encoding/json:
		{Subject: "user:<script>", Policies: []PolicyResult{}},
		{Subject: "user:\"q\"", Tier: "a\\b"},
		{Subject: "ip:é"},
		{Subject: "x", Policies: []PolicyResult{{ID: "line\nbreak"}}},
		{Subject: "x", Policies: []PolicyResult{{ID: "p", Override: "a&b"}}},
		{Subject: "x", Exempt: []ExemptResult{{ID: "p", Override: "o", ExpiresAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}},
	}
}

func TestAppendDecisionIsEncodingJSON(t *testing.T) {
	for i, d := range encodingCases() {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			want, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := appendDecision([]byte("prefix"), &d)
			if !ok {
				if string(got) != "prefix" {
					t.Fatalf("appendDecision declined but changed the buffer to %s", got)
				}
				return
			}
			if string(got) != "prefix"+string(want) {
				t.Fatalf("appendDecision =\n%s\nwant\n%s", got[len("prefix"):], want)
			}
		})
	}
}

func TestAppendDecisionTakesTheCommonCase(t *testing.T) {
	// The encoder must not decline what every check answers, or the
	// speed-up silently disappears.
	d := encodingCases()[2]
	if _, ok := appendDecision(nil, &d); !ok {
		t.Fatal("appendDecision declined an ordinary allowed check")
	}
}

func TestAppendDecisionDeclinesNonFiniteScale(t *testing.T) {
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		d := Decision{Policies: []PolicyResult{{ID: "p", Scale: f}}}
		if got, ok := appendDecision(nil, &d); ok {
			t.Errorf("scale %v: appendDecision = %s, want declined (no JSON form)", f, got)
		}
	}
}

func FuzzAppendDecision(f *testing.F) {
	f.Add("user:u1", "anonymous", "bench", "store", int64(1000), int64(999), 0.5, true)
	f.Add("<&>", "\u2028", "\x00", "é", int64(-1), int64(math.MaxInt64), 1e-9, false)
	f.Fuzz(func(t *testing.T, subject, tier, policy, source string, limit, remaining int64, scale float64, allowed bool) {
		d := Decision{Allowed: allowed, Subject: subject, Tier: tier, Policy: policy, Mode: policy, Limit: limit, Remaining: remaining,
			Source: source, Policies: []PolicyResult{{ID: policy, Mode: source, Scale: scale, Limit: limit, Override: tier, WouldReject: allowed}}}
		got, ok := appendDecision(nil, &d)
		want, err := json.Marshal(d)
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("appendDecision wrote %s where encoding/json fails: %v", got, err)
		}
		if string(got) != string(want) {
			t.Fatalf("appendDecision =\n%s\nwant\n%s", got, want)
		}
	})
}

// TestBodiesCarryContentLength checks what writeBody relies on: below the
// chunking threshold net/http sets Content-Length itself; above it we do.
func TestBodiesCarryContentLength(t *testing.T) {
	for _, size := range []int{10, chunkingThreshold - 2, chunkingThreshold - 1, chunkingThreshold, 10 * chunkingThreshold} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, strings.Repeat("x", size-3)) // "…"\n
		}))
		res, err := srv.Client().Get(srv.URL)
		if err != nil {
			srv.Close()
			t.Fatal(err)
		}
		res.Body.Close()
		srv.Close()
		if res.ContentLength != int64(size) || len(res.TransferEncoding) != 0 {
			t.Errorf("body of %d bytes: Content-Length %d, Transfer-Encoding %v, want %d and none", size, res.ContentLength, res.TransferEncoding, size)
		}
	}
}

func TestWriteDecisionIsWriteJSON(t *testing.T) {
	for i, d := range encodingCases() {
		viaJSON, viaDecision := httptest.NewRecorder(), httptest.NewRecorder()
		writeJSON(viaJSON, http.StatusOK, d)
		writeDecision(viaDecision, http.StatusOK, &d)
		want, _ := json.Marshal(d)
		for name, rec := range map[string]*httptest.ResponseRecorder{"writeJSON": viaJSON, "writeDecision": viaDecision} {
			if got := rec.Body.String(); got != string(want)+"\n" || rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("case %d: %s wrote %q (%s), want %s and a newline as application/json", i, name, got, rec.Header().Get("Content-Type"), want)
			}
		}
	}
}
