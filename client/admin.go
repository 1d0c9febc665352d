package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sluice-rl/sluice/adminapi"
	"github.com/sluice-rl/sluice/coordinator/msg"

	"github.com/sluice-rl/sluice/quota"
)

// The admin API's calls. Each sends the Config's Token as a bearer token;
// a refusal is a *Problem (401 without a token, 403 with a wrong one), a
// daemon that cannot be asked an error wrapping ErrUnavailable.

// Policies lists the policies in force, for one tier (its own and
// every-tier ones) or, with tier empty, all of them.
func (c *Client) Policies(ctx context.Context, tier string) ([]quota.Policy, error) {
	var q url.Values
	if tier != "" {
		q = url.Values{"tier": {tier}}
	}
	var out struct {
		Policies []quota.Policy `json:"policies"`
	}
	_, err := c.call(ctx, http.MethodGet, "/v1/policies", q, nil, &out)
	return out.Policies, err
}

// PolicyVersions is a policy's history: the kept versions, oldest first,
// and the version in force (0 when the policy is deleted).
type PolicyVersions = adminapi.VersionList

// PolicyVersions reads a policy's kept versions.
func (c *Client) PolicyVersions(ctx context.Context, id string) (*PolicyVersions, error) {
	var out PolicyVersions
	if _, err := c.call(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(id)+"/versions", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PutPolicy publishes doc, a policy document (JSON), as the next version
// of policy id. With ifMatch set the daemon refuses (412) unless that is
// the version in force. The daemon parses doc strictly and answers a 400
// naming every bad field; nothing changes then.
func (c *Client) PutPolicy(ctx context.Context, id string, doc json.RawMessage, ifMatch *int) (quota.Policy, error) {
	var out quota.Policy
	var hdr []string
	if ifMatch != nil {
		hdr = []string{"If-Match", `"` + strconv.Itoa(*ifMatch) + `"`}
	}
	_, err := c.call(ctx, http.MethodPut, "/v1/policies/"+url.PathEscape(id), nil, doc, &out, hdr...)
	return out, err
}

// RollbackPolicy republishes the previous version's content as a new
// version; inForce, when set, must be the version in force.
func (c *Client) RollbackPolicy(ctx context.Context, id string, inForce *int) (quota.Policy, error) {
	var out quota.Policy
	var hdr []string
	if inForce != nil {
		hdr = []string{"If-Match", `"` + strconv.Itoa(*inForce) + `"`}
	}
	_, err := c.call(ctx, http.MethodPost, "/v1/policies/"+url.PathEscape(id)+"/rollback", nil, nil, &out, hdr...)
	return out, err
}

// RollbackPolicyTo publishes the content of kept version n as a new
// version, on condition that the version in force is still the one read
// first. Rolling back to the version just before the one in force is the
// daemon's own rollback; any older one is a put of its content.
func (c *Client) RollbackPolicyTo(ctx context.Context, id string, n int) (quota.Policy, error) {
	vs, err := c.PolicyVersions(ctx, id)
	if err != nil {
		return quota.Policy{}, err
	}
	target, ok := vs.Version(n)
	if !ok {
		return quota.Policy{}, fmt.Errorf("policy %s has no kept version %d (kept: %s)", id, n, versionNumbers(vs.Versions))
	}
	inForce := vs.InForce
	if inForce == n {
		return quota.Policy{}, fmt.Errorf("policy %s: version %d is already in force", id, n)
	}
	if inForce > 0 && n == inForce-1 {
		return c.RollbackPolicy(ctx, id, &inForce)
	}
	target.Version = 0
	doc, err := json.Marshal(target)
	if err != nil {
		return quota.Policy{}, err
	}
	var ifMatch *int
	if inForce > 0 {
		ifMatch = &inForce
	}
	return c.PutPolicy(ctx, id, doc, ifMatch)
}

func versionNumbers(ps []quota.Policy) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ", "
		}
		s += strconv.Itoa(p.Version)
	}
	if s == "" {
		return "none"
	}
	return s
}

// Overrides lists the overrides in force (not expired), ordered by id.
func (c *Client) Overrides(ctx context.Context) ([]quota.Override, error) {
	var out struct {
		Overrides []quota.Override `json:"overrides"`
	}
	_, err := c.call(ctx, http.MethodGet, "/v1/overrides", nil, nil, &out)
	return out.Overrides, err
}

// PutOverride creates or replaces (by id) an override.
func (c *Client) PutOverride(ctx context.Context, o quota.Override) (quota.Override, error) {
	var out quota.Override
	_, err := c.call(ctx, http.MethodPost, "/v1/overrides", nil, o, &out)
	return out, err
}

// DeleteOverride deletes an override; an unknown id is a 404 *Problem.
func (c *Client) DeleteOverride(ctx context.Context, id string) error {
	_, err := c.call(ctx, http.MethodDelete, "/v1/overrides/"+url.PathEscape(id), nil, nil, nil)
	return err
}

// Key is a registered API key, named by its id (never the key itself).
type Key = adminapi.Key

// PutKey registers apiKey with a tier.
func (c *Client) PutKey(ctx context.Context, apiKey, tier string) (Key, error) {
	var out Key
	in := struct {
		Tier string `json:"tier"`
	}{tier}
	_, err := c.call(ctx, http.MethodPut, "/v1/keys/"+url.PathEscape(apiKey), nil, in, &out)
	return out, err
}

// DeleteKey forgets apiKey; an unregistered key is a 404 *Problem.
func (c *Client) DeleteKey(ctx context.Context, apiKey string) error {
	_, err := c.call(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(apiKey), nil, nil, nil)
	return err
}

// UsageQuery narrows a usage read: the tier (else the key registry's, or
// every policy) and a route (and method) to report exactly the policies a
// request there would meet.
type UsageQuery struct {
	Tier, Route, Method string
}

// The bodies of a usage read.
type (
	// Usage is a subject's state under each policy, read without spending.
	Usage = adminapi.Usage
	// GlobalShares is a global policy's division among the regions.
	GlobalShares = adminapi.GlobalShares
	// GlobalQuota is a global quota's count in the current window, across
	// the regions.
	GlobalQuota = adminapi.GlobalQuota
)

// Usage reads subject's state ("key:<key id>", "user:42", "ip:192.0.2.1").
func (c *Client) Usage(ctx context.Context, subject string, q UsageQuery) (*Usage, error) {
	v := url.Values{}
	for k, s := range map[string]string{"tier": q.Tier, "route": q.Route, "method": q.Method} {
		if s != "" {
			v.Set(k, s)
		}
	}
	var out Usage
	if _, err := c.call(ctx, http.MethodGet, "/v1/keys/"+url.PathEscape(subject)+"/usage", v, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// The daemon's multi-region view.
type (
	// Regions is the multi-region view of GET /v1/regions; MultiRegion is
	// false on a single-region daemon and the rest is then empty.
	Regions = adminapi.Regions
	// RegionInfo is one region as this daemon sees it.
	RegionInfo = msg.RegionInfo
	// Member is one gossip member: a daemon of some region.
	Member = msg.Member
	// QuotaStat is the size of a global quota's counters on this daemon.
	QuotaStat = msg.QuotaStat
)

// Regions reads the daemon's multi-region view.
func (c *Client) Regions(ctx context.Context) (*Regions, error) {
	var out Regions
	if _, err := c.call(ctx, http.MethodGet, "/v1/regions", nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
