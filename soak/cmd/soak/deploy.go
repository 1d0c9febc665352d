package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-rl/sluice/internal/loopback"
	"github.com/sluice-rl/sluice/internal/redistest"
)

// The regions of a soak: one per kind of Redis deployment.
const (
	regionSingle   = "single"   // one redis-server; nginx in front of its daemons
	regionSentinel = "sentinel" // a primary, a replica, three Sentinels; RLS clients
	regionCluster  = "cluster"  // three primaries with a replica each
)

var regionNames = []string{regionSingle, regionSentinel, regionCluster}

// daemonsPerRegion is how many sluice serve processes each region runs.
const daemonsPerRegion = 2

// region is one region's Redis and daemons.
type region struct {
	name     string
	store    string
	single   *redistest.Server
	sentinel *redistest.Sentinel
	cluster  *redistest.Cluster
	daemons  []*daemon
	storeMu  sync.Mutex // one store fault at a time
}

// primary returns the Redis process holding the hot subject's keys.
func (r *region) primary() *redistest.Server {
	switch {
	case r.sentinel != nil:
		return r.sentinel.Primary()
	case r.cluster != nil:
		return r.cluster.PrimaryForKey(hotKey)
	}
	return r.single
}

// nodes returns every data node of the region's Redis.
func (r *region) nodes() []*redistest.Server {
	switch {
	case r.sentinel != nil:
		return r.sentinel.Nodes()
	case r.cluster != nil:
		return r.cluster.Nodes()
	}
	return []*redistest.Server{r.single}
}

// hotKey is the Redis key of the hot subject under the api policy, which
// names the cluster shard a cluster fault hits.
const hotKey = "rl:{hot}:api"

// startRedis starts the region's Redis deployment.
func startRedis(tb *harnessTB, r *region) error {
	return try(func() {
		switch r.name {
		case regionSingle:
			r.single = redistest.Start(tb)
			r.store = "redis://" + r.single.Addr()
		case regionSentinel:
			r.sentinel = redistest.StartSentinel(tb)
			r.store = "redis-sentinel://" + redistest.MasterName + "@" + strings.Join(r.sentinel.Addrs(), ",")
		case regionCluster:
			r.cluster = redistest.StartCluster(tb, 3, 1)
			r.store = "redis-cluster://" + strings.Join(r.cluster.Addrs(), ",")
		}
	})
}

// daemon is one sluice serve process, restartable on the same ports.
type daemon struct {
	name, region string
	addr         string // the check and admin API
	gossip       string // where the daemon listens for gossip
	advertise    string // its gossip proxy, which the others dial
	rls          string // "" unless the region serves RLS
	args         []string
	bin, logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// freeAddr is a loopback address for a daemon's listener, free for TCP
// and UDP (gossip) a moment ago, below the kernel's ephemeral range: the
// daemon binds it only once it starts, and a port-0 listener of another
// test (an HTTP/2 server once) would otherwise take it first.
func freeAddr() (string, error) { return loopback.Addr(true) }

// start launches the process; it does not wait for it to be ready.
func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	logf, err := os.OpenFile(d.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	d.cmd, d.done = cmd, done
	return nil
}

// signal sends sig and, for SIGKILL and SIGTERM, waits for the exit.
func (d *daemon) signal(sig syscall.Signal) {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
}

// pid is the running process's, 0 when it has exited.
func (d *daemon) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	select {
	case <-d.done:
		return 0
	default:
		return d.cmd.Process.Pid
	}
}

// waitReady polls /readyz until the daemon is ready (its store warmed
// and reached), within 60 s.
func (d *daemon) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx1, cancel := context.WithTimeout(ctx, time.Second)
		req, _ := http.NewRequestWithContext(ctx1, "GET", "http://"+d.addr+"/readyz", nil)
		res, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready within 60 s: %v; its log ends: %s", d.name, err, d.logTail(1024))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logTail is the last n bytes of the daemon's log, where a daemon that
