package region

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-rl/sluice/internal/strictjson"
	"github.com/sluice-rl/sluice/quota"
)

// The header keys the hot paths look up directly must be what
// Header.Values would look up.
func TestHeaderKeysCanonical(t *testing.T) {
	for _, p := range []authzHeaders{forwardAuthHeaders(ForwardAuthOriginal), forwardAuthHeaders(ForwardAuthForwarded)} {
		for _, k := range [][2]string{{p.method, p.methodKey}, {p.uri, p.uriKey}} {
			if got := http.CanonicalHeaderKey(k[0]); got != k[1] {
				t.Errorf("key of %s = %s, want %s", k[0], k[1], got)
			}
		}
	}
	for _, keys := range [][]string{nil, {"x-api-key", "Authorization"}} {
		cfg := DefaultConfig()
		cfg.KeyHeaders = keys
		for _, k := range cfg.identityConfig().KeyHeaders {
			if got := http.CanonicalHeaderKey(k); got != k {
				t.Errorf("identityConfig().KeyHeaders holds %s, want %s", k, got)
			}
		}
	}
	cfg := DefaultConfig()
	cfg.KeyHeaders = []string{}
	if got := cfg.identityConfig().KeyHeaders; got == nil || len(got) != 0 {
		t.Errorf("identityConfig().KeyHeaders = %#v for no key headers, want empty, not nil", got)
	}
}

// checkBodies are bodies for decodeCheck: what the fast path takes, and
// what it must leave to strictjson.
var checkBodies = []string{
	`{"user":"u","route":"/bench","method":"GET"}`,
	` { "api_key" : "k" , "route":"/a", "cost": 3, "tier":"pro", "method":"post", "ip":"::1" } ` + "\n",
	`{"subject":"s","route":"/","cost":-0}`,
	`{"cost":0,"route":"/"}`,
	`{}`, ` {	}`,
	`{"user":"u","user":"v","route":"/"}`, // duplicate: last wins
	`{"USER":"u","route":"/"}`,            // case-insensitive match
	`{"user":"\u0075","route":"/"}`,       // escape
	`{"user":"ü","route":"/"}`,            // non-ASCII
	`{"user":null,"route":"/"}`,           // null
	`{"cost":1.0,"route":"/"}`,            // not an integer
	`{"cost":1e2}`, `{"cost":01}`, `{"cost":-}`, `{"cost":"1"}`,
	`{"cost":123456789012345678}`, `{"cost":1234567890123456789}`, `{"cost":99999999999999999999}`,
	`{"route":"/"} {}`, `{"route":"/"}x`, `{"route":"/",}`, `{"route" "/"}`, `{"route":"/"`,
	`{"other":1}`, `[]`, ``, ` `, `null`, "\ufeff{}", `{"route":"/a` + "\x01" + `"}`,
}

func TestDecodeCheckMatchesStrict(t *testing.T) {
	for _, body := range checkBodies {
		compareCheckDecoders(t, []byte(body))
	}
	// The fast path takes the benchmark's body.
	var in CheckRequest
	if !decodeCheckFast([]byte(checkBodies[0]), &in) {
		t.Errorf("decodeCheckFast(%s) = false, want true", checkBodies[0])
	}
}

// FuzzDecodeCheck compares decodeCheck with strictjson: the same value or
// the same problem for every body.
func FuzzDecodeCheck(f *testing.F) {
	for _, b := range checkBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(compareCheckDecoders)
}

func compareCheckDecoders(t *testing.T, body []byte) {
	t.Helper()
	var got, want CheckRequest
	gp := decodeCheck(body, &got)
	var wp *Problem
	if e := strictjson.Decode(body, &want); e != nil {
		wp = invalid(e.Field, "%s", e.Reason)
	}
	if !reflect.DeepEqual(gp, wp) {
		t.Fatalf("decodeCheck(%q) problem = %+v, want %+v", body, gp, wp)
	}
	if wp == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeCheck(%q) = %+v, want %+v", body, got, want)
	}
}

func TestReadBody(t *testing.T) {
	const limit = 3000
	tests := []struct {
		name   string
		size   int
		length int64 // Content-Length; -1 unknown
		status int   // of the problem; 0 none
	}{
		{"empty", 0, 0, 0},
		{"known length", 100, 100, 0},
		{"unknown length, several reads", 2999, -1, 0},
		{"exactly the limit", limit, limit, 0},
		{"one byte over", limit + 1, limit + 1, http.StatusRequestEntityTooLarge},
		{"over with unknown length", 5000, -1, http.StatusRequestEntityTooLarge},
		{"longer than its Content-Length says", limit + 1, 10, http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := bytes.Repeat([]byte("x"), tt.size)
			r := httptest.NewRequest("POST", "/v1/check", iotest.OneByteReader(bytes.NewReader(body)))
			if tt.size > 0 {
				r.Body = io.NopCloser(iotest.HalfReader(bytes.NewReader(body)))
			}
			r.ContentLength = tt.length
			bp, p := readBody(httptest.NewRecorder(), r, limit)
			switch {
			case tt.status != 0 && (p == nil || p.Status != tt.status):
				t.Fatalf("readBody = %v, want status %d", p, tt.status)
			case tt.status == 0 && p != nil:
				t.Fatalf("readBody = %v, want the body", p)
			case tt.status == 0 && !bytes.Equal(*bp, body):
				t.Fatalf("readBody = %d bytes, want %d", len(*bp), len(body))
			}
		})
	}
}

// A body over the limit closes the connection after the 413, as
// http.MaxBytesReader has the server do.
func TestBodyTooLargeClosesConnection(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 1024
	d, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	url := serveData(t, d)
	body := `{"user":"u","route":"/` + strings.Repeat("a", 1100) + `"}`
	resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Errorf("POST of %d bytes = %d, close %v; want 413, close true", len(body), resp.StatusCode, resp.Close)
	}
}

