package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// inForce is the bound within which a change to watched configuration
// must be in force.
const inForce = 2 * time.Second

// rlsAddr is the address the daemon's rate limit service listens on, from
// its log.
func rlsAddr(t *testing.T, d *daemon) string {
	t.Helper()
	var addr string
	testwait.For(t, 10*time.Second, "the rate limit service's address in the log", func() bool {
		for _, line := range strings.Split(d.log(), "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &m) == nil && m.Msg == "rate limit service listening" {
				addr = m.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// rlsCaller asks one descriptor of one domain, with one hit.
type rlsCaller struct {
	t *testing.T
	c rlsv3.RateLimitServiceClient
}

func (r rlsCaller) ask(ctx context.Context, domain string, kv ...string) (*rlsv3.RateLimitResponse, error) {
	var es []*rlv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return r.c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{{Entries: es}}})
}

// limit is the requests_per_unit the descriptor is limited to, 0 when no
// limit applies to it.
func (r rlsCaller) limit(domain string, kv ...string) uint32 {
	r.t.Helper()
	resp, err := r.ask(r.t.Context(), domain, kv...)
	if err != nil {
		r.t.Fatalf("ShouldRateLimit(%s %v) = %v", domain, kv, err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// load sends ShouldRateLimit calls from a few goroutines until stopped,
// counting the calls and those answered with an error.
type load struct {
	calls, errs atomic.Int64
	firstErr    atomic.Pointer[string]
	stop        context.CancelFunc
	wg          sync.WaitGroup
}

func startLoad(t *testing.T, r rlsCaller, asks [][]string) *load {
	ctx, stop := context.WithCancel(t.Context())
	l := &load{stop: stop}
	for _, a := range asks {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				_, err := r.ask(ctx, a[0], a[1:]...)
				if ctx.Err() != nil {
					return
				}
				l.calls.Add(1)
				if err != nil {
					l.errs.Add(1)
					s := err.Error()
					l.firstErr.CompareAndSwap(nil, &s)
				}
			}
		}()
	}
	return l
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	l.stop()
	l.wg.Wait()
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d of %d calls under load answered with an error, the first: %s", n, l.calls.Load(), *l.firstErr.Load())
	}
	if l.calls.Load() == 0 {
		t.Error("no call was made under load")
	}
	t.Logf("%d ShouldRateLimit calls under load, %d errors", l.calls.Load(), l.errs.Load())
}

func envoyYAML(domain string, limits ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := 0; i+2 < len(limits); i += 3 {
		fmt.Fprintf(&b, "  - key: %s\n    value: %s\n    rate_limit:\n      unit: hour\n      requests_per_unit: %s\n", limits[i], limits[i+1], limits[i+2])
	}
	return b.String()
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// swapData points the Kubernetes ConfigMap layout of dir at version v,
// as the kubelet does: ..v holds the files, ..data links to it, replaced
// by a rename, and each file is a link through ..data.
func swapData(t *testing.T, dir, v string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		mustWrite(t, filepath.Join(dir, v, name), content)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(v, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestServeWatchesEnvoyConfig changes a watched runtime directory while
// clients call ShouldRateLimit: an edit, a create, a delete and a
// ConfigMap symlink swap are each in force within 2 s, no call is
// answered with an error, a descriptor removed from a file is no longer
// limited, a policy published through the admin API is left alone, and a
// bad or half-written file leaves the last good configuration in force
// (logged with file, line and field, counted, /readyz still ready).
func TestServeWatchesEnvoyConfig(t *testing.T) {
	bin := buildSluice(t)
	root := t.TempDir()
	cfgDir := filepath.Join(root, "ratelimit", "config") // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config
	swapData(t, cfgDir, "..v1", map[string]string{"svc.yaml": envoyYAML("svc", "k", "a", "100", "k", "b", "5")})
	edge := filepath.Join(cfgDir, "teams", "edge.yaml")
	mustWrite(t, edge, envoyYAML("edge", "ip", "x", "50"))

	d := startDaemon(t, bin, "--rls-listen", "127.0.0.1:0", "--envoy-config", cfgDir, "--config-watch-interval", "200ms")
	conn, err := grpc.NewClient(rlsAddr(t, d), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := rlsCaller{t: t, c: rlsv3.NewRateLimitServiceClient(conn)}
	adminPolicy := `{"id":"admin-c","match":{"domain":"svc","descriptors":[{"key":"k","value":"c"}]},"algorithm":"fixed_window","limit":7,"window":3600,"mode":"enforce"}`
	if rep := d.admin("PUT", "/v1/policies/admin-c", adminPolicy); rep.status != 200 && rep.status != 201 {
		t.Fatalf("PUT admin-c = %d %s", rep.status, rep.body)
	}
	for _, c := range []struct {
		domain string
		kv     []string
		want   uint32
	}{{"svc", []string{"k", "a"}, 100}, {"svc", []string{"k", "b"}, 5}, {"edge", []string{"ip", "x"}, 50}, {"svc", []string{"k", "c"}, 7}} {
		if got := r.limit(c.domain, c.kv...); got != c.want {
			t.Fatalf("at start, %s %v limited to %d, want %d", c.domain, c.kv, got, c.want)
		}
	}
	l := startLoad(t, r, [][]string{{"svc", "k", "a"}, {"svc", "k", "b"}, {"edge", "ip", "x"}, {"fresh", "f", "1"}})

	waitLimit := func(what string, want uint32, domain string, kv ...string) {
		t.Helper()
		testwait.For(t, inForce, what, func() bool { return r.limit(domain, kv...) == want })
	}
	mustWrite(t, edge, envoyYAML("edge", "ip", "x", "70"))
	waitLimit("an edit of a file in a subdirectory in force", 70, "edge", "ip", "x")

	fresh := filepath.Join(cfgDir, "teams", "fresh.yml")
	mustWrite(t, fresh, envoyYAML("fresh", "f", "1", "9"))
	waitLimit("a created file in force", 9, "fresh", "f", "1")

	if err := os.Remove(fresh); err != nil {
		t.Fatal(err)
	}
	waitLimit("a deleted file's descriptor no longer limited", 0, "fresh", "f", "1")

	swapData(t, cfgDir, "..v2", map[string]string{"svc.yaml": envoyYAML("svc", "k", "a", "300")})
	waitLimit("the ..data swap in force", 300, "svc", "k", "a")
	if resp, err := r.ask(t.Context(), "svc", "k", "b"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("k=b, removed from svc.yaml = %v, %v; want OK with no limit", resp, err)
	}
	if got := r.limit("svc", "k", "c"); got != 7 {
		t.Errorf("the admin API's policy admin-c limits k=c to %d after the file changes, want 7 (untouched)", got)
	}

	// A half-written file (not YAML yet) and then a bad one: the last
	// good configuration stays.
	mustWrite(t, edge, "domain: edge\ndescriptors:\n  - key: ip\n    value: x\n    rate_limit: {unit: hour, requests_per")
	testwait.For(t, 10*time.Second, "the half-written file refused in the log", func() bool { return strings.Count(d.log(), "configuration refused") >= 1 })
	mustWrite(t, edge, envoyYAML("edge", "ip", "x", "80")+"    bogus: 1\n")
	testwait.For(t, 10*time.Second, "the bad file refused in the log", func() bool { return strings.Count(d.log(), "configuration refused") >= 2 })
	checkRefusal(t, d, edge, 8, "descriptors[0].bogus")
	if got := r.limit("edge", "ip", "x"); got != 70 {
		t.Errorf("after a bad file, edge ip=x limited to %d, want 70 (the last good configuration)", got)
	}
	if got := r.limit("svc", "k", "a"); got != 300 {
		t.Errorf("after a bad file, svc k=a limited to %d, want 300", got)
	}
	if rep := d.do("GET", "/readyz", ""); rep.status != 200 {
		t.Errorf("/readyz after a refused reload = %d %s, want 200", rep.status, rep.body)
	}
	if m := d.do("GET", "/metrics", "").body; !strings.Contains(m, `sluice_config_reload_errors_total{source="envoy-config"} 2`) {
		t.Errorf("metrics lack sluice_config_reload_errors_total{source=\"envoy-config\"} 2:\n%s", grepLines(m, "sluice_config_"))
	}
	mustWrite(t, edge, envoyYAML("edge", "ip", "x", "80"))
	waitLimit("the file, fixed, in force", 80, "edge", "ip", "x")
	l.finish(t)
}

// checkRefusal finds the log line of the last refused reload and checks
// it names file, line and field.
func checkRefusal(t *testing.T, d *daemon, file string, line int, field string) {
	t.Helper()
	var last map[string]any
	for _, s := range strings.Split(d.log(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(s), &m) == nil && m["msg"] == "configuration refused: the last good configuration stays in force" {
			last = m
		}
	}
	if last == nil {
		t.Fatal("no refusal logged")
	}
	if last["file"] != file || last["line"] != float64(line) || last["field"] != field {
		t.Errorf("refusal logged as file %v line %v field %v, want %s, %d, %s (%v)", last["file"], last["line"], last["field"], file, line, field, last)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeWatchesPolicies edits a watched --policies file: a policy
// changed is in force within 2 s, one removed is deleted, one published
// through the admin API is left alone, and an invalid file leaves the
// last good set (logged with file and field, /readyz ready).
func TestServeWatchesPolicies(t *testing.T) {
	bin := buildSluice(t)
	doc := func(id string, burst int) string {
		return fmt.Sprintf(`{"id":%q,"match":{"routes":["/%s/*"]},"algorithm":"token_bucket","rate_per_sec":1,"burst":%d,"mode":"enforce"}`, id, id, burst)
	}
	file := writeFile(t, "policies.json", "["+doc("alpha", 5)+","+doc("beta", 6)+"]")
	d := startDaemon(t, bin, "--policies", file, "--config-watch-interval", "200ms")
	if rep := d.admin("PUT", "/v1/policies/gamma", doc("gamma", 7)); rep.status != 200 && rep.status != 201 {
		t.Fatalf("PUT gamma = %d %s", rep.status, rep.body)
	}
	bursts := func() map[string]float64 {
		var body struct {
			Policies []struct {
				ID    string
				Burst float64
			}
		}
		rep := d.admin("GET", "/v1/policies", "")
		if err := json.Unmarshal([]byte(rep.body), &body); err != nil {
			t.Fatalf("GET /v1/policies = %d %s: %v", rep.status, rep.body, err)
		}
		out := map[string]float64{}
		for _, p := range body.Policies {
			out[p.ID] = p.Burst
		}
		return out
	}
	same := func(a, b map[string]float64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
	if got, want := bursts(), map[string]float64{"alpha": 5, "beta": 6, "gamma": 7}; !same(got, want) {
		t.Fatalf("at start, policies = %v, want %v", got, want)
	}
	mustWrite(t, file, "["+doc("beta", 16)+"]")
	want := map[string]float64{"beta": 16, "gamma": 7}
	testwait.For(t, inForce, "the edited --policies file in force", func() bool { return same(bursts(), want) })

	mustWrite(t, file, "["+strings.Replace(doc("beta", 26), `"burst":26`, `"burst":-1`, 1)+"]")
	testwait.For(t, 10*time.Second, "the invalid file refused in the log", func() bool { return strings.Contains(d.log(), "configuration refused") })
	checkRefusal(t, d, file, 0, "[0].burst")
	if got := bursts(); !same(got, want) {
		t.Errorf("after an invalid file, policies = %v, want the last good %v", got, want)
	}
	if rep := d.do("GET", "/readyz", ""); rep.status != 200 {
		t.Errorf("/readyz after a refused reload = %d %s, want 200", rep.status, rep.body)
	}
}
