package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/adminapi"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-rl/sluice/coordinator"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/limiter"
	"github.com/sluice-rl/sluice/gossip"
	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/quota/redispolicy"
	"github.com/sluice-rl/sluice/region/globalshare"
	"github.com/sluice-rl/sluice/region/policyset"
	"github.com/sluice-rl/sluice/share"
)

// GossipConfig turns a daemon into one node of a multi-region cluster: it
// joins the memberlist cluster, exchanges usage reports every Interval,
// enforces global-scope policies at its region's share and keeps one policy
// set in every region. A nil Config.Gossip runs the daemon single-region.
type GossipConfig struct {
	// Region names the region this daemon serves; Node is its stable node
	// id (never an address).
	Region, Node string
	// Listen is the memberlist address, "host:port" (UDP and TCP); port 0
	// picks a free one.
	Listen string
	// Advertise, if set, is the "host:port" other nodes dial.
	Advertise string
	// Join lists "host:port" seeds.
	Join []string
	// Interval is the report interval; the allocation's other timings
	// scale with it (ShareConfig).
	Interval time.Duration
	// SecretKey (16, 24 or 32 bytes) encrypts and authenticates gossip;
	// required unless Dev.
	SecretKey []byte
	Dev       bool
	// Preset is memberlist's timing profile: "lan", "wan" or "local".
	Preset string
	// Share, if its Interval is set, replaces ShareConfig(Interval).
	Share share.Config
	// Memberlist, if set, becomes gossip.Config.Memberlist: a hook that
	// adjusts memberlist's configuration (the live simulator's transport
	// with injected faults).
	Memberlist gossip.MemberlistHook
}

// ShareConfig returns share.DefaultConfig with its timings scaled to
// interval: Recent = interval/5, Settle = interval/4, RaiseDelay =
// interval/10 (the defaults at 10 s), so a compressed interval (1 s in tests
// and the live simulation) keeps the same proportions.
func ShareConfig(interval time.Duration) share.Config {
	sc := share.DefaultConfig()
	if interval <= 0 {
		return sc
	}
	sc.Interval = interval
	sc.Recent = interval / 5
	sc.Settle = interval / 4
	sc.RaiseDelay = interval / 10
	return sc
}

func (g *GossipConfig) gossipConfig(log *slog.Logger, reg prometheus.Registerer) (gossip.Config, error) {
	host, port, err := splitHostPort(g.Listen, "gossip listen")
	if err != nil {
		return gossip.Config{}, err
	}
	gc := gossip.Config{Node: g.Node, Region: g.Region, BindAddr: host, BindPort: port, Join: g.Join,
		Interval: g.Interval, SecretKey: g.SecretKey, Dev: g.Dev, Preset: g.Preset, Memberlist: g.Memberlist, Logger: log, Registerer: reg}
	if g.Advertise != "" {
		if gc.AdvertiseAddr, gc.AdvertisePort, err = splitHostPort(g.Advertise, "gossip advertise"); err != nil {
			return gossip.Config{}, err
		}
	}
	if err := gc.Validate(); err != nil {
		return gc, err
	}
	if len(g.Join) == 0 {
		// Valid for the first node of a new cluster, but such a node,
		// once restarted, is found only if another node gossips to the
		// address it had: a lone region until then.
		log.Warn("no --join seeds: other nodes must find this one; give every node the same seeds (one of its own region's others and one of each other region's)", "node", g.Node, "region", g.Region)
	}
	return gc, nil
}

