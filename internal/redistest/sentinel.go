package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name under which a Sentinel deployment's Sentinels
// monitor its primary.
const MasterName = "sluice"

const (
	// sentinelQuorum is how many Sentinels must agree that the primary is
	// down before one of them fails it over.
	sentinelQuorum = 2
	// sentinelCount is how many Sentinels StartSentinel runs: three, the
	// smallest number in which a quorum of two survives losing one.
	sentinelCount = 3
	// sentinelDownAfter is how long, in ms, a primary must fail to answer
	// before a Sentinel considers it down. Redis' default is 30 s.
	sentinelDownAfter = "1000"
	// sentinelFailoverTimeout is the failover-timeout, in ms. Besides
	// bounding a failover, it sets how long a Sentinel waits before it
	// retries an election that nobody won (twice this), so it is short.
	sentinelFailoverTimeout = "3000"
	// sentinelTimeout bounds forming the deployment, and each failover.
	sentinelTimeout = 30 * time.Second
)

// Sentinel is a Redis Sentinel deployment on loopback ports: a primary, one
// replica and three Sentinels monitoring them under MasterName with a quorum
// of two. t.Cleanup kills every process.
type Sentinel struct {
	t         testing.TB
	data      []*Server // the primary and its replica, in start order
	sentinels []*Server
}

// StartSentinel starts a primary, a replica of it and three Sentinels, and
// returns once every Sentinel names the primary as MasterName's master,
// knows the replica and the two other Sentinels, and the replica is in sync.
// Nodes()[0] starts as the primary. A killed primary is failed over within a
// few seconds (down-after-milliseconds 1000). It skips under -short and fails
// if redis-server is missing.
//
// WithTLS starts the data nodes and the Sentinels on TLS only (replication
// and the Sentinels' connections too); WithAuth makes the data nodes
// require credentials, which the Sentinels are given, and
// WithSentinelAuth the Sentinels.
func StartSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	skipShort(t)
	bin := lookPath(t, "redis-server")
	pp := &portPicker{}
	pick := func() (int, error) { return pp.pick(false) }
	began := time.Now()
	cfg := newConfig(opts)

	s := &Sentinel{t: t}
	primary := startServerWith(t, bin, "", cfg.dataArgs("--repl-diskless-sync-delay", "0"), &cfg, false, pick)
	replica := startServerWith(t, bin, "", cfg.dataArgs(
		"--repl-diskless-sync-delay", "0",
		"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()),
	), &cfg, false, pick)
	s.data = []*Server{primary, replica}

	conf := sentinelConf(&cfg, primary.Port())
	args := append([]string{"--sentinel"}, cfg.tlsArgs()...)
	args = append(args, authArgs(cfg.sentinelUser, cfg.sentinelPass)...)
	for range sentinelCount {
		s.sentinels = append(s.sentinels, startServerWith(t, bin, conf, args, &cfg, true, pick))
	}

	deadline := time.Now().Add(sentinelTimeout)
	for {
		err := s.formed(primary)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel deployment not ready after %v: %v\n%s", sentinelTimeout, err, s.describe())
		}
		<-time.After(pollInterval)
	}
	t.Logf("redistest: sentinel deployment (primary %s, replica %s, sentinels %s) ready in %v",
		primary.Addr(), replica.Addr(), strings.Join(s.Addrs(), ","), time.Since(began).Round(time.Millisecond))
	return s
}

// sentinelConf is a Sentinel's configuration file: the primary at port to
// monitor, with the data nodes' credentials, and the credentials the
// Sentinels give each other.
func sentinelConf(cfg *config, port int) string {
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d %[3]d\n"+
		"sentinel down-after-milliseconds %[1]s %[4]s\n"+
		"sentinel failover-timeout %[1]s %[5]s\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		MasterName, port, sentinelQuorum, sentinelDownAfter, sentinelFailoverTimeout)
	if cfg.pass != "" {
		if cfg.user != "" {
			conf += fmt.Sprintf("sentinel auth-user %s %s\n", MasterName, cfg.user)
		}
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", MasterName, cfg.pass)
	}
	if cfg.sentinelPass != "" {
		if cfg.sentinelUser != "" {
			conf += "sentinel sentinel-user " + cfg.sentinelUser + "\n"
		}
		conf += "sentinel sentinel-pass " + cfg.sentinelPass + "\n"
	}
	return conf
}

// formed returns nil once every Sentinel agrees that primary is the master,
// up, with every other data node as a replica and every other Sentinel
// known, and every replica's link to it is up.
func (s *Sentinel) formed(primary *Server) error {
	for _, sn := range s.sentinels {
		m, err := sentinelMaster(sn)
		if err != nil {
			return err
		}
		switch {
		case m["port"] != strconv.Itoa(primary.Port()):
			return fmt.Errorf("sentinel %s names port %s as master, want %d", sn.Addr(), m["port"], primary.Port())
		case m["flags"] != "master":
			return fmt.Errorf("sentinel %s sees the master with flags %s", sn.Addr(), m["flags"])
		case m["num-slaves"] != strconv.Itoa(len(s.data)-1):
			return fmt.Errorf("sentinel %s knows %s replicas, want %d", sn.Addr(), m["num-slaves"], len(s.data)-1)
		case m["num-other-sentinels"] != strconv.Itoa(len(s.sentinels)-1):
			return fmt.Errorf("sentinel %s knows %s other sentinels, want %d", sn.Addr(), m["num-other-sentinels"], len(s.sentinels)-1)
		}
	}
	for _, d := range s.data {
		if d == primary || !d.Running() {
			continue
		}
		role, err := d.do(probeTimeout, "ROLE")
		if err != nil {
			return fmt.Errorf("%s: ROLE: %v", d.Addr(), err)
		}
		r, _ := role.([]any)
		if len(r) < 4 || r[0] != "slave" || r[2] != int64(primary.Port()) || r[3] != "connected" {
			return fmt.Errorf("%s: ROLE is %v, want a replica of %s, connected", d.Addr(), role, primary.Addr())
		}
	}
	return nil
}

