package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/adminapi"

	"github.com/sluice-rl/sluice/decide"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/quota/redispolicy"
	"github.com/sluice-rl/sluice/region/globalshare"
	"github.com/sluice-rl/sluice/share"
)

// who names the actor of an admin change in the audit log. There is one
// admin token, so the actor is "admin" and the address it came from.
func who(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "admin@" + host
}

// ParseIfMatch reads an If-Match header naming a policy version: 3, "3" or
// W/"3" (the ETag the admin API returns). Absent is nil; "*" is nil too
// (any existing version). Anything else is an error.
func ParseIfMatch(h http.Header) (*int, error) {
	vs := h.Values("If-Match")
	if len(vs) == 0 {
		return nil, nil
	}
	if len(vs) > 1 {
		return nil, errors.New("give one version")
	}
	v := strings.TrimSpace(vs[0])
	if v == "*" {
		return nil, nil
	}
	v = strings.TrimPrefix(v, "W/")
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if len(v) == 0 || len(v) > 9 {
		return nil, fmt.Errorf("want a policy version such as \"3\", got %q", clipStr(vs[0]))
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return nil, fmt.Errorf("want a policy version such as \"3\", got %q", clipStr(vs[0]))
	}
	return &n, nil
}

func etag(version int) string { return `"` + strconv.Itoa(version) + `"` }

// registryProblem maps a Registry error to a problem.
func registryProblem(err error, prefix string) *Problem {
	if p, ok := decide.FromValidation(err, prefix); ok {
		return p
	}
	var ce *quota.ConflictError
	switch {
	case errors.Is(err, redispolicy.ErrConcurrentChange):
		return newProblem(http.StatusConflict, ProblemConflict, "another daemon changed the policies at the same moment; retry: "+err.Error())
	case errors.As(err, &ce):
		p := newProblem(http.StatusPreconditionFailed, ProblemPrecondition, ce.Error(), quota.FieldError{Field: "If-Match", Reason: fmt.Sprintf("the version in force is %d", ce.Have)})
		return p
	case errors.Is(err, quota.ErrNotFound):
		return newProblem(http.StatusNotFound, ProblemNotFound, err.Error())
	case errors.Is(err, quota.ErrNoPreviousVersion):
		return newProblem(http.StatusConflict, ProblemConflict, err.Error())
	case errors.Is(err, quota.ErrStore):
		return newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the change was not saved: "+err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the change was not saved: "+err.Error())
	}
	return newProblem(http.StatusConflict, ProblemConflict, err.Error())
}

func (d *Daemon) handlePutPolicy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ifMatch, err := ParseIfMatch(r.Header)
	if err != nil {
		d.fail(w, r, invalid("If-Match", "%v", err))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, quota.MaxPolicyBytes))
	if err != nil {
		d.fail(w, r, newProblem(http.StatusRequestEntityTooLarge, ProblemTooLarge, fmt.Sprintf("a policy document must be at most %d bytes", quota.MaxPolicyBytes)))
		return
	}
	// The id comes from the path; a body that names one must agree.
	var head map[string]json.RawMessage
	if err := json.Unmarshal(body, &head); err == nil && head != nil {
		if raw, ok := head["id"]; ok {
			var bid string
			if json.Unmarshal(raw, &bid) != nil || bid != id {
				d.fail(w, r, invalid("id", "must equal the id in the path (%q) or be absent", clipStr(id)))
				return
			}
		} else {
			head["id"], _ = json.Marshal(id)
			body, _ = json.Marshal(head)
		}
	}
	p, err := quota.ParsePolicy(body)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	out, err := d.reg.Put(r.Context(), who(r), p, ifMatch)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged()
	w.Header().Set("ETag", etag(out.Version))
	status := http.StatusOK
	if out.Version == 1 {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/policies/"+out.ID+"/versions")
	}
	writeJSON(w, status, out)
}

// PolicyList is the body of GET /v1/policies.
type PolicyList struct {
	Policies []quota.Policy `json:"policies"`
}

func (d *Daemon) handleListPolicies(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "tier" {
			d.fail(w, r, invalid(k, "unknown query parameter"))
			return
		}
	}
	tier := q.Get("tier")
	if tier != "" && !quota.ValidID(tier) {
		d.fail(w, r, invalid("tier", "must match %s, got %q", quota.IDPattern, clipStr(tier)))
		return
	}
	ps := d.reg.List(tier)
	if ps == nil {
		ps = []quota.Policy{}
	}
	writeJSON(w, http.StatusOK, PolicyList{Policies: ps})
}

