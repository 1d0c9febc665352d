package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/httplimit"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/client/local"
	"github.com/sluice-rl/sluice/quota"
)

// byAPIKey limits by the X-API-Key header, and by address without one.
func byAPIKey(r *http.Request) (quota.SubjectFields, error) {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return quota.SubjectFields{APIKey: k}, nil
	}
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	return quota.SubjectFields{IP: host}, nil
}

// show sends three requests and prints each answer's status and fields.
func show(h http.Handler) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/orders", nil)
		req.Header.Set("X-API-Key", "sk_test_1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, res.Header.Get("RateLimit"), res.Header.Get("Content-Type"))
	}
}

var helloHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "hello\n")
})

// Limiting through a daemon: the client's failure mode says what happens
// when the daemon cannot be asked.
func ExampleNew_daemon() {
	server, stop := daemontest.Start([]quota.Policy{daemontest.Policy("burst", 0.01, 2)})
	defer stop()
	c, err := client.New(client.Config{Server: server, OnFailure: client.FailOpen})
	if err != nil {
		fmt.Println(err)
		return
	}
	limit, err := httplimit.New(httplimit.Config{Checker: c, Subject: byAPIKey})
	if err != nil {
		fmt.Println(err)
		return
	}
	show(limit(helloHandler))
	// Output:
	// 200 "burst";r=1;t=100 text/plain
	// 200 "burst";r=0;t=200 text/plain
	// 429 "burst";r=0;t=100 application/problem+json
}

// Limiting in-process: an limiter.Limiter (nil: the memory store) and a
// quota.Registry of policies, no daemon.
func ExampleNew_inProcess() {
	reg := quota.NewRegistry(quota.RegistryConfig{})
	if err := reg.Seed(context.Background(), "example", []quota.Policy{daemontest.Policy("burst", 0.01, 2)}); err != nil {
		fmt.Println(err)
		return
	}
	limit, err := httplimit.New(httplimit.Config{Checker: local.New(nil, reg), Subject: byAPIKey})
	if err != nil {
		fmt.Println(err)
		return
	}
	show(limit(helloHandler))
	// Output:
	// 200 "burst";r=1;t=100 text/plain
	// 200 "burst";r=0;t=200 text/plain
	// 429 "burst";r=0;t=100 application/problem+json
}
