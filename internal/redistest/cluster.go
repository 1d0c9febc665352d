package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testlog"

	"github.com/redis/go-redis/v9"
)

const (
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds cluster creation, and each failover.
	clusterTimeout = 30 * time.Second
)

const (
	// startNodeTimeout is the cluster-node-timeout while the cluster forms,
	// in ms. It is also how long a node keeps trying a handshake, so it is
	// generous, for a loaded machine.
	startNodeTimeout = "5000"
	// runNodeTimeout is the cluster-node-timeout once the cluster has
	// formed, in ms: short, so a killed primary fails over in a few seconds.
	runNodeTimeout = "1000"
	// remeetInterval is how long create lets a CLUSTER MEET work before
	// repeating it.
	remeetInterval = 2 * time.Second
)

// clusterArgs configure a node for tests: a node timeout for forming the
// cluster (StartCluster shortens it afterwards), no delay before a replica's
// first full sync, and no replica migration to move replicas away from the
// primary a test expects them under.
var clusterArgs = []string{
	"--cluster-enabled", "yes",
	"--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", startNodeTimeout,
	"--cluster-allow-replica-migration", "no",
	"--repl-diskless-sync-delay", "0",
}

// Cluster is a Redis Cluster of redis-server processes on loopback ports,
// created with redis-cli --cluster create. t.Cleanup kills every node.
type Cluster struct {
	t         testing.TB
	nodes     []*Server
	primaries int
	replicas  int // per primary
}

// StartCluster starts primaries*(1+replicasPerPrimary) nodes, joins them into
// a cluster with redis-cli, and returns once every node reports
// cluster_state:ok with all 16384 slots covered and every replica is attached
// to its primary. Redis requires primaries >= 3. Nodes()[:primaries] start as
// the primaries. It skips under -short and fails if redis-server or redis-cli
// is missing.
//
// WithTLS starts every node on TLS only, its cluster bus included
// (tls-cluster yes); WithAuth makes them require credentials. WithArgs
// adds arguments to every node.
func StartCluster(t testing.TB, primaries, replicasPerPrimary int, opts ...Option) *Cluster {
	t.Helper()
	skipShort(t)
	if primaries < 3 || replicasPerPrimary < 0 {
		t.Fatalf("redistest: StartCluster(%d, %d): Redis Cluster needs at least 3 primaries and no negative replica count",
			primaries, replicasPerPrimary)
	}
	bin := lookPath(t, "redis-server")
	cli := lookPath(t, "redis-cli")

	c := &Cluster{t: t, primaries: primaries, replicas: replicasPerPrimary}
	cfg := newConfig(opts)
	args := slices.Clone(clusterArgs)
	if cfg.tls != nil {
		args = append(args, "--tls-cluster", "yes")
	}
	args = cfg.dataArgs(args...)
	pp := &portPicker{}
	for range primaries * (1 + replicasPerPrimary) {
		c.nodes = append(c.nodes, startServerWith(t, bin, "", args, &cfg, false, func() (int, error) { return pp.pick(true) }))
	}

	began := time.Now()
	c.create(cli, cliArgs(&cfg))
	created := time.Now()

	deadline := time.Now().Add(clusterTimeout)
	for {
		err := c.formed()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster not ready after %v: %v\n%s", clusterTimeout, err, c.describe())
		}
		<-time.After(pollInterval)
	}
	for _, s := range c.nodes {
		if _, err := s.doString(probeTimeout, "CONFIG", "SET", "cluster-node-timeout", runNodeTimeout); err != nil {
			t.Fatalf("redistest: %s: CONFIG SET cluster-node-timeout: %v", s.Addr(), err)
		}
		// Restart passes the arguments again; the later value wins.
		s.args = slices.Concat(s.args, []string{"--cluster-node-timeout", runNodeTimeout})
	}
	t.Logf("redistest: cluster of %d nodes: redis-cli took %v, replicas attached %v later",
		len(c.nodes), created.Sub(began).Round(time.Millisecond), time.Since(created).Round(time.Millisecond))
	return c
}