// could not bind its address says so.
func (d *daemon) logTail(n int64) string {
	f, err := os.Open(d.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(bytes.TrimSpace(b))
}

// deployment is the whole soak deployment.
type deployment struct {
	dir, bin, token string
	regions         []*region
	nginx           *exec.Cmd
	nginxAddr       string
	nginxLog        string // the access log soak.MarkGatewayDegraded reads
	backend         *http.Server
	proxy           *gossipProxy
}

func (dp *deployment) region(name string) *region {
	for _, r := range dp.regions {
		if r.name == name {
			return r
		}
	}
	return nil
}

func (dp *deployment) daemons() []*daemon {
	var out []*daemon
	for _, r := range dp.regions {
		out = append(out, r.daemons...)
	}
	return out
}

// newDaemons lays out the daemons of every region: each on its own ports,
// joined into one gossip cluster through the seeds the Helm chart gives a
// daemon (seeds).
func (dp *deployment) newDaemons(policies, envoy string, gossipInterval time.Duration, preset string) error {
	for _, r := range dp.regions {
		for i := 0; i < daemonsPerRegion; i++ {
			d := &daemon{name: fmt.Sprintf("%s-%d", r.name, i), region: r.name, bin: dp.bin}
			var err error
			if d.addr, err = freeAddr(); err != nil {
				return err
			}
			if d.gossip, err = freeAddr(); err != nil {
				return err
			}
			if d.advertise, err = freeAddr(); err != nil {
				return err
			}
			d.logPath = filepath.Join(dp.dir, d.name+".log")
			d.args = []string{"serve", "--listen", d.addr, "--store", r.store, "--policies", policies,
				"--admin-token-file", filepath.Join(dp.dir, "admin-token"), "--trusted-proxies", "127.0.0.1/32",
				"--region", r.name, "--node", d.name, "--dev", "--gossip-listen", d.gossip, "--gossip-advertise", d.advertise,
				"--gossip-preset", preset, "--gossip-interval", gossipInterval.String(), "--log-level", "warn"}
			// Every daemon loads the Envoy file, since policies are shared
			// across the cluster; the Sentinel region serves RLS.
			d.args = append(d.args, "--envoy-config", envoy)
			if r.name == regionSentinel {
				if d.rls, err = freeAddr(); err != nil {
					return err
				}
				d.args = append(d.args, "--rls-listen", d.rls)
			}
			r.daemons = append(r.daemons, d)
		}
	}
	all := dp.daemons()
	for _, d := range all {
		if join := seeds(all, d); len(join) > 0 {
			d.args = append(d.args, "--join", strings.Join(join, ","))
		}
	}
	return nil
}

// seeds are the gossip addresses d joins, as the Helm chart sets them: the
// other daemons of its region (the chart's headless Service) and the first
// daemon of every other region (region.join). With one seed for the whole
// deployment, two regions rolled at once left the daemons restarted in
// them knowing only each other: they turned the third region's contact
// pings away as from no member, and it found both rolled regions out of
// contact.
func seeds(all []*daemon, d *daemon) []string {
	var out []string
	first := map[string]bool{}
	for _, o := range all {
		lead := !first[o.region]
		first[o.region] = true
		if o != d && (o.region == d.region || lead) {
			out = append(out, o.advertise)
		}
	}
	return out
}

// startNginx renders the shipped deploy/nginx/sluice.conf in front of the
// single region's daemons, as the gateway test does (its placeholders
// replaced, nothing else), and starts nginx.
func (dp *deployment) startNginx(repo string, r *region) error {
	raw, err := os.ReadFile(filepath.Join(repo, "deploy", "nginx", "sluice.conf"))
	if err != nil {
		return err
	}
	if dp.nginxAddr, err = freeAddr(); err != nil {
		return err
	}
	backend, err := dp.startBackend()
	if err != nil {
		return err
	}
	var servers []string
	for _, d := range r.daemons {
		servers = append(servers, "server "+d.addr+";")
	}
	conf := string(raw)
	for _, p := range [][2]string{{"server 127.0.0.1:8080;", strings.Join(servers, "\n    ")},
		{"listen 80;", "listen " + dp.nginxAddr + ";"}, {"http://backend", "http://" + backend}} {
		if !strings.Contains(conf, p[0]) {
			return fmt.Errorf("deploy/nginx/sluice.conf lacks the placeholder %q", p[0])
		}
		conf = strings.ReplaceAll(conf, p[0], p[1])
	}
	dir := filepath.Join(dp.dir, "nginx")
	for _, sub := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	main := fmt.Sprintf(`%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/logs/error.log warn;
events { worker_connections 1024; }
http {
  # One line per request: its URI and whether Sluice decided it without
  # its store (the shipped file's $sluice_degraded), which the checker
  # reads back (soak.MarkGatewayDegraded).
  log_format soak '$request_uri $sluice_degraded';
  access_log %[2]s/logs/access.log soak;
  client_body_temp_path %[2]s/tmp/body;
  proxy_temp_path %[2]s/tmp/proxy;
  fastcgi_temp_path %[2]s/tmp/fastcgi;
  uwsgi_temp_path %[2]s/tmp/uwsgi;
  scgi_temp_path %[2]s/tmp/scgi;
  include %[2]s/sluice.conf;
}
`, user, dir)
	if err := os.WriteFile(filepath.Join(dir, "sluice.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(main), 0o644); err != nil {
		return err
	}
	dp.nginxLog = filepath.Join(dir, "logs", "access.log")
	dp.nginx = exec.Command("/usr/sbin/nginx", "-c", filepath.Join(dir, "nginx.conf"), "-p", dir, "-g", "daemon off;")
	dp.nginx.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := dp.nginx.Start(); err != nil {
		return fmt.Errorf("nginx: %w", err)
	}
	go func() { _ = dp.nginx.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", dp.nginxAddr)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(filepath.Join(dir, "logs", "error.log"))
			return fmt.Errorf("nginx did not listen on %s: %s", dp.nginxAddr, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startBackend is the API nginx protects: it answers 200 to everything.
func (dp *deployment) startBackend() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	dp.backend = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = dp.backend.Serve(l) }()
	return l.Addr().String(), nil
}

// stop ends every process the deployment started but Redis (the
// harnessTB's cleanups end those).
func (dp *deployment) stop() {
	var wg sync.WaitGroup
	for _, d := range dp.daemons() {
		wg.Add(1)
		go func() { defer wg.Done(); d.signal(syscall.SIGKILL) }()
	}
	wg.Wait()
	if dp.nginx != nil && dp.nginx.Process != nil {
		_ = syscall.Kill(-dp.nginx.Process.Pid, syscall.SIGKILL)
	}
	if dp.backend != nil {
		_ = dp.backend.Close()
	}
}

var errStopped = errors.New("stopped")