func splitHostPort(s, what string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, fmt.Errorf("%s address %q: want HOST:PORT", what, s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%s address %q: bad port", what, s)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// cluster is the multi-region part of a daemon.
type cluster struct {
	g     *gossip.Node
	c     *globalshare.Coordinator
	log   *slog.Logger
	dirty chan struct{}            // a local policy change to broadcast
	in    chan gossip.PolicyUpdate // newest received update (buffer 1)

	mu   sync.Mutex
	rev  uint64 // revision of the policy set in force here
	hash string // its content hash
	from string // node the revision came from
}

// unconfirmed says, while the other regions cannot yet confirm contact
// with this daemon (gossip.Node.Unconfirmed), why, for /readyz; "" once
// they can, or once up has reached half the gossip interval (5 s at 10 s),
// so that a daemon some region never pings (an older build, or one
// region's nodes watching others) is still ready. A roll that waits for
// /readyz before it stops the next daemon of a region thereby keeps one
// daemon of the region in contact with every other region throughout:
// moving on at once would leave, for a moment, none that the other
// regions can confirm, and a healthy region would look partitioned.
func (cl *cluster) unconfirmed(up time.Duration) string {
	if up >= cl.g.Interval()/2 {
		return ""
	}
	joined, waiting := cl.g.Unconfirmed()
	switch {
	case !joined:
		return "not joined the gossip cluster yet"
	case len(waiting) > 0:
		return "waiting for the first contact ping of " + strings.Join(waiting, ", ")
	}
	return ""
}

// newCluster creates the gossip node and the coordinator (before either
// runs, so the handlers are in place when messages arrive).
func (d *Daemon) newCluster(gcfg *GossipConfig, reg prometheus.Registerer) error {
	if gcfg.Interval <= 0 {
		gcfg.Interval = gossip.DefaultInterval
	}
	sc := gcfg.Share
	if sc.Interval == 0 {
		sc = ShareConfig(gcfg.Interval)
	}
	cfg, err := gcfg.gossipConfig(d.log.With("component", "gossip"), reg)
	if err != nil {
		return err
	}
	// Received report epochs are bounded in the allocation's epochs.
	cfg.Interval = sc.Interval
	cfg.Now = d.now
	g, err := gossip.New(cfg)
	if err != nil {
		return err
	}
	if gcfg.Dev {
		d.log.Warn("gossip in development mode: unencrypted and unauthenticated, bound to loopback only", "listen", g.Addr())
	}
	gsc := globalshare.Config{Share: sc, Gossip: g, Usage: d.lim.DrainUsage,
		Limit: d.globalLimit, Quota: d.globalQuota, Bucket: d.globalBucket, Spend: d.spendTokens, Deposit: d.depositTokens,
		NodeLocalStore: d.mem != nil, Clock: d.cfg.Clock, Logger: d.log.With("component", "globalshare"), Registerer: reg}
	if d.redis != nil {
		gsc.Store = &redisShares{c: d.redis, prefix: d.cfg.Redis.KeyPrefix, ttl: time.Duration(sc.PartitionIntervals+2) * sc.Interval}
	}
	c, err := globalshare.New(gsc)
	if err != nil {
		return err
	}
	cl := &cluster{g: g, c: c, log: d.log, dirty: make(chan struct{}, 1), in: make(chan gossip.PolicyUpdate, 1)}
	g.OnPolicy(cl.receive)
	d.cl = cl
	d.shares = c
	d.quotas = c
	return nil
}

// redisKV is what the share store needs from a go-redis client.
type redisKV interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
}

// redisShares keeps a region's shares in its own Redis, one JSON value per
// region under <prefix>{sluice-shares}:<region> (prefix the store's
// redisstore.ClientConfig.KeyPrefix), expiring after the window in which
// restoring them is still useful.
type redisShares struct {
	c      redisKV
	prefix string
	ttl    time.Duration
}

func (r *redisShares) key(region string) string { return r.prefix + "{sluice-shares}:" + region }

func (r *redisShares) LoadShares(ctx context.Context, region string) (globalshare.Saved, error) {
	var s globalshare.Saved
	b, err := r.c.Get(ctx, r.key(region)).Bytes()
	if errors.Is(err, redis.Nil) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(b, &s)
}

func (r *redisShares) SaveShares(ctx context.Context, s globalshare.Saved) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return r.c.Set(ctx, r.key(s.Region), b, r.ttl).Err()
}

// globalPolicy is the global-scope policy whose state is named state: a
// policy id, or a descriptor's state name, under which the rate limit
// service's checks are tracked (quota.PolicyOfState). The coordinator keys
// every share, loan and quota counter by that name.
func (d *Daemon) globalPolicy(state string) (quota.Policy, bool) {
	p, ok := d.reg.Get(quota.PolicyOfState(state))
	return p, ok && p.Scope == quota.ScopeGlobal
}