// create runs redis-cli --cluster create. redis-cli sends each node a
// single CLUSTER MEET and then waits, without a deadline, until all nodes
// agree; if a handshake is lost (a node stalled past the handshake timeout
// on a loaded machine) it would wait forever. So once redis-cli is waiting,
// create repeats the MEET for any node that does not yet know every other.
func (c *Cluster) create(cli string, conn []string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append(slices.Clone(conn), "--cluster", "create")
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(c.replicas), "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	var out testlog.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("redistest: redis-cli: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var lastMeet time.Time // zero until redis-cli starts waiting
	for {
		select {
		case err := <-done:
			if err != nil && ctx.Err() != nil {
				err = fmt.Errorf("still running after %v: %w", clusterTimeout, err)
			}
			if err != nil {
				c.t.Fatalf("redistest: redis-cli %s: %v\n%s\n%s", strings.Join(args, " "), err, out.String(), c.describe())
			}
			return
		case <-time.After(remeetInterval / 4):
		}
		switch {
		case lastMeet.IsZero():
			if strings.Contains(out.String(), "Waiting for the cluster to join") {
				lastMeet = time.Now()
			}
		case time.Since(lastMeet) >= remeetInterval:
			c.remeet()
			lastMeet = time.Now()
		}
	}
}

// cliArgs are redis-cli's arguments to reach servers of cfg: TLS with its
// CA and certificate, and its credentials.
func cliArgs(cfg *config) []string {
	var args []string
	if cfg.tls != nil {
		args = append(args, "--tls", "--cacert", cfg.tls.CAFile, "--cert", cfg.tls.CertFile, "--key", cfg.tls.KeyFile)
	}
	if cfg.pass != "" {
		if cfg.user != "" {
			args = append(args, "--user", cfg.user)
		}
		args = append(args, "--pass", cfg.pass, "--no-auth-warning")
	}
	return args
}

// remeet sends CLUSTER MEET for the first node to each node that does not
// know all the others yet. Errors are ignored: it is only a nudge, and
// create's caller reports a cluster that never forms.
func (c *Cluster) remeet() {
	first := c.nodes[0]
	for _, s := range c.nodes[1:] {
		nodes, err := s.doString(probeTimeout, "CLUSTER", "NODES")
		if err != nil {
			continue
		}
		known := 0
		for line := range strings.Lines(nodes) {
			if f := strings.Fields(line); len(f) >= 3 && !strings.Contains(f[2], "handshake") {
				known++
			}
		}
		if known < len(c.nodes) {
			_, _ = s.doString(probeTimeout, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(first.port))
		}
	}
}

// formed returns nil once every node agrees the cluster is whole: state ok,
// all slots served, every node known and healthy, primaries*replicas replicas
// each linked to its primary.
func (c *Cluster) formed() error {
	for _, s := range c.nodes {
		if err := clusterOK(s, len(c.nodes)); err != nil {
			return err
		}
		nodes, err := s.doString(probeTimeout, "CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %v", s.Addr(), err)
		}
		replicasOf := make(map[string]int) // primary id -> replicas
		var primaries []string
		for line := range strings.Lines(nodes) {
			f := strings.Fields(line)
			if len(f) < 8 {
				continue
			}
			flags := f[2]
			switch {
			case strings.Contains(flags, "fail") || strings.Contains(flags, "handshake") || strings.Contains(flags, "noaddr"):
				return fmt.Errorf("%s sees node %s with flags %s", s.Addr(), f[1], flags)
			case strings.Contains(flags, "master"):
				primaries = append(primaries, f[0])
			case strings.Contains(flags, "slave"):
				replicasOf[f[3]]++
			}
		}
		if len(primaries) != c.primaries {
			return fmt.Errorf("%s sees %d primaries, want %d", s.Addr(), len(primaries), c.primaries)
		}
		for _, id := range primaries {
			if replicasOf[id] != c.replicas {
				return fmt.Errorf("%s sees %d replicas of %s, want %d", s.Addr(), replicasOf[id], id, c.replicas)
			}
		}
		role, err := s.do(probeTimeout, "ROLE")
		if err != nil {
			return fmt.Errorf("%s: ROLE: %v", s.Addr(), err)
		}
		if r, _ := role.([]any); len(r) >= 4 && r[0] == "slave" && r[3] != "connected" {
			return fmt.Errorf("%s: replica link is %v", s.Addr(), r[3])
		}
	}
	return nil
}