// sentinelMaster returns SENTINEL MASTER MasterName from sn as a map.
func sentinelMaster(sn *Server) (map[string]string, error) {
	v, err := sn.do(probeTimeout, "SENTINEL", "MASTER", MasterName)
	if err != nil {
		return nil, fmt.Errorf("sentinel %s: SENTINEL MASTER: %v", sn.Addr(), err)
	}
	kv, _ := v.([]any)
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		val, _ := kv[i+1].(string)
		m[k] = val
	}
	return m, nil
}

// masterPort asks sn which port MasterName's master is on.
func masterPort(sn *Server) (int, error) {
	v, err := sn.do(probeTimeout, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
	if err != nil {
		return 0, fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME: %v", sn.Addr(), err)
	}
	a, _ := v.([]any)
	if len(a) != 2 {
		return 0, fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME replied %v", sn.Addr(), v)
	}
	p, _ := a[1].(string)
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0, fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME replied %v", sn.Addr(), v)
	}
	return port, nil
}

// describe returns each Sentinel's view of the master and each data node's
// ROLE, for a failure message.
func (s *Sentinel) describe() string {
	var b strings.Builder
	for _, sn := range s.sentinels {
		m, err := sentinelMaster(sn)
		if err != nil {
			fmt.Fprintf(&b, "%v\n", err)
			continue
		}
		fmt.Fprintf(&b, "sentinel %s: master %s:%s flags=%s replicas=%s other-sentinels=%s\n", sn.Addr(),
			m["ip"], m["port"], m["flags"], m["num-slaves"], m["num-other-sentinels"])
	}
	for _, d := range s.data {
		role, err := d.do(probeTimeout, "ROLE")
		fmt.Fprintf(&b, "%s: ROLE %v %v\n", d.Addr(), role, err)
	}
	return b.String()
}

// Addrs returns the Sentinels' addresses, which clients are given.
func (s *Sentinel) Addrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sn := range s.sentinels {
		addrs[i] = sn.Addr()
	}
	return addrs
}

// Nodes returns the data nodes, the primary first as started; Kill, Restart
// and Pause work on each. The slice is a copy.
func (s *Sentinel) Nodes() []*Server { return append([]*Server(nil), s.data...) }

// Sentinels returns the Sentinel processes. The slice is a copy.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// Client returns a go-redis failover client for MasterName through the
// Sentinels, closed by t.Cleanup. Like Server.Client it sets
// ContextTimeoutEnabled.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	o := &redis.FailoverOptions{
		MasterName: MasterName, SentinelAddrs: s.Addrs(), ContextTimeoutEnabled: true, TLSConfig: s.data[0].tls,
	}
	o.Username, o.Password = s.data[0].credentials()
	o.SentinelUsername, o.SentinelPassword = s.sentinels[0].credentials()
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Primary returns the data node that the first running Sentinel names as
// master.
func (s *Sentinel) Primary() *Server {
	s.t.Helper()
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		port, err := masterPort(sn)
		if err != nil {
			s.t.Fatalf("redistest: Primary: %v", err)
		}
		p := s.byPort(port)
		if p == nil {
			s.t.Fatalf("redistest: Primary: sentinel %s names port %d, which is not in this deployment", sn.Addr(), port)
		}
		return p
	}
	s.t.Fatalf("redistest: Primary: no sentinel is running")
	return nil
}

// KillPrimaryAndWaitFailover kills the primary and returns once every
// running Sentinel names the replica as the master and the replica answers
// ROLE as master, or fails the test after 30 s. It logs how long that took.
// The killed node stays known to the Sentinels; restarted, it rejoins as a
// replica.
func (s *Sentinel) KillPrimaryAndWaitFailover() (killed, promoted *Server) {
	s.t.Helper()
	killed = s.Primary()
	killed.Kill()
	began := time.Now()
	deadline := time.Now().Add(sentinelTimeout)
	for {
		var err error
		promoted, err = s.failedOver(killed)
		if err == nil {
			s.t.Logf("redistest: sentinels failed %s over to %s in %v",
				killed.Addr(), promoted.Addr(), time.Since(began).Round(time.Millisecond))
			return killed, promoted
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: %s did not fail over within %v: %v\n%s", killed.Addr(), sentinelTimeout, err, s.describe())
		}
		<-time.After(pollInterval)
	}
}

// failedOver returns the new primary if every running Sentinel names the
// same node other than killed, and that node answers ROLE as master.
func (s *Sentinel) failedOver(killed *Server) (*Server, error) {
	owner := 0
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		port, err := masterPort(sn)
		if err != nil {
			return nil, err
		}
		if port == killed.Port() {
			return nil, fmt.Errorf("sentinel %s still names %s", sn.Addr(), killed.Addr())
		}
		if owner != 0 && port != owner {
			return nil, fmt.Errorf("sentinels disagree on the master: port %d and %d", owner, port)
		}
		owner = port
	}
	p := s.byPort(owner)
	if p == nil {
		return nil, fmt.Errorf("the sentinels name port %d, which is not in this deployment", owner)
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

func (s *Sentinel) byPort(port int) *Server {
	for _, d := range s.data {
		if d.port == port {
			return d
		}
	}
	return nil
}