// globalLimit is L_global of a global-scope policy's state (globalPolicy)
// in units per second: the bucket rate, or count/window for the window
// algorithms.
func (d *Daemon) globalLimit(state string) (float64, bool) {
	p, ok := d.globalPolicy(state)
	if !ok {
		return 0, false
	}
	l := p.Limit()
	if l.Rate > 0 {
		return l.Rate, true
	}
	if l.Window > 0 && l.Count > 0 {
		return l.Count / l.Window.Seconds(), true
	}
	return 0, false
}

// globalBucket reports whether a global policy is a token bucket holding
// at least one second of its rate, whose loans may hand over tokens
// (globalshare.CoreConfig.Bucket); the simulator answers the same for its
// policy.
func (d *Daemon) globalBucket(state string) bool {
	p, ok := d.globalPolicy(state)
	if !ok {
		return false
	}
	l := p.Limit()
	return l.Algorithm == engine.TokenBucket && l.Rate > 0 && l.Burst >= l.Rate
}

// tokenBucketCheck is the check the check path makes of a global token
// bucket for subject, resolved as it resolves it: the policy of the key's
// state name (globalPolicy), its limit after any override in force for
// the subject, the share this region enforces for the key and the
// policy's version; failing closed. ok is false for a subject an override
// exempts, or a policy that is unknown, not global or no longer a token
// bucket.
func (d *Daemon) tokenBucketCheck(key share.Key) (c engine.Check, ok bool) {
	p, found := d.globalPolicy(key.Policy)
	if !found {
		return c, false
	}
	l, _, exempt := d.reg.SubjectLimit(&p, key.Subject)
	if exempt != nil || l.Algorithm != engine.TokenBucket {
		return c, false
	}
	return engine.Check{Policy: key.Policy, Limit: l, Scale: share.Scale(d.shares.Share(key.Policy, key.Subject)),
		Version: uint64(p.Version), OnFailure: engine.FailClosed}, true
}

// spendTokens carries out a token loan's spend (globalshare.Config.Spend)
// on this region's bucket of the key, reached through the limiter as a
// check of the subject would reach it (tokenBucketCheck).
func (d *Daemon) spendTokens(ctx context.Context, sp coordinator.Spend) (int64, error) {
	return sp.Do(ctx, limiterBuckets{d})
}

// depositTokens carries out a token deposit (globalshare.Config.Deposit)
// on this region's bucket of the key, as spendTokens does.
func (d *Daemon) depositTokens(ctx context.Context, dp coordinator.Deposit) error {
	return dp.Do(ctx, limiterBuckets{d})
}

// limiterBuckets is the coordinator's view of this region's global token
// buckets: checks through the limiter as the check path makes them
// (tokenBucketCheck). A subject an override exempts, or a policy no longer
// a global token bucket, has no bucket to take from or put into.
type limiterBuckets struct{ d *Daemon }

func (b limiterBuckets) Level(ctx context.Context, key share.Key) (int64, bool, error) {
	chk, ok := b.d.tokenBucketCheck(key)
	if !ok {
		return 0, false, nil
	}
	read, err := b.d.lim.Check(ctx, engine.Request{Subject: key.Subject, Checks: []engine.Check{chk}})
	if err != nil {
		return 0, false, err
	}
	if read.Degraded || read.Source == limiter.FromDenyCache || read.N != 1 {
		return 0, false, nil
	}
	return read.Results[0].Remaining, true, nil
}

func (b limiterBuckets) Take(ctx context.Context, key share.Key, units int64) (bool, error) {
	chk, ok := b.d.tokenBucketCheck(key)
	if !ok {
		return false, nil
	}
	chk.Cost = units
	took, err := b.d.lim.Check(ctx, engine.Request{Subject: key.Subject, Checks: []engine.Check{chk}})
	if err != nil {
		return false, err
	}
	return took.Allowed && !took.Degraded, nil
}

func (b limiterBuckets) Put(ctx context.Context, key share.Key, units int64) error {
	chk, ok := b.d.tokenBucketCheck(key)
	if !ok {
		return nil
	}
	chk.Cost, chk.Deposit = units, true
	out, err := b.d.lim.Check(ctx, engine.Request{Subject: key.Subject, Checks: []engine.Check{chk}})
	if err != nil {
		return err
	}
	if out.Degraded && out.Err != nil {
		return out.Err
	}
	if out.Degraded {
		return errors.New("the store could not decide")
	}
	return nil
}