// clusterOK returns nil if s reports cluster_state:ok, all slots assigned
// and ok, and knows want nodes (0: any number).
func clusterOK(s *Server, want int) error {
	info, err := s.doString(probeTimeout, "CLUSTER", "INFO")
	if err != nil {
		return fmt.Errorf("%s: CLUSTER INFO: %v", s.Addr(), err)
	}
	fields := make(map[string]string)
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		fields[k] = v
	}
	all := strconv.Itoa(clusterSlots)
	switch {
	case fields["cluster_state"] != "ok":
		return fmt.Errorf("%s: cluster_state:%s", s.Addr(), fields["cluster_state"])
	case fields["cluster_slots_assigned"] != all || fields["cluster_slots_ok"] != all:
		return fmt.Errorf("%s: cluster_slots_assigned:%s cluster_slots_ok:%s", s.Addr(),
			fields["cluster_slots_assigned"], fields["cluster_slots_ok"])
	case want > 0 && fields["cluster_known_nodes"] != strconv.Itoa(want):
		return fmt.Errorf("%s: cluster_known_nodes:%s, want %d", s.Addr(), fields["cluster_known_nodes"], want)
	}
	return nil
}

// describe returns each node's CLUSTER NODES, for a failure message.
func (c *Cluster) describe() string {
	var b strings.Builder
	for _, s := range c.nodes {
		nodes, err := s.doString(probeTimeout, "CLUSTER", "NODES")
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", s.Addr(), err)
			continue
		}
		fmt.Fprintf(&b, "CLUSTER NODES from %s:\n%s", s.Addr(), nodes)
	}
	return b.String()
}

// Addrs returns every node's address, in the order of Nodes, including nodes
// that have been killed.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Nodes returns the cluster's servers; Kill, Restart and Pause work on each.
// The slice is a copy.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// Client returns a go-redis cluster client seeded with every node's address,
// closed by t.Cleanup. Like Server.Client it sets ContextTimeoutEnabled.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true, TLSConfig: c.nodes[0].tls}
	o.Username, o.Password = c.nodes[0].credentials()
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// PrimaryForKey returns the node that serves key's hash slot as primary,
// according to the first running node.
func (c *Cluster) PrimaryForKey(key string) *Server {
	c.t.Helper()
	s, err := c.live()
	if err != nil {
		c.t.Fatalf("redistest: PrimaryForKey(%q): %v", key, err)
	}
	slot, err := keySlot(s, key)
	if err != nil {
		c.t.Fatalf("redistest: PrimaryForKey(%q): %v", key, err)
	}
	port, err := slotOwner(s, slot)
	if err != nil {
		c.t.Fatalf("redistest: PrimaryForKey(%q): %v", key, err)
	}
	p := c.byPort(port)
	if p == nil {
		c.t.Fatalf("redistest: PrimaryForKey(%q): slot %d is served by port %d, which is not in this cluster", key, slot, port)
	}
	return p
}