// Each check counts in sluice_checks_total under its decision and source,
// through the resolved series as through the vector.
func TestCheckSeries(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c"}, []string{"decision", "source"})
	var cs checkSeries
	for range 2 {
		cs.counter(vec, 0, "store").Inc()
		cs.counter(vec, 1, "deny_cache").Inc()
		cs.counter(vec, 2, "odd").Inc()
	}
	for _, l := range [][2]string{{"allowed", "store"}, {"rejected", "deny_cache"}, {"unavailable", "odd"}} {
		var m dto.Metric
		if err := vec.WithLabelValues(l[0], l[1]).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != 2 {
			t.Errorf("checks{%s,%s} = %v, want 2", l[0], l[1], got)
		}
	}
	ch := make(chan prometheus.Metric, 10)
	vec.Collect(ch)
	if n := len(ch); n != 3 {
		t.Errorf("%d series, want 3", n)
	}
}

// rejectionCases are 429/503 bodies appendRejection must write exactly as
// encoding/json does, or leave to it.
func rejectionCases() []checkRejection {
	d := encodingCases()[2]
	d.Allowed = false
	return []checkRejection{
		{Type: ProblemQuotaExceeded, Title: "Too Many Requests", Status: 429, Detail: `Policy "bench" allows 1 requests per 1 s for this client; retry in 1 s.`,
			Instance: "/v1/check", ViolatedPolicies: []string{"bench", "daily"}, Decision: d},
		{Type: ProblemAbnormalUsage, Title: "Too Many Requests", Status: 429, Detail: `back\slash`, Decision: d},
		{Type: ProblemReducedCapacity, Title: "Service Unavailable", Status: 503, ViolatedPolicies: []string{}, Decision: Decision{}},
		// Left to encoding/json:
		{Detail: "a<b", Decision: d},
		{Instance: "/é", Decision: d},
		{ViolatedPolicies: []string{"x\ny"}, Decision: d},
		{Decision: encodingCases()[len(encodingCases())-1]},
	}
}

func TestAppendRejectionIsEncodingJSON(t *testing.T) {
	for i, c := range rejectionCases() {
		compareRejection(t, c, i < 3)
	}
}

func FuzzAppendRejection(f *testing.F) {
	f.Add("Too Many Requests", `Policy "p" allows`, "/v1/check", "p", "user:u")
	f.Add("<&>", "\u2028", "\x00", "é", `\"`)
	f.Fuzz(func(t *testing.T, title, detail, instance, policy, subject string) {
		d := encodingCases()[2]
		d.Subject = subject
		c := checkRejection{Type: ProblemQuotaExceeded, Title: title, Status: 429, Detail: detail, Instance: instance,
			ViolatedPolicies: []string{policy, policy}, Decision: d}
		compareRejection(t, c, false)
	})
}

func compareRejection(t *testing.T, c checkRejection, mustTake bool) {
	t.Helper()
	want, err := json.Marshal(c)
	got, ok := appendRejection([]byte("prefix"), &c)
	switch {
	case !ok && string(got) != "prefix":
		t.Fatalf("appendRejection declined but changed the buffer to %s", got)
	case !ok && mustTake:
		t.Fatalf("appendRejection declined %+v", c)
	case ok && err != nil:
		t.Fatalf("appendRejection wrote %s where encoding/json fails: %v", got, err)
	case ok && string(got) != "prefix"+string(want):
		t.Fatalf("appendRejection =\n%s\nwant\n%s", got[len("prefix"):], want)
	}
}

func TestAppendProblemIsEncodingJSON(t *testing.T) {
	ms := int64(1500)
	for i, p := range []Problem{
		{Type: ProblemQuotaExceeded, Title: "Forbidden", Status: 403, Detail: `Policy "p" allows 1 requests per 1 s`, Instance: "/bench",
			ViolatedPolicies: []string{"p", "q"}, RetryAfterMS: &ms},
		{Type: ProblemNotFound, Title: "Not Found", Status: 404, Detail: "no such route: /x"},
		{Type: ProblemMethod, Status: 405, ViolatedPolicies: []string{}},
		{},
		// Left to encoding/json:
		{Type: ProblemInvalid, Title: "Bad Request", Status: 400, Errors: []quota.FieldError{{Field: "f", Reason: "r"}}},
		{Detail: "<script>"},
	} {
		compareProblem(t, p, i < 4)
	}
}

func FuzzAppendProblem(f *testing.F) {
	f.Add("Too Many Requests", `Policy "p" allows`, "/v1/check", "p", int64(1))
	f.Add("<&>", "\u2028", "\x00", "é", int64(-1))
	f.Fuzz(func(t *testing.T, title, detail, instance, policy string, ms int64) {
		compareProblem(t, Problem{Type: ProblemQuotaExceeded, Title: title, Status: 429, Detail: detail, Instance: instance,
			ViolatedPolicies: []string{policy}, RetryAfterMS: &ms}, false)
	})
}

func compareProblem(t *testing.T, p Problem, mustTake bool) {
	t.Helper()
	want, err := json.Marshal(p)
	got, ok := appendProblem([]byte("prefix"), &p)
	switch {
	case !ok && string(got) != "prefix":
		t.Fatalf("appendProblem declined but changed the buffer to %s", got)
	case !ok && mustTake:
		t.Fatalf("appendProblem declined %+v", p)
	case ok && err != nil:
		t.Fatalf("appendProblem wrote %s where encoding/json fails: %v", got, err)
	case ok && string(got) != "prefix"+string(want):
		t.Fatalf("appendProblem =\n%s\nwant\n%s", got[len("prefix"):], want)
	}
}
