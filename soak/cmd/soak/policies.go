package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/soak"
)

// policyDoc is the part of a policy document the soak writes.
type policyDoc struct {
	ID             string   `json:"id"`
	Routes         []string `json:"-"`
	Algorithm      string   `json:"algorithm"`
	Limit          float64  `json:"limit"`
	Window         float64  `json:"window"`
	Mode           string   `json:"mode"`
	Class          string   `json:"class,omitempty"`
	Scope          string   `json:"scope,omitempty"`
	OnStoreFailure string   `json:"on_store_failure,omitempty"`
	Description    string   `json:"description"`
}

func (p policyDoc) MarshalJSON() ([]byte, error) {
	type plain policyDoc
	return json.Marshal(struct {
		plain
		Match map[string][]string `json:"match"`
	}{plain(p), map[string][]string{"routes": p.Routes}})
}

// The soak's policies: one per route, each fixed_window so that the
// checker can count a window exactly from the clients' side.
func initialPolicies() []policyDoc {
	return []policyDoc{
		{ID: "api", Routes: []string{"/soak/api"}, Algorithm: "fixed_window", Limit: 8, Window: 5, Mode: "enforce",
			OnStoreFailure: "local", Description: "soak: a regional quota, local fallback"},
		{ID: "login", Routes: []string{"/soak/login"}, Algorithm: "fixed_window", Limit: 5, Window: 10, Mode: "enforce",
			Class: "security", OnStoreFailure: "closed", Description: "soak: fail-closed, 503 while the store is gone"},
		{ID: "orders", Routes: []string{"/soak/orders"}, Algorithm: "fixed_window", Limit: 40, Window: 10, Mode: "enforce",
			Scope: "global", OnStoreFailure: "open", Description: "soak: a global quota across the three regions"},
		{ID: "gw", Routes: []string{"/gw/*"}, Algorithm: "fixed_window", Limit: 10, Window: 5, Mode: "enforce",
			OnStoreFailure: "open", Description: "soak: per client address behind nginx"},
	}
}

// extraPolicy is the policy the nemesis adds and takes out of force.
func extraPolicy(mode string) policyDoc {
	return policyDoc{ID: "extra", Routes: []string{"/soak/extra"}, Algorithm: "fixed_window", Limit: 8, Window: 5, Mode: mode,
		OnStoreFailure: "local", Description: "soak: added and removed while the soak runs"}
}

// rlsPolicy is the RLS region's descriptor limit, from the Envoy file.
var rlsPolicy = soak.PolicyState{ID: "rls", Limit: 5, Window: 1, OnStoreFailure: "open", Enforced: true}

// envoyConfig is the Envoy file with the descriptor limit perUnit.
func envoyConfig(perUnit int) string {
	return fmt.Sprintf(`domain: soak
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: %d
`, perUnit)
}

// putFile writes the watched Envoy file with the rls limit toggled
// between 5 and 8 and records it from the time it is written: every
// daemon reads the file within 250 ms (configsource.DefaultInterval).
func (tl *timeline) putFile(path string) error {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	cur := rlsPolicy
	for _, s := range tl.states {
		if s.ID == "rls" {
			cur = s
		}
	}
	next := cur
	next.Limit = 13 - cur.Limit // 5 <-> 8
	next.At = time.Now()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(envoyConfig(int(next.Limit))), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	tl.states = append(tl.states, next)
	return nil
}

func stateOf(p policyDoc, at time.Time) soak.PolicyState {
	mode := p.OnStoreFailure
	if mode == "" {
		mode = "open"
	}
	return soak.PolicyState{At: at, ID: p.ID, Limit: p.Limit, Window: p.Window, Global: p.Scope == "global",
		OnStoreFailure: mode, Enforced: p.Mode == "enforce"}
}

// timeline is the policies in force over time, as the admin API
// acknowledged them.
type timeline struct {
	mu     sync.Mutex
	states []soak.PolicyState
	docs   map[string]policyDoc
}

func newTimeline(at time.Time) *timeline {
	tl := &timeline{docs: map[string]policyDoc{}}
	r := rlsPolicy
	r.At = at
	tl.states = append(tl.states, r, soak.PolicyState{At: at, ID: "extra", Window: 5})
	for _, p := range initialPolicies() {
		tl.docs[p.ID] = p
		tl.states = append(tl.states, stateOf(p, at))
	}
	return tl
}

func (tl *timeline) doc(id string) (policyDoc, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	p, ok := tl.docs[id]
	return p, ok
}

func (tl *timeline) snapshot() []soak.PolicyState {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]soak.PolicyState(nil), tl.states...)
}

// put writes p through d's admin API; when record is set and the API
// acknowledges it, the change is in the timeline from the time it was
// sent (a raise may be in force before the answer arrives).
func (tl *timeline) put(ctx context.Context, d *daemon, token string, p policyDoc, record bool) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "PUT", "http://"+d.addr+"/v1/policies/"+p.ID, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("PUT policy %s on %s: %w", p.ID, d.name, err)
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		var b bytes.Buffer
		_, _ = b.ReadFrom(res.Body)
		return fmt.Errorf("PUT policy %s on %s: %d %s", p.ID, d.name, res.StatusCode, bytes.TrimSpace(b.Bytes()))
	}
	if record {
		tl.mu.Lock()
		tl.docs[p.ID] = p
		tl.states = append(tl.states, stateOf(p, sent))
		tl.mu.Unlock()
	}
	return nil
}