// VersionList is the body of GET /v1/policies/{id}/versions.
type VersionList = adminapi.VersionList

func (d *Daemon) handleVersions(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	vs, err := d.reg.Versions(id)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	out := VersionList{ID: id, Versions: vs}
	if p, ok := d.reg.Get(id); ok {
		out.InForce = p.Version
		w.Header().Set("ETag", etag(p.Version))
	}
	writeJSON(w, http.StatusOK, out)
}

func (d *Daemon) handleRollback(w http.ResponseWriter, r *http.Request) {
	ifMatch, err := ParseIfMatch(r.Header)
	if err != nil {
		d.fail(w, r, invalid("If-Match", "%v", err))
		return
	}
	out, err := d.reg.Rollback(r.Context(), who(r), r.PathValue("id"), ifMatch)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged()
	w.Header().Set("ETag", etag(out.Version))
	writeJSON(w, http.StatusOK, out)
}

func (d *Daemon) handlePutOverride(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, quota.MaxPolicyBytes))
	if err != nil {
		d.fail(w, r, newProblem(http.StatusRequestEntityTooLarge, ProblemTooLarge, fmt.Sprintf("an override must be at most %d bytes", quota.MaxPolicyBytes)))
		return
	}
	o, err := quota.ParseOverride(body)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	out, err := d.reg.PutOverride(r.Context(), who(r), o)
	if err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged() // overrides travel with the policy set
	w.Header().Set("Location", "/v1/overrides/"+out.ID)
	writeJSON(w, http.StatusCreated, out)
}

// OverrideList is the body of GET /v1/overrides.
type OverrideList struct {
	Overrides []quota.Override `json:"overrides"`
}

// handleListOverrides lists the overrides in force (not expired), by id.
func (d *Daemon) handleListOverrides(w http.ResponseWriter, r *http.Request) {
	list := d.reg.Overrides()
	if list == nil {
		list = []quota.Override{}
	}
	writeJSON(w, http.StatusOK, OverrideList{Overrides: list})
}

func (d *Daemon) handleDeleteOverride(w http.ResponseWriter, r *http.Request) {
	if err := d.reg.DeleteOverride(r.Context(), who(r), r.PathValue("id")); err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged()
	w.WriteHeader(http.StatusNoContent)
}

// KeyRequest is the body of PUT /v1/keys/{api_key}.
type KeyRequest struct {
	Tier string `json:"tier"`
}

// KeyResponse names a registered key by its id, never the key.
type KeyResponse = adminapi.Key

func (d *Daemon) handlePutKey(w http.ResponseWriter, r *http.Request) {
	var in KeyRequest
	if p := decodeJSON(w, r, d.cfg.MaxBodyBytes, &in); p != nil {
		d.fail(w, r, p)
		return
	}
	key := r.PathValue("api_key")
	if err := d.reg.PutKey(r.Context(), who(r), key, in.Tier); err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged() // the key registry travels with the policy set
	id := quota.KeyID(key)
	writeJSON(w, http.StatusOK, KeyResponse{KeyID: id, Subject: "key:" + id, Tier: in.Tier})
}

// handleDeleteKey forgets an API key: its requests get the anonymous tier
// (or a trusted gateway's) again, in every region.
func (d *Daemon) handleDeleteKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("api_key")
	if err := d.reg.DeleteKey(r.Context(), who(r), key); err != nil {
		d.fail(w, r, registryProblem(err, ""))
		return
	}
	d.policiesChanged()
	w.WriteHeader(http.StatusNoContent)
}

// The bodies of GET /v1/keys/{subject}/usage.
type (
	Usage        = adminapi.Usage
	GlobalQuota  = adminapi.GlobalQuota
	GlobalShares = adminapi.GlobalShares
)

