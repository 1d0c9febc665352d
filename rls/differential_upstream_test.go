package rls

import (
	"path/filepath"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// The request sequences of the suites on envoyproxy/ratelimit's own
// configuration fixtures (read from its module, differentialSuites). No
// sequence goes on
// after an answer over the limit with a smaller request, where
// envoyproxy/ratelimit, which counts the hits of a request over the
// limit, and Sluice, which spends nothing then, part by design.

// on is one step of dom with the descriptor kv and hits.
func on(dom string, hits uint32, kv ...string) step {
	return step{domain: dom, ds: []*rlv3.RateLimitDescriptor{desc(kv...)}, hits: hits}
}

// hitsOf is one step per hits, each of the descriptor kv on dom.
func hitsOf(dom string, kv []string, hits ...uint32) []step {
	out := make([]step, len(hits))
	for i, h := range hits {
		out[i] = on(dom, h, kv...)
	}
	return out
}

func kv(s ...string) []string { return s }

// upstreamBasicCases are for test/config/basic_config.yaml.
func upstreamBasicCases() map[string][]step {
	const d = "test-domain"
	return map[string][]step{
		"first level value, no limit":     repeat(2, on(d, 0, "key1", "value1")),
		"second level key alone":          hitsOf(d, kv("key1", "value1", "subkey1", "a"), 2, 2, 2),
		"second level value":              hitsOf(d, kv("key1", "value1", "subkey1", "subvalue1"), 4, 4, 4),
		"first level key alone":           hitsOf(d, kv("key2", "k2a"), 7, 7, 7),
		"first level value":               hitsOf(d, kv("key2", "value2"), 10, 10, 10, 10),
		"value limiting nothing":          repeat(2, on(d, 0, "key2", "value3")),
		"hour":                            repeat(2, on(d, 0, "key3", "a")),
		"named, day":                      repeat(2, on(d, 0, "key4", "a")),
		"value with a limit and children": hitsOf(d, kv("key5", "value5"), 8, 8),
		"its child":                       hitsOf(d, kv("key5", "value5", "subkey5", "subvalue5"), 13, 13),
		"unlimited":                       repeat(2, on(d, 100, "key6", "x")),
		"detailed_metric":                 hitsOf(d, kv("key7", "a"), 35, 35, 1),
		"two descriptors":                 repeat(2, step{domain: d, ds: []*rlv3.RateLimitDescriptor{desc("key3", "b"), desc("key6", "y")}}),
		"unknown key":                     repeat(2, on(d, 0, "nope", "x")),
		"too deep":                        repeat(2, on(d, 0, "key2", "k2b", "sub", "x")),
	}
}

// upstreamShadowCases are for test/config/shadowmode_config.yaml.
func upstreamShadowCases() map[string][]step {
	const d = "test-domain"
	return map[string][]step{
		"second level key alone":    hitsOf(d, kv("key1", "value1", "subkey1", "b"), 2, 2, 2),
		"shadow second level value": hitsOf(d, kv("key1", "value1", "subkey1", "subvalue1"), 4, 4, 4),
		"shadow key alone":          hitsOf(d, kv("key2", "s1"), 7, 7, 7),
		"value over shadow":         hitsOf(d, kv("key2", "value2"), 10, 10, 10, 10),
	}
}

// upstreamWildcardCases are for test/config/wildcard.yaml.
func upstreamWildcardCases() map[string][]step {
	const d = "test-domain"
	return map[string][]step{
		"trailing wildcard":         hitsOf(d, kv("wild", "foobar"), 7, 7, 7),
		"the prefix alone":          hitsOf(d, kv("wild", "foo"), 10, 10),
		"another value":             repeat(2, on(d, 0, "wild", "bar")),
		"no wildcard":               hitsOf(d, kv("noWild", "foo"), 10, 10),
		"no wildcard, longer":       repeat(2, on(d, 0, "noWild", "foobar")),
		"key alone":                 hitsOf(d, kv("noVal", "anything"), 7, 7, 7),
		"star in the middle":        repeat(2, on(d, 0, "midWild", "barab")),
		"star in the middle, sent":  hitsOf(d, kv("midWild", "bar*b"), 10, 10),
		"nested wildcard":           hitsOf(d, kv("nestedWild", "val1", "wild", "goober"), 10, 10),
		"nested wildcard, no match": repeat(2, on(d, 0, "nestedWild", "val1", "wild", "xyz")),
		"nested level alone":        repeat(2, on(d, 0, "nestedWild", "val1")),
	}
}

// upstreamWildcardKnown are the answers of upstreamWildcardCases that
// differ on purpose; docs/api.md lists them.
var upstreamWildcardKnown = map[string]string{
	"star in the middle/0": "a '*' inside a value: a pattern in Sluice (and in envoyproxy/ratelimit since March 2026), a literal in the build tested",
	"star in the middle/1": "a '*' inside a value: a pattern in Sluice (and in envoyproxy/ratelimit since March 2026), a literal in the build tested",
}

// upstreamShadowKnown are the answers of upstreamShadowCases that differ
// on purpose; docs/api.md lists them.
var upstreamShadowKnown = map[string]string{
	"shadow key alone/2":          "hits over a shadow rule's limit: envoyproxy/ratelimit counts them and answers 0 remaining, Sluice spends nothing when over and answers what is left",
	"shadow second level value/2": "hits over a shadow rule's limit: envoyproxy/ratelimit counts them and answers 0 remaining, Sluice spends nothing when over and answers what is left",
}

// upstreamIntegrationCases are for the runtime files of
// test/integration (domains basic and another).
func upstreamIntegrationCases() map[string][]step {
	return map[string][]step{
		"basic key1":           hitsOf("basic", kv("key1", "a"), 20, 20, 20),
		"basic key1_local":     hitsOf("basic", kv("key1_local", "a"), 30, 30),
		"basic one_per_minute": repeat(2, on("basic", 0, "one_per_minute", "x")),
		"another key2":         hitsOf("another", kv("key2", "a"), 7, 7, 7),
		"another key3":         hitsOf("another", kv("key3", "a"), 4, 4, 4),
		"another key4":         hitsOf("another", kv("key4", "a"), 20, 1),
		"another, two keys":    repeat(2, step{domain: "another", ds: []*rlv3.RateLimitDescriptor{desc("key2_local", "b"), desc("key3_local", "b")}, hits: 4}),
	}
}

// upstreamMergeCases are for test/config/merge_domain_key1.yaml and
// merge_domain_key2.yaml, one domain in two files, merged. Their
// descriptors have literal values, so the steps are one sequence.
func upstreamMergeCases() map[string][]step {
	const d = "test-domain"
	both := step{domain: d, ds: []*rlv3.RateLimitDescriptor{desc("key1", "value1"), desc("key2", "value2")}, hits: 1}
	return map[string][]step{
		"both files' descriptors": {
			on(d, 4, "key1", "value1"), on(d, 9, "key2", "value2"), both,
			on(d, 0, "key3", "value3"),                             // in neither file
			on(d, 5, "key1", "value1"), on(d, 1, "key1", "value1"), // the last over
		},
	}
}

// TestConfigRefusalsAgainstEnvoyRatelimit loads every configuration
// fixture of envoyproxy/ratelimit's test/config, alone, and the pairs its
// own tests load together, into envoyproxy/ratelimit and into Sluice's
// parser: both accept or both refuse each, but for those listed as
// differing, which docs/api.md lists too.
func TestConfigRefusalsAgainstEnvoyRatelimit(t *testing.T) {
	const cfg = "test/config/"
	src := ratelimitSource(t)
	alone, err := filepath.Glob(filepath.Join(src, cfg, "*.yaml"))
	if err != nil || len(alone) < 15 {
		t.Fatalf("envoyproxy/ratelimit's fixtures: %d files, %v", len(alone), err)
	}
	type fixture struct {
		files []string
		merge bool
	}
	fixtures := map[string]fixture{}
	for _, f := range alone {
		fixtures[filepath.Base(f)] = fixture{files: []string{cfg + filepath.Base(f)}}
	}
	fixtures["basic_config + duplicate_domain"] = fixture{files: []string{cfg + "basic_config.yaml", cfg + "duplicate_domain.yaml"}}
	fixtures["merge_domain_key1 + key2, merged"] = fixture{files: []string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key2.yaml"}, merge: true}
	fixtures["merge_domain_key1 + key2, not merged"] = fixture{files: []string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key2.yaml"}}
	fixtures["merge_domain_key1 twice, merged"] = fixture{files: []string{cfg + "merge_domain_key1.yaml", cfg + "merge_domain_key1.yaml:again.yaml"}, merge: true}
	// What Sluice refuses that envoyproxy/ratelimit loads, and why.
	known := map[string]string{
		"share_threshold.yaml": "share_threshold is not supported by Sluice: its parser says so rather than load a limit it would not enforce as written",
	}
	srv := redistest.Start(t)
	var agree atomic.Int64
	// Each fixture starts envoyproxy/ratelimit of its own: in parallel, as
	// far as -parallel lets them.
	t.Run("fixtures", func(t *testing.T) {
		for name, fx := range fixtures {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				dir := upstreamFixtures(t, fx.files...)
				var env []string
				if fx.merge {
					env = append(env, "MERGE_DOMAIN_CONFIG=true")
				}
				theirs := ratelimitAccepts(t, dir, srv.Addr(), env...)
				_, err := LoadEnvoyConfigs([]string{dir}, fx.merge)
				ours := err == nil
				switch reason := known[name]; {
				case theirs != ours && reason == "":
					t.Errorf("envoyproxy/ratelimit accepts: %v; Sluice: %v", theirs, err)
				case theirs != ours:
					t.Logf("known difference (%s): envoyproxy/ratelimit accepts: %v; Sluice: %v", reason, theirs, err)
				case reason != "":
					t.Errorf("listed as differing (%s), but both accept: %v", reason, ours)
				default:
					agree.Add(1)
				}
			})
		}
	})
	t.Logf("%d of %d configurations accepted or refused alike", agree.Load(), len(fixtures))
}
