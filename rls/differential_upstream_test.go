package rls

import rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

// The request sequences of the suites on envoyproxy/ratelimit's own
// configuration fixtures (testdata/envoy/upstream). No sequence goes on
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