// globalQuota is the window of a global quota: a scope: global
// fixed_window policy, enforced as a G-counter across regions rather than
// by shares (see QuotaSource).
func (d *Daemon) globalQuota(state string) (time.Duration, bool) {
	p, ok := d.globalPolicy(state)
	if !ok {
		return 0, false
	}
	l := p.Limit()
	if l.Algorithm != engine.FixedWindow || l.Window <= 0 {
		return 0, false
	}
	return l.Window, true
}

// Gossip returns the daemon's gossip node, nil when single-region.
func (d *Daemon) Gossip() *gossip.Node {
	if d.cl == nil {
		return nil
	}
	return d.cl.g
}

// Coordinator returns the daemon's global-share coordinator, nil when
// single-region.
func (d *Daemon) Coordinator() *globalshare.Coordinator {
	if d.cl == nil {
		return nil
	}
	return d.cl.c
}

// policiesChanged notes a local change to the policies, overrides or API
// keys (admin API) for broadcast to the other regions. It never blocks.
func (d *Daemon) policiesChanged() {
	if d.cl == nil {
		return
	}
	select {
	case d.cl.dirty <- struct{}{}:
	default:
	}
}

// receive runs on the gossip decoder goroutine: keep the newest, return.
func (cl *cluster) receive(u gossip.PolicyUpdate) {
	for {
		select {
		case cl.in <- u:
			return
		default:
		}
		select {
		case old := <-cl.in:
			if old.Version > u.Version {
				u = old
			}
		default:
		}
	}
}

// contentHash is the hash of what the registry holds now. Expired
// overrides drop out of it when they expire, on every node alike.
func (d *Daemon) contentHash() string { return d.heldSet("").Hash() }

// heldSet is what the registry holds now, as the set node origin sends.
func (d *Daemon) heldSet(origin string) policyset.Set {
	return policyset.New(origin, d.reg.List(""), d.reg.Overrides(), d.reg.Snapshot().Keys)
}

// run broadcasts local changes, applies remote ones and keeps the node's
// advertised policy revision and hash current, until ctx ends.
func (d *Daemon) runPolicySync(ctx context.Context) error {
	cl := d.cl
	cl.mu.Lock()
	cl.hash = d.contentHash()
	cl.mu.Unlock()
	cl.g.SetPolicyVersion(0, cl.hash)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-cl.dirty:
			d.broadcastPolicies(ctx)
		case u := <-cl.in:
			d.applyPolicies(ctx, u)
		case <-tick.C:
			// A change that arrived through the region's shared store
			// (Redis pub/sub from a sibling daemon) changes the content;
			// the sibling broadcasts it, this node only advertises it.
			// An override expiring changes it too, on every node alike.
			h := d.contentHash()
			cl.mu.Lock()
			cl.hash = h
			rev := cl.rev
			cl.mu.Unlock()
			cl.g.SetPolicyVersion(rev, h)
		}
	}
}

func (d *Daemon) broadcastPolicies(ctx context.Context) {
	cl := d.cl
	set := d.heldSet(cl.g.Name()) // overrides not expired; empty lists present, so receivers delete theirs
	data, err := set.Encode()
	if err != nil {
		cl.log.Error("policy sync: encode", "err", err)
		return
	}
	h := set.Hash()
	cl.mu.Lock()
	rev := policyset.NextRevision(time.Now(), cl.rev, cl.g.Name())
	cl.rev, cl.hash, cl.from = rev, h, cl.g.Name()
	cl.mu.Unlock()
	cl.g.SetPolicyVersion(rev, h)
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.g.BroadcastPolicy(bctx, gossip.PolicyUpdate{Version: rev, Data: data}); err != nil {
		cl.log.Warn("policy sync: broadcast", "revision", rev, "err", err)
		return
	}
	d.m.policySync.WithLabelValues("sent").Inc()
	cl.log.Info("policy sync: broadcast", "revision", rev, "hash", h, "policies", len(set.Policies), "overrides", len(*set.Overrides), "keys", len(*set.Keys))
}

