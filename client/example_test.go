package client_test

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/client/internal/daemontest"
	"github.com/sluice-rl/sluice/quota"
)

func ExampleClient_Check() {
	// A daemon enforcing 2 requests, refilled at one per 100 s.
	server, stop := daemontest.Start([]quota.Policy{daemontest.Policy("burst", 0.01, 2)})
	defer stop()

	c, err := client.New(client.Config{Server: server, OnFailure: client.FailOpen})
	if err != nil {
		fmt.Println(err)
		return
	}
	req := client.CheckRequest{SubjectFields: quota.SubjectFields{User: "42"}, Method: "GET", Route: "/v1/orders"}
	for range 3 {
		d, err := c.Check(context.Background(), req)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Status, d.Allowed, d.Remaining, d.Header.Get("RateLimit"), "retry:"+d.Header.Get("Retry-After"))
	}
	// Output:
	// 200 true 1 "burst";r=1;t=100 retry:
	// 200 true 0 "burst";r=0;t=200 retry:
	// 429 false 0 "burst";r=0;t=100 retry:100
}

func ExampleFailOpen() {
	// Nothing listens on port 1: the daemon cannot be asked.
	c, err := client.New(client.Config{Server: "http://127.0.0.1:1", OnFailure: client.FailOpen})
	if err != nil {
		fmt.Println(err)
		return
	}
	d, err := c.Check(context.Background(), client.CheckRequest{SubjectFields: quota.SubjectFields{IP: "192.0.2.7"}, Route: "/"})
	fmt.Println(d.Allowed, d.Fallback, err)
	// Output: true true <nil>
}
