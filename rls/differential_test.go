package rls

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/loopback"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/internal/testlog"
	"github.com/sluice-rl/sluice/internal/testtools"
	"github.com/sluice-rl/sluice/internal/testwait"
)

// ratelimitVersion is the envoyproxy/ratelimit build the differential
// test runs, bench/peers.sh's.
const ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// ratelimitBin returns envoyproxy/ratelimit's service, built once into
// the tools directory with go install from the Go module proxy.
func ratelimitBin(t *testing.T) string {
	t.Helper()
	p, err := testtools.Install(t, "ratelimit@"+ratelimitVersion, "github.com/envoyproxy/ratelimit/src/service_cmd", ratelimitVersion,
		"service_cmd", "GOFLAGS=-buildvcs=false")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freePort is a loopback port for envoyproxy/ratelimit's listeners, free
// until it binds them (loopback.Port).
func freePort(t *testing.T) string {
	t.Helper()
	p, err := loopback.Port(false)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

// startRatelimit runs envoyproxy/ratelimit on Redis at redisAddr with the
// configuration files of dir, in its runtime layout, and env added to its
// environment, and returns a client once it answers.
func startRatelimit(t *testing.T, dir, redisAddr string, env ...string) rlsv3.RateLimitServiceClient {
	t.Helper()
	c, _ := launchRatelimit(t, dir, redisAddr, env...)
	testwait.For(t, 60*time.Second, "envoyproxy/ratelimit answering", func() bool {
		return askRatelimit(c) == nil
	})
	return c
}

// ratelimitAccepts runs envoyproxy/ratelimit as startRatelimit does and
// reports whether it loaded the configuration of dir: it answers a call,
// or its log says it could not load the configuration (it then answers
// every call with an error).
func ratelimitAccepts(t *testing.T, dir, redisAddr string, env ...string) bool {
	t.Helper()
	c, out := launchRatelimit(t, dir, redisAddr, env...)
	var accepted bool
	testwait.For(t, 60*time.Second, "envoyproxy/ratelimit answering or refusing its configuration", func() bool {
		accepted = askRatelimit(c) == nil
		return accepted || strings.Contains(out.String(), "Error loading new configuration")
	})
	return accepted
}

func askRatelimit(c rlsv3.RateLimitServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*rlv3.RateLimitDescriptor{desc("warm", "up")}})
	return err
}

// launchRatelimit starts envoyproxy/ratelimit and returns a client and
// its output, without waiting for it to answer.
func launchRatelimit(t *testing.T, dir, redisAddr string, env ...string) (rlsv3.RateLimitServiceClient, *testlog.Buffer) {
	t.Helper()
	root := t.TempDir()
	cfg := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		copyFile(t, filepath.Join(dir, e.Name()), filepath.Join(cfg, e.Name()))
	}
	grpcPort := freePort(t)
	cmd := exec.Command(ratelimitBin(t))
	cmd.Env = append(os.Environ(), "HOST=127.0.0.1", "PORT="+freePort(t), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+freePort(t),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+grpcPort, "USE_STATSD=false", "LOG_LEVEL=warn",
		"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "LIMIT_RESPONSE_HEADERS_ENABLED=true")
	cmd.Env = append(cmd.Env, env...)
	out := &testlog.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			o := out.String()
			t.Logf("envoyproxy/ratelimit output (its end):\n%s", o[max(len(o)-4096, 0):])
		}
	})
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), out
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// ratelimitSource is the directory of envoyproxy/ratelimit's module at
// ratelimitVersion in the module cache, downloaded if need be: its
// repository's own test fixtures are read from there.
func ratelimitSource(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/envoyproxy/ratelimit@"+ratelimitVersion).Output()
	if err != nil {
		t.Fatalf("go mod download envoyproxy/ratelimit: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download envoyproxy/ratelimit = %s, %v; want its directory", out, err)
	}
	return m.Dir
}

// upstreamFixtures copies files (paths in envoyproxy/ratelimit's
// repository) into a directory of their own, each under its name or
// under the name given after a colon, and returns the directory.
func upstreamFixtures(t *testing.T, files ...string) string {
	t.Helper()
	src, dir := ratelimitSource(t), t.TempDir()
	for _, f := range files {
		from, name, ok := strings.Cut(f, ":")
		if !ok {
			name = filepath.Base(from)
		}
		copyFile(t, filepath.Join(src, from), filepath.Join(dir, name))
	}
	return dir
}

// step is one request of a sequence.
type step struct {
	domain string
	ds     []*rlv3.RateLimitDescriptor
	hits   uint32
}