// handleUsage peeks at a subject's state. {subject} is a subject as checks
// count it ("key:<key id>", "user:42", "ip:192.0.2.1"); the tier is
// ?tier=, else the key registry's for a key subject, else every policy. With
// ?route= (and ?method=) it reports exactly the policies, overrides and
// costs a request to that route would meet.
// ResetResponse is the body of DELETE /v1/keys/{subject}/state.
type ResetResponse struct {
	Subject string `json:"subject"`
	// Policies are those whose state was forgotten.
	Policies []string `json:"policies"`
}

// subjectQuery reads the subject from r's path and its query, which may
// hold only the parameters named in allowed; on anything else it answers w
// with the problem and returns false.
func (d *Daemon) subjectQuery(w http.ResponseWriter, r *http.Request, allowed ...string) (string, url.Values, bool) {
	subject := r.PathValue("subject")
	if subject == "" || len(subject) > 256 {
		d.fail(w, r, invalid("subject", "must be 1 to 256 bytes"))
		return "", nil, false
	}
	q := r.URL.Query()
	for k := range q {
		if !slices.Contains(allowed, k) {
			d.fail(w, r, invalid(k, "unknown query parameter"))
			return "", nil, false
		}
	}
	return subject, q, true
}

// handleResetState forgets a subject's state in this region, under every
// policy or those named by ?policy=: the operator's way to let in a
// customer locked out by mistake without waiting for the window. Other
// regions keep their state (and, for a global policy, their share).
func (d *Daemon) handleResetState(w http.ResponseWriter, r *http.Request) {
	subject, q, ok := d.subjectQuery(w, r, "policy")
	if !ok {
		return
	}
	policies := q["policy"]
	for _, id := range policies {
		if _, ok := d.reg.Get(id); !ok {
			d.fail(w, r, invalid("policy", "no policy %q", clipStr(id)))
			return
		}
	}
	if len(policies) == 0 {
		for _, p := range d.reg.List("") {
			policies = append(policies, p.ID)
		}
	}
	slices.Sort(policies)
	policies = slices.Compact(policies)
	err := d.lim.Reset(r.Context(), subject, policies)
	if after, merr := json.Marshal(ResetResponse{Subject: subject, Policies: policies}); merr == nil {
		e := quota.AuditEntry{Time: time.Now().UTC(), Who: who(r), Action: "state.reset", Target: subject, After: after}
		if err != nil {
			e.Action = "state.reset.failed"
		}
		if aerr := d.audit.Append(e); aerr != nil {
			d.log.Error("audit append failed", "action", e.Action, "err", aerr)
		}
	}
	if err != nil {
		d.log.Warn("state reset failed", "subject", subject, "err", err)
		d.fail(w, r, newProblem(http.StatusServiceUnavailable, ProblemStateStore, "the decision store could not forget the state; in-process state was cleared, retry"))
		return
	}
	d.log.Info("state reset", "subject", subject, "policies", len(policies), "by", who(r))
	writeJSON(w, http.StatusOK, ResetResponse{Subject: subject, Policies: policies})
}