// applyPolicies makes the local registry hold exactly the policies of u
// (and, when the set carries them, exactly its overrides and API keys) if u
// is newer than the revision in force, writing only what differs
// (policyset.Diff), so applying the same set twice, or on several daemons
// sharing one Redis, changes nothing the second time. A set with anything
// the admin API would refuse is refused whole, before anything changes
// (policyset.Set.Validate).
func (d *Daemon) applyPolicies(ctx context.Context, u gossip.PolicyUpdate) {
	cl := d.cl
	cl.mu.Lock()
	stale := u.Version <= cl.rev
	cl.mu.Unlock()
	if stale {
		return
	}
	got, err := policyset.Decode(u.Data)
	if err != nil {
		d.m.policySync.WithLabelValues("invalid").Inc()
		cl.log.Warn("policy sync: undecodable policy set", "revision", u.Version, "err", err)
		return
	}
	set, err := got.Validate(time.Now())
	if err != nil {
		d.m.policySync.WithLabelValues("invalid").Inc()
		logInvalid(cl.log, u.Version, err)
		return
	}
	who := "gossip:" + set.Origin
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for attempt := 0; attempt < 5; attempt++ {
		if err = d.syncRegistry(actx, who, set); err == nil || !errors.Is(err, redispolicy.ErrConcurrentChange) {
			break
		}
		// A sibling daemon on the same Redis applied it first: reload
		// and compare again.
		if lerr := d.reg.Load(actx); lerr != nil && !errors.Is(lerr, quota.ErrNoSnapshot) {
			err = lerr
			break
		}
	}
	if err != nil {
		d.m.policySync.WithLabelValues("error").Inc()
		cl.log.Error("policy sync: apply", "revision", u.Version, "from", set.Origin, "err", err)
		return
	}
	h := d.contentHash()
	cl.mu.Lock()
	cl.rev, cl.hash, cl.from = u.Version, h, set.Origin
	cl.mu.Unlock()
	cl.g.SetPolicyVersion(u.Version, h)
	d.m.policySync.WithLabelValues("applied").Inc()
	nov, nkeys := -1, -1 // not carried
	if set.Overrides != nil {
		nov = len(*set.Overrides)
	}
	if set.Keys != nil {
		nkeys = len(*set.Keys)
	}
	cl.log.Info("policy sync: applied", "revision", u.Version, "from", set.Origin, "hash", h, "policies", len(set.Policies), "overrides", nov, "keys", nkeys)
}

// logInvalid logs why a received set was refused, naming the entry as
// policyset.InvalidError does (a key entry by its index alone).
func logInvalid(log *slog.Logger, rev uint64, err error) {
	var ie *policyset.InvalidError
	if !errors.As(err, &ie) {
		log.Warn("policy sync: invalid policy set", "revision", rev, "err", err)
		return
	}
	switch ie.Part {
	case policyset.PartKey:
		log.Warn("policy sync: invalid key entry in set", "revision", rev, "entry", ie.Index, "err", ie.Err)
	case policyset.PartPolicies:
		log.Warn("policy sync: invalid policies in set", "revision", rev, "err", ie.Err)
	default:
		log.Warn("policy sync: invalid "+string(ie.Part)+" in set", "revision", rev, string(ie.Part), ie.ID, "err", ie.Err)
	}
}

// syncRegistry writes into the registry the changes that make it hold
// want, a validated set, in the order policyset.Changes prescribes.
func (d *Daemon) syncRegistry(ctx context.Context, who string, want policyset.Set) error {
	c := policyset.Diff(d.heldSet(""), want)
	for _, p := range c.PutPolicies {
		if _, err := d.reg.Put(ctx, who, p, nil); err != nil {
			return fmt.Errorf("policy %s: %w", p.ID, err)
		}
	}
	for _, id := range c.DeletePolicies {
		if err := d.reg.Delete(ctx, who, id, nil); err != nil && !errors.Is(err, quota.ErrNotFound) {
			return fmt.Errorf("policy %s: %w", id, err)
		}
	}
	for _, id := range c.DeleteOverrides {
		if err := d.reg.DeleteOverride(ctx, who, id); err != nil && !errors.Is(err, quota.ErrNotFound) {
			return fmt.Errorf("override %s: %w", id, err)
		}
	}
	for _, o := range c.PutOverrides {
		if _, err := d.reg.PutOverride(ctx, who, o); err != nil {
			if !time.Now().Before(o.ExpiresAt) {
				continue // expired since it was checked: nothing to hold
			}
			return fmt.Errorf("override %s: %w", o.ID, err)
		}
	}
	if len(c.PutKeys)+len(c.DeleteKeys) > 0 {
		return d.reg.SyncKeys(ctx, who, *want.Keys)
	}
	return nil
}

