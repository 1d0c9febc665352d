package main

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// TestCaddyWithoutForwardAuthHeadersFlag runs the shipped Caddyfile
// through a real caddy in front of a daemon started with the command its
// comments prescribe but without --forward-auth-headers forwarded, so the
// daemon expects X-Original-* and Caddy sends X-Forwarded-*. That is the
// operator's error, not the client's: a plain GET reaches the API, the
// call is counted in sluice_forward_auth_misconfigured_total and the log
// names the flag to set; POST /login, whose built-in policy is security
// class and fails closed, is still refused with 503.
func TestCaddyWithoutForwardAuthHeadersFlag(t *testing.T) {
	const name = "../../deploy/caddy/Caddyfile"
	raw, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	shipped := string(raw)
	bin := buildSluice(t)
	api := startAttackBackend(t)
	daemonAddr, gwAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)
	_, port, _ := net.SplitHostPort(gwAddr)
	conf := shipped
	for _, p := range [][2]string{{"127.0.0.1:8080", daemonAddr}, {"\n:80 {", "\n:" + port + " {"}, {"http://backend", api.url}} {
		if !strings.Contains(conf, p[0]) {
			t.Fatalf("%s lacks the placeholder %q", name, p[0])
		}
		conf = strings.ReplaceAll(conf, p[0], p[1])
	}
	flags := prescribedFlags(t, name, shipped, daemonAddr)
	if flagValue(flags, "--forward-auth-headers") != "forwarded" {
		t.Fatalf("%s no longer prescribes --forward-auth-headers forwarded: %v", name, flags)
	}
	flags = withoutFlag(flags, "--forward-auth-headers")
	t.Logf("sluice serve %s", strings.Join(flags, " "))
	d := startDaemon(t, bin, flags...)
	startCaddy(t, conf, gwAddr)
	c := (&attackClients{gw: gwAddr, next: 10}).new(t)

	for i := range 3 {
		if r := c.send("GET", "/orders", ""); r.status != 200 || !strings.HasPrefix(r.body, "GET /orders") {
			t.Fatalf("plain GET /orders %d through caddy = %d %q, want the API's 200", i+1, r.status, r.body)
		}
	}
	if got := api.served("/orders"); got != 3 {
		t.Errorf("the API served %d of 3 GET /orders, want 3", got)
	}
	if n, ok := d.scrape("sluice_forward_auth_misconfigured_total"); !ok || n != 3 {
		t.Errorf("sluice_forward_auth_misconfigured_total = %v (exported %v), want 3", n, ok)
	}
	testwait.For(t, 5*time.Second, "the log to name the flag to set", func() bool {
		return strings.Contains(d.log(), "set --forward-auth-headers forwarded")
	})

	r := c.send("POST", "/login", "user=alice&password=guess")
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Errorf("POST /login through caddy = %d %v %q, want 503 with Retry-After: the login policy fails closed", r.status, r.header, r.body)
	}
	if got := api.served("/login"); got != 0 {
		t.Errorf("the API served %d POST /login, want none", got)
	}
}
