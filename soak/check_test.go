package soak

import (
	"fmt"
	"testing"
	"time"
)

// t0 is the start of a 10 s window (windows are aligned to the epoch).
var t0 = time.Unix(1_800_000_000, 0)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

var testBounds = Bounds{DaemonsPerRegion: 2, ReportDelay: 2 * time.Second, Settle: 6 * time.Second,
	PolicySlack: 5 * time.Second, Latency: time.Second, DegradedHealthy: 0.05}

func policy(id string, limit float64, global bool, mode string) PolicyState {
	return PolicyState{At: t0.Add(-time.Hour), ID: id, Limit: limit, Window: 10, Global: global, OnStoreFailure: mode, Enforced: true}
}

// admitted returns n admitted requests of subject s under policy id in
// region, one every 100 ms from start (seconds after t0).
func admitted(n int, region, id, s string, start float64) []Request {
	var out []Request
	for i := 0; i < n; i++ {
		b := start + float64(i)*0.1
		out = append(out, Request{Start: at(b), End: at(b + 0.01), Region: region, Via: "check",
			Policy: id, Subject: s, Status: 200, Decided: true})
	}
	return out
}

// degraded marks n of rs degraded, as answers the fallback decided.
func degraded(rs []Request, n int) []Request {
	for i := range n {
		rs[i].Degraded = true
	}
	return rs
}

// viaNginx makes rs requests through nginx, viaRLS through the gRPC API.
func viaNginx(rs []Request) []Request { return via(rs, "nginx") }
func viaRLS(rs []Request) []Request   { return via(rs, "rls") }

func via(rs []Request, v string) []Request {
	for i := range rs {
		rs[i].Via = v
	}
	return rs
}

func join(rs ...[]Request) []Request {
	var out []Request
	for _, r := range rs {
		out = append(out, r...)
	}
	return out
}