// RegionsStatus is the body of GET /v1/regions.
type RegionsStatus = adminapi.Regions

func (d *Daemon) handleRegions(w http.ResponseWriter, r *http.Request) {
	if d.cl == nil {
		writeJSON(w, http.StatusOK, RegionsStatus{Members: []gossip.Member{}, PolicyRevisions: map[string][]uint64{}, GlobalQuotas: []globalshare.QuotaStat{}})
		return
	}
	st := RegionsStatus{MultiRegion: true, Status: d.cl.c.Status(), Members: d.cl.g.Members(), PolicyRevisions: map[string][]uint64{},
		GlobalQuotas: d.quotaStats()}
	st.IntervalS = st.Interval.Seconds()
	d.cl.mu.Lock()
	st.PolicyRevision, st.PolicyHash = d.cl.rev, d.cl.hash
	d.cl.mu.Unlock()
	hashes := map[string]bool{}
	for _, m := range st.Members {
		if !m.State.Live() {
			continue
		}
		hashes[m.PolicyHash] = true
		if revs := st.PolicyRevisions[m.Region]; !slices.Contains(revs, m.PolicyRevision) {
			st.PolicyRevisions[m.Region] = append(revs, m.PolicyRevision)
		}
	}
	for _, revs := range st.PolicyRevisions {
		slices.Sort(revs)
	}
	st.PolicySkew = len(hashes) > 1
	if st.Regions == nil {
		st.Regions = []globalshare.RegionInfo{}
	}
	writeJSON(w, http.StatusOK, st)
}

// quotaStats is the coordinator's QuotaStats, a descriptor policy's
// states (each descriptor value counted apart) summed into their policy,
// with a zero entry for each global quota in force that holds no
// counters, sorted by policy.
func (d *Daemon) quotaStats() []globalshare.QuotaStat {
	var out []globalshare.QuotaStat
	have := map[string]bool{}
	at := map[string]int{}
	for _, st := range d.cl.c.QuotaStats() {
		st.Policy = quota.PolicyOfState(st.Policy)
		i, ok := at[st.Policy]
		if !ok {
			at[st.Policy] = len(out)
			out = append(out, st)
			have[st.Policy] = true
			continue
		}
		sum := &out[i]
		sum.Counters += st.Counters
		sum.NodeCounters += st.NodeCounters
		sum.Entries += st.Entries
		sum.ApproxBytes += st.ApproxBytes
	}
	for _, p := range d.reg.List("") {
		if _, ok := d.globalQuota(p.ID); ok && !have[p.ID] {
			out = append(out, globalshare.QuotaStat{Policy: p.ID})
		}
	}
	slices.SortFunc(out, func(a, b globalshare.QuotaStat) int { return strings.Compare(a.Policy, b.Policy) })
	return out
}

// globalShares lists the shares of the global policies among ps, leaving
// out the global quotas in qs (counted, not divided).
func (d *Daemon) globalShares(subject string, ps []PolicyResult, qs []GlobalQuota) []GlobalShares {
	if d.cl == nil {
		return nil
	}
	out := []GlobalShares{}
	seen := map[string]bool{}
	for _, q := range qs {
		seen[q.Policy] = true
	}
	for _, p := range ps {
		if p.Scope != quota.ScopeGlobal || seen[p.ID] {
			continue
		}
		seen[p.ID] = true
		l, _ := d.globalLimit(p.ID)
		gs := GlobalShares{Policy: p.ID, LimitPerSec: l, Share: d.cl.c.Share(p.ID, subject)}
		if rs := d.cl.c.RegionShares(p.ID, subject); rs != nil {
			gs.Coordinated, gs.Regions = true, rs
		} else {
			def := d.cl.c.Table().Default()
			gs.Regions = map[string]float64{}
			for r := range d.cl.g.Regions() {
				gs.Regions[r] = def
			}
		}
		out = append(out, gs)
	}
	return out
}