// withHits is d with its own hits_addend.
func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// withLimit is d with a limit override.
func withLimit(d *rlv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// differentialCases are the request sequences sent to both services on
// testdata/envoy/differential; each case uses descriptor values of its
// own, so the cases count apart.
func differentialCases() map[string][]step {
	d := func(kv ...string) func() *rlv3.RateLimitDescriptor {
		return func() *rlv3.RateLimitDescriptor { return desc(kv...) }
	}
	one := func(dom string, f func() *rlv3.RateLimitDescriptor, hits uint32) step {
		return step{domain: dom, ds: []*rlv3.RateLimitDescriptor{f()}, hits: hits}
	}
	return map[string][]step{
		"key alone, minute":      repeat(6, one("shop", d("client", "c1"), 0)),
		"nested literal, hour":   repeat(5, one("shop", d("client", "c2", "path", "/cart"), 1)),
		"nested wildcard, day":   repeat(4, one("shop", d("client", "c3", "path", "/img/a.png"), 0)),
		"nested unknown value":   repeat(2, one("shop", d("client", "c4", "path", "/other"), 0)),
		"unlimited":              repeat(3, one("shop", d("client", "vip"), 100)),
		"week":                   repeat(7, one("shop", d("tenant", "t1"), 0)),
		"month":                  repeat(4, one("shop", d("plan", "p1"), 2)),
		"year":                   repeat(3, one("shop", d("region", "r1"), 3)),
		"second":                 repeat(3, one("shop", d("burst", "b1"), 0)),
		"limit 0":                repeat(2, one("shop", d("closed", "x"), 0)),
		"unknown domain":         repeat(2, one("nobody", d("client", "c1"), 5)),
		"unknown descriptor":     repeat(2, one("shop", d("nothing", "here"), 0)),
		"hits_addend 0 reads":    {one("shop", d("tenant", "t2"), 2), one("shop", func() *rlv3.RateLimitDescriptor { return withHits(desc("tenant", "t2"), 0) }, 0), one("shop", d("tenant", "t2"), 0)},
		"hits_addend over":       {one("shop", d("tenant", "t3"), 3), one("shop", d("tenant", "t3"), 3), one("shop", d("tenant", "t3"), 1)},
		"replaces":               repeat(3, step{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc("acct", "free"), desc("acct", "paid")}}),
		"replaced alone":         repeat(3, one("shop", d("acct", "free"), 0)),
		"shadow":                 repeat(4, one("quiet", d("ip", "10.0.0.1"), 0)),
		"neither limit nor kids": repeat(2, one("quiet", d("open", "x"), 0)),
		"limit override": repeat(4, one("shop", func() *rlv3.RateLimitDescriptor {
			return withLimit(desc("nothing", "o1"), 2, typev3.RateLimitUnit_HOUR)
		}, 0)),
		// How a descriptor finds its limit (match.yaml).
		"first pattern in file order":     repeat(3, one("match", d("path", "/api/x"), 0)),
		"pattern limiting nothing":        repeat(2, one("match", d("route", "/open/x"), 0)),
		"pattern after it":                repeat(4, one("match", d("route", "/other"), 0)),
		"value limiting nothing":          repeat(2, one("match", d("user", "guest"), 0)),
		"key alone after it":              repeat(5, one("match", d("user", "u1"), 0)),
		"star in the middle":              repeat(2, one("match", d("file", "/img/a.png"), 0)),
		"star in the middle, sent":        repeat(3, one("match", d("file", "/img/*.png"), 0)),
		"nested pattern limiting nothing": repeat(2, one("match", d("team", "t1", "member", "m1"), 0)),
		"nested key alone":                repeat(3, one("match", d("team", "t1", "member", "x1"), 0)),
		"key and value joined":            repeat(2, one("match", d("sep", "a"), 0)),
		"two descriptors, one over": {
			{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc("tenant", "t4"), desc("plan", "p4")}, hits: 4},
			{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc("tenant", "t4"), desc("plan", "p4")}, hits: 2},
			{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc("plan", "p4")}, hits: 1},
		},
	}
}

// knownDifferences are the answers of differentialCases that differ on
// purpose, by case and step (0-based), with the reason; docs/api.md lists
// each.
var knownDifferences = map[string]string{
	"hits_addend over/2":          "hits over the limit: envoyproxy/ratelimit counts them, Sluice spends nothing when over",
	"key and value joined/0":      "envoyproxy/ratelimit joins a request's key and value with '_' before looking them up, so (sep, a) finds the key sep_a; Sluice keeps keys and values apart",
	"key and value joined/1":      "envoyproxy/ratelimit joins a request's key and value with '_' before looking them up, so (sep, a) finds the key sep_a; Sluice keeps keys and values apart",
	"star in the middle/0":        "a '*' inside a value: a pattern in Sluice (and in envoyproxy/ratelimit since March 2026), a literal in the build tested",
	"star in the middle/1":        "a '*' inside a value: a pattern in Sluice (and in envoyproxy/ratelimit since March 2026), a literal in the build tested",
	"two descriptors, one over/1": "a request with one descriptor over: envoyproxy/ratelimit counts the others' hits, Sluice (one subject per domain) spends none",
	"two descriptors, one over/2": "a request with one descriptor over: envoyproxy/ratelimit counts the others' hits, Sluice (one subject per domain) spends none",
}

