package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/url"
	"testing"

	"github.com/sluice-rl/sluice/bench/internal/latency"
)

func TestBuildRequestsRotateUsers(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:9/v1/check?x={user}")
	cfg := config{target: u, method: "POST", body: `{"user":"{user}"}`, headers: []string{"X-Key: k-{user}"}, Flags: latency.Flags{Users: 3}}
	reqs, err := buildRequests(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 {
		t.Fatalf("len = %d, want 3", len(reqs))
	}
	for i, user := range []string{"u0", "u1", "u2"} {
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(reqs[i])))
		if err != nil {
			t.Fatalf("request %d does not parse: %v\n%s", i, err, reqs[i])
		}
		body, _ := io.ReadAll(r.Body)
		if r.Method != "POST" || r.URL.RequestURI() != "/v1/check?x="+user || r.Host != "127.0.0.1:9" ||
			r.Header.Get("X-Key") != "k-"+user || r.Header.Get("Content-Type") != "application/json" ||
			string(body) != `{"user":"`+user+`"}` {
			t.Errorf("request %d = %s %s host %s X-Key %q body %s, want user %s", i, r.Method, r.URL, r.Host, r.Header.Get("X-Key"), body, user)
		}
	}
}

func TestBuildRequestsRejectsBadHeader(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:9/")
	if _, err := buildRequests(config{target: u, method: "GET", headers: []string{"no colon"}, Flags: latency.Flags{Users: 1}}); err == nil {
		t.Fatal("a header without a colon was accepted")
	}
}