// KillPrimaryAndWaitFailover kills the primary serving key's slot and
// returns once a replica serves that slot as primary in every running node's
// view and every running node reports cluster_state:ok, or fails the test
// after 30 s. It needs replicasPerPrimary >= 1.
func (c *Cluster) KillPrimaryAndWaitFailover(key string) (killed, promoted *Server) {
	c.t.Helper()
	if c.replicas < 1 {
		c.t.Fatalf("redistest: KillPrimaryAndWaitFailover needs a cluster with replicas")
	}
	s, err := c.live()
	if err != nil {
		c.t.Fatalf("redistest: KillPrimaryAndWaitFailover(%q): %v", key, err)
	}
	slot, err := keySlot(s, key)
	if err != nil {
		c.t.Fatalf("redistest: KillPrimaryAndWaitFailover(%q): %v", key, err)
	}
	killed = c.PrimaryForKey(key)
	killed.Kill()
	began := time.Now()

	deadline := time.Now().Add(clusterTimeout)
	for {
		promoted, err = c.failedOver(slot, killed)
		if err == nil {
			c.t.Logf("redistest: slot %d failed over from %s to %s in %v",
				slot, killed.Addr(), promoted.Addr(), time.Since(began).Round(time.Millisecond))
			return killed, promoted
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("redistest: slot %d did not fail over from %s within %v: %v\n%s",
				slot, killed.Addr(), clusterTimeout, err, c.describe())
		}
		<-time.After(pollInterval)
	}
}

// failedOver returns the node serving slot if every running node reports
// cluster_state:ok and agrees that a node other than killed, which itself
// answers ROLE as master, serves it.
func (c *Cluster) failedOver(slot int, killed *Server) (*Server, error) {
	owner := 0
	for _, s := range c.nodes {
		if !s.Running() {
			continue
		}
		if err := clusterOK(s, 0); err != nil {
			return nil, err
		}
		port, err := slotOwner(s, slot)
		if err != nil {
			return nil, err
		}
		if port == killed.port {
			return nil, fmt.Errorf("%s still routes slot %d to %s", s.Addr(), slot, killed.Addr())
		}
		if owner != 0 && port != owner {
			return nil, fmt.Errorf("nodes disagree on slot %d: port %d and %d", slot, owner, port)
		}
		owner = port
	}
	p := c.byPort(owner)
	if p == nil {
		return nil, fmt.Errorf("slot %d is served by port %d, which is not in this cluster", slot, owner)
	}
	role, err := p.do(probeTimeout, "ROLE")
	if err != nil {
		return nil, fmt.Errorf("%s: ROLE: %v", p.Addr(), err)
	}
	if r, _ := role.([]any); len(r) == 0 || r[0] != "master" {
		return nil, fmt.Errorf("%s: ROLE is %v, want master", p.Addr(), role)
	}
	return p, nil
}

func (c *Cluster) live() (*Server, error) {
	for _, s := range c.nodes {
		if s.Running() {
			return s, nil
		}
	}
	return nil, errors.New("no node is running")
}

func (c *Cluster) byPort(port int) *Server {
	for _, s := range c.nodes {
		if s.port == port {
			return s
		}
	}
	return nil
}

func keySlot(s *Server, key string) (int, error) {
	v, err := s.do(probeTimeout, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		return 0, fmt.Errorf("%s: CLUSTER KEYSLOT: %v", s.Addr(), err)
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%s: CLUSTER KEYSLOT replied %v", s.Addr(), v)
	}
	return int(n), nil
}

// slotOwner returns the port of the primary that s's CLUSTER SLOTS names for
// slot. Each entry is [start, end, [ip, port, id, ...], replicas...].
func slotOwner(s *Server, slot int) (int, error) {
	v, err := s.do(probeTimeout, "CLUSTER", "SLOTS")
	if err != nil {
		return 0, fmt.Errorf("%s: CLUSTER SLOTS: %v", s.Addr(), err)
	}
	ranges, _ := v.([]any)
	for _, r := range ranges {
		e, _ := r.([]any)
		if len(e) < 3 {
			continue
		}
		start, _ := e[0].(int64)
		end, _ := e[1].(int64)
		primary, _ := e[2].([]any)
		if int64(slot) < start || int64(slot) > end || len(primary) < 2 {
			continue
		}
		port, ok := primary[1].(int64)
		if !ok {
			return 0, fmt.Errorf("%s: CLUSTER SLOTS entry %v", s.Addr(), e)
		}
		return int(port), nil
	}
	return 0, fmt.Errorf("%s: no primary serves slot %d", s.Addr(), slot)
}