// differentialSuite is one directory of configuration files, loaded by
// both services, and the request sequences sent to both: a case's steps
// in order, the cases in any order. Known maps "case/step" (step
// 0-based) to the reason the answers differ there; every other step
// must agree. A suite runs on a redis-server of its own, so suites whose
// files share a domain do not share counters. Another file adds suites by
// calling runDifferential from a test of its own.
type differentialSuite struct {
	dir string
	// upstream, if set, are the files of envoyproxy/ratelimit's
	// repository the suite loads instead of dir (see upstreamFixtures).
	upstream []string
	// merge lets several files configure one domain: MERGE_DOMAIN_CONFIG
	// for envoyproxy/ratelimit, --envoy-merge-domains for Sluice.
	merge bool
	cases map[string][]step
	known map[string]string
	// second names the cases that count in windows of one second: each
	// starts at the beginning of a second, so that both services count
	// it in one window.
	second []string
	// sluice adjusts Sluice's rate limit service; nil keeps the defaults
	// but for envoyproxy/ratelimit's response headers.
	sluice func(*Config)
	// env is more of envoyproxy/ratelimit's environment (KEY=value).
	env []string
	// sluiceDir, if set, is what Sluice loads instead of dir: the same
	// files with Sluice's own fields, which envoyproxy/ratelimit refuses.
	sluiceDir string
}

// runDifferential runs suite against envoyproxy/ratelimit and Sluice,
// one subtest per case.
func runDifferential(t *testing.T, suite differentialSuite) {
	t.Helper()
	srv := redistest.Start(t)
	dir := suite.dir
	if len(suite.upstream) > 0 {
		dir = upstreamFixtures(t, suite.upstream...)
	}
	env := suite.env
	if suite.merge {
		env = append(slices.Clip(env), "MERGE_DOMAIN_CONFIG=true")
	}
	envoy := startRatelimit(t, dir, srv.Addr(), env...)
	files := dir
	if suite.sluiceDir != "" {
		files = suite.sluiceDir
	}
	ps, err := LoadEnvoyConfigs([]string{files}, suite.merge)
	if err != nil {
		t.Fatal(err)
	}
	sluice := rlsv3.NewRateLimitServiceClient(startRLSWith(t, "redis://"+srv.Addr()+"/1", ps, func(c *Config) {
		c.Headers = HeadersEnvoy
		if suite.sluice != nil {
			suite.sluice(c)
		}
	}))
	for name, steps := range suite.cases {
		t.Run(name, func(t *testing.T) {
			if slices.Contains(suite.second, name) {
				freshWindow(t, time.Second, 500*time.Millisecond)
			} else {
				// A case of minutes or longer that crossed a minute
				// would find one service's window new and the other's
				// not, as the two are asked one after the other.
				freshWindow(t, time.Minute, 5*time.Second)
			}
			for i, s := range steps {
				compareStep(t, envoy, sluice, s, i, suite.known[name+"/"+strconv.Itoa(i)])
			}
		})
	}
}

// compareStep sends step i to both services and compares the answers:
// they must agree unless reason (non-empty) says why they differ, and
// then they must differ.
func compareStep(t *testing.T, envoy, sluice rlsv3.RateLimitServiceClient, s step, i int, reason string) {
	t.Helper()
	ctx := context.Background()
	req := &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: s.ds, HitsAddend: s.hits}
	sent := time.Now()
	a, err := envoy.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("step %d: envoyproxy/ratelimit: %v", i, err)
	}
	b, err := sluice.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("step %d: Sluice: %v", i, err)
	}
	switch diff := compareAnswers(a, b, time.Since(sent)); {
	case diff != "" && reason == "":
		t.Errorf("step %d: envoyproxy/ratelimit and Sluice differ in %s\nenvoyproxy/ratelimit: %v\nSluice: %v", i, diff, a, b)
	case diff != "":
		t.Logf("step %d: known difference (%s): %s", i, reason, diff)
	case reason != "":
		t.Errorf("step %d: listed as differing (%s), but both answer %v", i, reason, a)
	}
}

