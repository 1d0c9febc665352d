package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/quota"
)

// fixedAnswer answers every request with one status, content type and body.
type fixedAnswer struct {
	status int
	ct     string
	body   []byte
}

func (f fixedAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: f.status, Header: http.Header{"Content-Type": {f.ct}},
		Body: io.NopCloser(bytes.NewReader(f.body)), Request: r}, nil
}

// FuzzCheckAnswer: whatever a server answers, Check returns a decision or
// an error, never a panic; under FailOpen an answer that is not a decision
// admits, and an error is then only a problem for bad input.
func FuzzCheckAnswer(f *testing.F) {
	f.Add(200, "application/json", []byte(`{"allowed":true,"subject":"user:1","source":"store","policies":[]}`))
	f.Add(429, "application/problem+json", []byte(`{"type":"x","status":429,"allowed":false,"source":"store","violated-policies":["a"]}`))
	f.Add(400, "application/problem+json", []byte(`{"type":"x","status":400,"errors":[{"field":"route","reason":"r"}]}`))
	f.Add(503, "text/html", []byte(`<html>`))
	f.Add(502, "application/json", []byte(`{`))
	f.Fuzz(func(t *testing.T, status int, ct string, body []byte) {
		if status < 100 || status > 999 {
			return
		}
		c, err := client.New(client.Config{Server: "http://sluice.test", OnFailure: client.FailOpen,
			HTTPClient: &http.Client{Transport: fixedAnswer{status, ct, body}}})
		if err != nil {
			t.Fatal(err)
		}
		d, err := c.Check(context.Background(), client.CheckRequest{SubjectFields: quota.SubjectFields{User: "1"}, Route: "/"})
		var p *client.Problem
		switch {
		case err != nil && !errors.As(err, &p):
			t.Fatalf("Check of a %d answer: error %v is not a problem", status, err)
		case err != nil && (status >= 500 || status < 400):
			t.Fatalf("Check of a %d answer: problem %v, want a decision", status, err)
		case err == nil && d == nil:
			t.Fatal("Check returned neither decision nor error")
		}
	})
}