func TestCheck(t *testing.T) {
	api := policy("api", 20, false, "local")
	login := policy("login", 5, false, "closed")
	orders := policy("orders", 30, true, "open")
	kill := Span{Kind: KillPrimary, Region: "eu", Start: at(2), End: at(4)}
	tests := []struct {
		name     string
		reqs     []Request
		policies []PolicyState
		faults   []Span
		want     map[string]int // rule -> violations
	}{
		{"exact limit within a region", admitted(20, "eu", "api", "u1", 0), []PolicyState{api}, nil, nil},
		{"one over the limit, store healthy", admitted(21, "eu", "api", "u1", 0), []PolicyState{api}, nil,
			map[string]int{RuleOverAdmission: 1}},
		{"regions count apart", join(admitted(20, "eu", "api", "u1", 0), admitted(20, "us", "api", "u1", 0)),
			[]PolicyState{api}, nil, nil},
		{"subjects count apart", join(admitted(20, "eu", "api", "u1", 0), admitted(20, "eu", "api", "u2", 0)),
			[]PolicyState{api}, nil, nil},
		{"the next window starts again", join(admitted(20, "eu", "api", "u1", 0), admitted(20, "eu", "api", "u1", 10)),
			[]PolicyState{api}, nil, nil},
		{"a store failover widens the bound", admitted(50, "eu", "api", "u1", 0), []PolicyState{api}, []Span{kill}, nil},
		{"but not past it", admitted(81, "eu", "api", "u1", 0), []PolicyState{api}, []Span{kill},
			map[string]int{RuleOverAdmission: 1}},
		{"a failover no fault caused widens it too", admitted(10, "eu", "login", "u1", 0), []PolicyState{login},
			[]Span{{Kind: Failover, Region: "eu", Start: at(1), End: at(3)}}, nil},
		{"without it the same is an over-admission", admitted(10, "eu", "login", "u1", 0), []PolicyState{login}, nil,
			map[string]int{RuleOverAdmission: 1}},
		{"another region's failover does not", admitted(21, "us", "api", "u1", 0), []PolicyState{api}, []Span{kill},
			map[string]int{RuleOverAdmission: 1}},
		{"a raise acknowledged is honoured", admitted(30, "eu", "api", "u1", 0),
			[]PolicyState{api, {At: at(-1), ID: "api", Limit: 30, Window: 10, OnStoreFailure: "local", Enforced: true}}, nil, nil},
		{"a policy raised behind the checker's back is reported", admitted(30, "eu", "api", "u1", 0), []PolicyState{api}, nil,
			map[string]int{RuleOverAdmission: 1}},
		{"a policy out of force is not bounded", admitted(30, "eu", "api", "u1", 0),
			[]PolicyState{api, {At: at(-1), ID: "api", Window: 10, Enforced: false}}, nil, nil},
		{"global: shares sum to one across regions", join(admitted(15, "eu", "orders", "u1", 0), admitted(15, "us", "orders", "u1", 5)),
			[]PolicyState{orders}, nil, nil},
		{"global: over the report delay's overshoot", join(admitted(30, "eu", "orders", "u1", 0), admitted(30, "us", "orders", "u1", 0)),
			[]PolicyState{orders}, nil, map[string]int{RuleOverAdmission: 1}},
		{"503 of a fail-closed policy while its store is gone", []Request{{Start: at(3), End: at(3.01), Region: "eu", Policy: "login", Status: 503}},
			[]PolicyState{login}, []Span{kill}, nil},
		{"503 of a fail-closed policy with its store up", []Request{{Start: at(30), End: at(30.01), Region: "eu", Policy: "login", Status: 503}},
			[]PolicyState{login}, []Span{kill}, map[string]int{RuleServerError: 1}},
		{"a degraded 503 of a fail-closed policy with its store up", join(admitted(3, "eu", "login", "u1", 30),
			[]Request{{Start: at(31), End: at(31.01), Region: "eu", Via: "check", Policy: "login", Subject: "u2", Status: 503, Decided: true, Degraded: true}},
			admitted(20, "eu", "api", "u3", 30)),
			[]PolicyState{login, api}, []Span{kill}, nil},
		{"too many degraded answers with the store up", degraded(admitted(20, "eu", "api", "u1", 30), 2),
			[]PolicyState{api}, nil, map[string]int{RuleDegraded: 1}},
		{"degraded answers while the store is gone are not counted", degraded(admitted(20, "eu", "api", "u1", 2), 20),
			[]PolicyState{api}, []Span{kill}, nil},
		{"503 of a fail-open policy is an outage", []Request{{Start: at(3), End: at(3.01), Region: "eu", Policy: "api", Status: 503}},
			[]PolicyState{api}, []Span{kill}, map[string]int{RuleServerError: 1}},
		{"500 is never right", []Request{{Start: at(3), End: at(3.01), Region: "eu", Policy: "api", Status: 500}},
			[]PolicyState{api}, nil, map[string]int{RuleServerError: 1}},
		{"400 is unexpected", []Request{{Start: at(3), End: at(3.01), Region: "eu", Policy: "api", Status: 400}},
			[]PolicyState{api}, nil, map[string]int{RuleUnexpected: 1}},
		{"too slow", []Request{{Start: at(3), End: at(4.5), Region: "eu", Policy: "api", Status: 429}},
			[]PolicyState{api}, nil, map[string]int{RuleLatency: 1}},
		{"connection refused by a killed daemon", []Request{{Start: at(3), End: at(3), Region: "eu", Policy: "api", Err: "refused"}},
			[]PolicyState{api}, []Span{{Kind: KillDaemon, Region: "eu", Daemon: "eu-1", Start: at(2), End: at(5)}}, nil},
		{"connection refused with every daemon up", []Request{{Start: at(3), End: at(3), Region: "eu", Policy: "api", Err: "refused"}},
			[]PolicyState{api}, nil, map[string]int{RuleTransport: 1}},
		{"a degraded answer widens the window to the fallback's allowance", func() []Request {
			rs := admitted(30, "eu", "api", "u1", 0)
			rs[25].Degraded = true
			return rs
		}(), []PolicyState{api}, nil, nil},
		{"a degraded answer through nginx widens the window too", func() []Request {
			rs := viaNginx(admitted(30, "eu", "api", "u1", 0))
			rs[25].Degraded = true
			return rs
		}(), []PolicyState{api}, nil, nil},
		{"too many degraded answers through nginx with the store up", degraded(viaNginx(admitted(20, "eu", "api", "u1", 30)), 2),
			[]PolicyState{api}, nil, map[string]int{RuleDegraded: 1}},
		{"a degraded RLS answer widens the window too", func() []Request {
			rs := viaRLS(admitted(30, "eu", "api", "u1", 0))
			rs[25].Degraded = true
			return rs
		}(), []PolicyState{api}, nil, nil},
		{"too many degraded RLS answers with the store up", degraded(viaRLS(admitted(20, "eu", "api", "u1", 30)), 2),
			[]PolicyState{api}, nil, map[string]int{RuleDegraded: 1}},
		{"a daemon restarting widens its region's window", admitted(30, "eu", "api", "u1", 0), []PolicyState{api},
			[]Span{{Kind: KillDaemon, Region: "eu", Daemon: "eu-1", Start: at(1), End: at(2)}}, nil},
		{"a gateway's fail-open answer is not counted", func() []Request {
			rs := admitted(25, "eu", "api", "u1", 0)
			for i := range rs {
				rs[i].Decided = i < 20
			}
			return rs
		}(), []PolicyState{api}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]int{}
			vs, _ := Check(tc.reqs, tc.policies, tc.faults, testBounds)
			for _, v := range vs {
				got[v.Rule]++
			}
			if fmt.Sprint(got) != fmt.Sprint(nonNil(tc.want)) {
				t.Errorf("Check() violations = %v, want %v (%+v)", got, nonNil(tc.want), vs)
			}
		})
	}
}

func nonNil(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

// TestCheckNamesTheFirstRequestPastTheBound: the violation points at the
// request that broke the bound, with the faults active.
func TestCheckNamesTheFirstRequestPastTheBound(t *testing.T) {
	reqs := admitted(25, "eu", "api", "u1", 0)
	vs, _ := Check(reqs, []PolicyState{policy("api", 20, false, "local")}, nil, testBounds)
	if len(vs) != 1 {
		t.Fatalf("Check() = %d violations, want 1", len(vs))
	}
	v := vs[0]
	if v.Admitted != 25 || v.Bound != 20 || !v.Request.Start.Equal(at(2.0)) {
		t.Errorf("Check() = admitted %d bound %v request at %v, want 25, 20, %v", v.Admitted, v.Bound, v.Request.Start, at(2.0))
	}
}