// differentialSuites are the suites of TestDifferentialAgainstEnvoyRatelimit:
// Sluice's own fixtures and those of envoyproxy/ratelimit's repository,
// read from its module (the three files of test/config share the domain
// test-domain, so each runs alone).
func differentialSuites() map[string]differentialSuite {
	const cfg, integration = "test/config/", "test/integration/runtime/current/ratelimit/config/"
	return map[string]differentialSuite{
		"sluice":                {dir: "testdata/envoy/differential", cases: differentialCases(), known: knownDifferences, second: []string{"second"}},
		"upstream basic_config": {upstream: []string{cfg + "basic_config.yaml"}, cases: upstreamBasicCases(), second: []string{"second level key alone", "second level value"}},
		"upstream shadowmode":   {upstream: []string{cfg + "shadowmode_config.yaml"}, cases: upstreamShadowCases(), known: upstreamShadowKnown, second: []string{"second level key alone", "shadow second level value"}},
		"upstream wildcard":     {upstream: []string{cfg + "wildcard.yaml"}, cases: upstreamWildcardCases(), known: upstreamWildcardKnown},
		"upstream merge_domain": {upstream: []string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key2.yaml"}, merge: true, cases: upstreamMergeCases()},
		// share_threshold.yaml, the third file there, Sluice refuses
		// (TestConfigRefusalsAgainstEnvoyRatelimit).
		"upstream integration": {upstream: []string{integration + "basic.yaml", integration + "another.yaml"}, cases: upstreamIntegrationCases(), second: []string{"basic key1", "basic key1_local"}},
	}
}

// compareAnswers names the first field in which a and b differ, "" when
// none does: overall_code, then each status's code, current_limit
// (requests_per_unit and unit), limit_remaining and duration_until_reset
// within a second plus elapsed, and the RateLimit-Limit, -Remaining and
// -Reset headers (the reset within a second). envoyproxy/ratelimit counts
// a window's reset from its clock in whole seconds, so its figure is up to
// a second above the exact one; elapsed is the time between sending a's
// request and receiving b, by which b's exact figure is the smaller.
func compareAnswers(a, b *rlsv3.RateLimitResponse, elapsed time.Duration) string {
	if a.GetOverallCode() != b.GetOverallCode() {
		return fmt.Sprintf("overall_code %v, %v", a.GetOverallCode(), b.GetOverallCode())
	}
	if len(a.GetStatuses()) != len(b.GetStatuses()) {
		return fmt.Sprintf("%d statuses, %d", len(a.GetStatuses()), len(b.GetStatuses()))
	}
	for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
		ha, hb := header(a, h), header(b, h)
		na, ea := strconv.ParseInt(ha, 10, 64)
		nb, eb := strconv.ParseInt(hb, 10, 64)
		if ha != hb && (h != "RateLimit-Reset" || ea != nil || eb != nil || max(na-nb, nb-na) > 1) {
			return fmt.Sprintf("%s %q, %q", h, ha, hb)
		}
	}
	for i, sa := range a.GetStatuses() {
		sb := b.GetStatuses()[i]
		switch la, lb := sa.GetCurrentLimit(), sb.GetCurrentLimit(); {
		case sa.GetCode() != sb.GetCode():
			return fmt.Sprintf("statuses[%d].code %v, %v", i, sa.GetCode(), sb.GetCode())
		case (la == nil) != (lb == nil) || la.GetRequestsPerUnit() != lb.GetRequestsPerUnit() || la.GetUnit() != lb.GetUnit():
			return fmt.Sprintf("statuses[%d].current_limit %v, %v", i, la, lb)
		case sa.GetLimitRemaining() != sb.GetLimitRemaining():
			return fmt.Sprintf("statuses[%d].limit_remaining %d, %d", i, sa.GetLimitRemaining(), sb.GetLimitRemaining())
		}
		ra, rb := sa.GetDurationUntilReset().AsDuration(), sb.GetDurationUntilReset().AsDuration()
		if (sa.GetDurationUntilReset() == nil) != (sb.GetDurationUntilReset() == nil) || (ra-rb).Abs() > time.Second+elapsed {
			return fmt.Sprintf("statuses[%d].duration_until_reset %v, %v", i, sa.GetDurationUntilReset(), sb.GetDurationUntilReset())
		}
	}
	return ""
}

// Sluice and envoyproxy/ratelimit, each suite on one redis-server and the
// same configuration files, answer the same request sequences alike,
// field by field, but for the differences each suite lists.
func TestDifferentialAgainstEnvoyRatelimit(t *testing.T) {
	for name, suite := range differentialSuites() {
		t.Run(name, func(t *testing.T) { runDifferential(t, suite) })
	}
}
