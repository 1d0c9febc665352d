package rls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// overLimitCases are sequences that go over the limit and keep sending,
// for the mode that counts hits even over the limit.
func overLimitCases() map[string][]step {
	one := func(dom string, d *rlv3.RateLimitDescriptor, hits uint32) step {
		return step{domain: dom, ds: []*rlv3.RateLimitDescriptor{d}, hits: hits}
	}
	read := func(kv ...string) *rlv3.RateLimitDescriptor {
		d := desc(kv...)
		d.HitsAddend = wrapperspb.UInt64(0)
		return d
	}
	two := func(hits uint32, kv ...string) step {
		return step{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc(kv[0], kv[1]), desc(kv[2], kv[3])}, hits: hits}
	}
	return map[string][]step{
		"over, counted, read refused": {
			one("shop", desc("client", "o1"), 3), one("shop", desc("client", "o1"), 3),
			one("shop", read("client", "o1"), 0), one("shop", desc("client", "o1"), 1),
		},
		"nested over, counted": {
			one("shop", desc("client", "o2", "path", "/cart"), 2), one("shop", desc("client", "o2", "path", "/cart"), 2),
			one("shop", read("client", "o2", "path", "/cart"), 0),
		},
		"two descriptors, both counted": {
			two(4, "tenant", "o3", "plan", "o3"), two(4, "tenant", "o3", "plan", "o3"),
			one("shop", read("plan", "o3"), 0), one("shop", read("tenant", "o3"), 0),
		},
		"one over, the other counts": {
			two(5, "tenant", "o4", "plan", "o4"), two(1, "tenant", "o4", "plan", "o4"),
			one("shop", desc("plan", "o4"), 0),
		},
		"shadow counted": repeat(4, one("quiet", desc("ip", "10.0.0.9"), 2)),
		"limit 0 beside": {
			{domain: "shop", ds: []*rlv3.RateLimitDescriptor{desc("closed", "o5"), desc("tenant", "o5")}, hits: 2},
			one("shop", desc("tenant", "o5"), 3), one("shop", read("tenant", "o5"), 0),
		},
	}
}

// countingFixes are the known differences of the default mode that
// counting over the limit removes: envoyproxy/ratelimit counts hits over
// the limit.
var countingFixes = map[string]bool{
	"hits_addend over/2":          true,
	"two descriptors, one over/1": true,
	"two descriptors, one over/2": true,
}

// countingKnown is knownDifferences without those counting fixes.
func countingKnown() map[string]string {
	out := map[string]string{}
	for k, v := range knownDifferences {
		if !countingFixes[k] {
			out[k] = v
		}
	}
	return out
}

// withCountOverLimit copies the configuration files of dir into a new
// directory, each with the Sluice field count_over_limit: true after its
// domain (envoyproxy/ratelimit refuses the field, so it reads dir).
func withCountOverLimit(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			lines = append(lines, l)
			if strings.HasPrefix(l, "domain:") {
				lines = append(lines, "count_over_limit: true")
			}
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// With hits counted even over the limit, Sluice and envoyproxy/ratelimit
// (whose default that is) answer the differential sequences and the
// over-limit ones alike, on one redis-server and the same files: the
// mode chosen for the whole daemon (Config.CountOverLimit) and for each
// domain (the Sluice field count_over_limit in the files Sluice loads).
func TestDifferentialOverLimitAgainstEnvoyRatelimit(t *testing.T) {
	const dir = "testdata/envoy/differential"
	cases := differentialCases()
	for k, v := range overLimitCases() {
		cases["count: "+k] = v
	}
	for _, mode := range []string{"daemon", "domain"} {
		t.Run(mode, func(t *testing.T) {
			suite := differentialSuite{dir: dir, cases: cases, known: countingKnown(), second: []string{"second"}}
			if mode == "domain" {
				suite.sluiceDir = withCountOverLimit(t, dir)
			} else {
				suite.sluice = func(c *Config) { c.CountOverLimit = true }
			}
			runDifferential(t, suite)
		})
	}
}