func (d *Daemon) handleUsage(w http.ResponseWriter, r *http.Request) {
	subject, q, ok := d.subjectQuery(w, r, "tier", "route", "method")
	if !ok {
		return
	}
	tier := q.Get("tier")
	if tier != "" && !quota.ValidID(tier) {
		d.fail(w, r, invalid("tier", "must match %s", quota.IDPattern))
		return
	}
	if tier == "" {
		if kid, ok := strings.CutPrefix(subject, "key:"); ok {
			tier, _ = d.reg.KeyTier(kid)
		}
	}
	var checks []engine.Check
	var quotas []usageQuota
	now := time.Now()
	out := Usage{Subject: subject, Tier: tier, Policies: []PolicyResult{}}
	add := func(p *quota.Policy, l engine.Limit, override string) {
		scale := 1.0
		switch {
		case p.Scope == quota.ScopeGlobal && d.quotas != nil && d.cl != nil && l.Algorithm == engine.FixedWindow:
			// As the check does: the G-counter rule, not a share.
			w := share.WindowIndex(now, l.Window)
			v := d.cl.c.QuotaView(p.ID, subject, w)
			scale = quotaScale(l.Count, v.Others)
			quotas = append(quotas, usageQuota{at: len(checks), limit: l, window: w, view: v})
		case p.Scope == quota.ScopeGlobal:
			scale = d.shares.Share(p.ID, subject)
			if !(scale > 0) || scale > 1 {
				scale = 1
			}
		}
		checks = append(checks, engine.Check{Policy: p.ID, Limit: l, Scale: scale, Version: uint64(p.Version)})
		out.Policies = append(out.Policies, PolicyResult{ID: p.ID, Version: p.Version, Mode: p.Mode, Class: p.Class, Scope: p.Scope, Override: override})
	}
	if route := q.Get("route"); route != "" {
		if err := decide.ValidRoute(route); err != nil {
			d.fail(w, r, invalid("route", "%v", err))
			return
		}
		method := q.Get("method")
		if method == "" {
			method = http.MethodGet
		}
		t := tier
		if t == "" {
			t = quota.TierAnonymous
		}
		applied, exempt := d.reg.MatchExempt(quota.Query{Tier: t, Subject: subject, Method: method, Route: quota.NormalizeRoute(route)})
		for _, a := range applied {
			add(a.Policy, a.Limit, a.Override)
		}
		out.Exempt = decide.ExemptResults(exempt)
	} else {
		var exempt []quota.Exemption
		for _, p := range d.reg.List(tier) {
			if p.IsDescriptorPolicy() {
				continue // counted per descriptor, not per subject
			}
			l, override, ex := d.reg.SubjectLimit(&p, subject)
			if ex != nil {
				exempt = append(exempt, *ex)
				continue
			}
			add(&p, l, override)
		}
		out.Exempt = decide.ExemptResults(exempt)
	}
	results, p := d.peek(r, subject, checks)
	if p != nil {
		d.fail(w, r, p)
		return
	}
	for j := range checks {
		out.Policies[j].Fill(results[j])
	}
	if len(quotas) > 0 {
		// The engine's own count of each quota, read whole: at the
		// scale the check uses, a count above the allowance left shows
		// only as nothing remaining.
		whole := make([]engine.Check, len(quotas))
		for i, q := range quotas {
			whole[i] = checks[q.at]
			whole[i].Scale = 1
		}
		counts, p := d.peek(r, subject, whole)
		if p != nil {
			d.fail(w, r, p)
			return
		}
		for i, q := range quotas {
			out.GlobalQuotas = append(out.GlobalQuotas, d.quotaUsage(out.Policies[q.at].ID, q, counts[i]))
		}
	}
	out.GlobalShares = d.globalShares(subject, out.Policies, out.GlobalQuotas)
	writeJSON(w, http.StatusOK, out)
}

// usageQuota is a global quota met by a usage request.
type usageQuota struct {
	at     int // index in the checks
	limit  engine.Limit
	window int64 // share.WindowIndex
	view   globalshare.QuotaView
}

// quotaUsage is q's GlobalQuota, given the engine's result for it at
// scale 1.
func (d *Daemon) quotaUsage(policy string, q usageQuota, whole engine.Result) GlobalQuota {
	own := max(whole.Limit-whole.Remaining, 0) // the engine's count
	gq := GlobalQuota{Policy: policy, WindowS: q.limit.Window.Seconds(),
		WindowStart: time.Unix(0, q.window*int64(q.limit.Window)).UTC(),
		Limit:       whole.Limit, Used: own + int64(q.view.Others), Regions: map[string]int64{}}
	gq.Remaining = max(gq.Limit-gq.Used, 0)
	for r := range d.cl.g.Regions() {
		gq.Regions[r] = 0
	}
	for r, n := range q.view.Regions {
		gq.Regions[r] = int64(n)
	}
	gq.Regions[d.cl.g.Region()] += own
	return gq
}

// peek reads checks without spending, MaxChecks at a time.
func (d *Daemon) peek(r *http.Request, subject string, checks []engine.Check) ([]engine.Result, *Problem) {
	results := make([]engine.Result, 0, len(checks))
	for start := 0; start < len(checks); start += engine.MaxChecks {
		end := min(start+engine.MaxChecks, len(checks))
		o, err := d.lim.Peek(r.Context(), engine.Request{Subject: subject, Checks: checks[start:end]})
		if err != nil {
			if errors.Is(err, engine.ErrBadRequest) {
				return nil, invalid("subject", "%v", err)
			}
			return nil, newProblem(http.StatusServiceUnavailable, ProblemUnavailable, "the store could not be read: "+err.Error())
		}
		results = append(results, o.Results[:end-start]...)
	}
	return results, nil
}
