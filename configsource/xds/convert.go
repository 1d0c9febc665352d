// Package xds subscribes to rate limit configuration over xDS, state of
// the world, as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW
// (the way Envoy Gateway configures it): an aggregated discovery stream
// of ratelimit.config.ratelimit.v3.RateLimitConfig resources, each a
// domain and its descriptors, put in force through a configsource.Applier
// with the ownership and last-good rules of watched files.
//
// Convert is the pure part: the resources of one response to the
// policies they configure. Subscriber holds the stream: it acknowledges a
// response it put in force, refuses (NACK, with the error) one that does
// not validate while the last good configuration stays, and reconnects
// with backoff, keeping the last configuration, when the server goes away.
package xds

import (
	"fmt"
	"strings"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/quota"
)

// TypeURL is the type of the resources subscribed to, as envoyproxy/
// ratelimit subscribes.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// maxResources bounds the resources of one response.
const maxResources = 1000

// Convert returns the policies that the RateLimitConfig resources of one
// response configure: each is read as the envoyproxy/ratelimit YAML file
// it stands for (configsource.EnvoyParser, merge as MERGE_DOMAIN_CONFIG).
// An error is a *configsource.Error naming the resource (its name, else
// its index) and the field, e.g. descriptors[0].rate_limit.unit.
func Convert(resources []*anypb.Any, merge bool) ([]quota.Policy, error) {
	if len(resources) > maxResources {
		return nil, &configsource.Error{File: "resources", Reason: fmt.Sprintf("%d resources, at most %d", len(resources), maxResources)}
	}
	files := make(configsource.Files, 0, len(resources))
	seen := map[string]bool{}
	for i, res := range resources {
		name := fmt.Sprintf("resources[%d]", i)
		if res.GetTypeUrl() != TypeURL {
			return nil, &configsource.Error{File: name, Field: "type_url", Reason: fmt.Sprintf("%q, want %s", res.GetTypeUrl(), TypeURL)}
		}
		var c rlconf.RateLimitConfig
		if err := anypb.UnmarshalTo(res, &c, proto.UnmarshalOptions{}); err != nil {
			return nil, &configsource.Error{File: name, Reason: "not a RateLimitConfig: " + err.Error()}
		}
		if c.Name != "" {
			name = c.Name
		}
		if seen[name] {
			return nil, &configsource.Error{File: name, Field: "name", Reason: "two resources of this name"}
		}
		seen[name] = true
		data, err := yaml.Marshal(toYAML(&c))
		if err != nil {
			return nil, &configsource.Error{File: name, Reason: err.Error()}
		}
		files = append(files, configsource.File{Path: name, Data: data})
	}
	ps, err := configsource.EnvoyParser(merge)(files)
	if err != nil {
		var e *configsource.Error
		if asConfigError(err, &e) {
			e.Line = 0 // a line of the YAML made here means nothing to the server
		}
		return nil, err
	}
	return ps, nil
}

func asConfigError(err error, out **configsource.Error) bool {
	e, ok := err.(*configsource.Error)
	*out = e
	return ok
}

// The YAML of envoyproxy/ratelimit's configuration file, in its field
// names, that a RateLimitConfig stands for.
type (
	yamlRoot struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors,omitempty"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value,omitempty"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDescriptor `yaml:"descriptors,omitempty"`
		ShadowMode     bool             `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool             `yaml:"detailed_metric,omitempty"`
	}
	yamlRateLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit uint32        `yaml:"requests_per_unit"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

func toYAML(c *rlconf.RateLimitConfig) yamlRoot {
	return yamlRoot{Domain: c.Domain, Descriptors: descriptorsYAML(c.Descriptors, 0)}
}

func descriptorsYAML(ds []*rlconf.RateLimitDescriptor, depth int) []yamlDescriptor {
	if depth > quota.MaxDescriptorEntries {
		return nil // deeper than any descriptor path; the parser refuses the level above
	}
	out := make([]yamlDescriptor, len(ds))
	for i, d := range ds {
		out[i] = yamlDescriptor{Key: d.Key, Value: d.Value, Descriptors: descriptorsYAML(d.Descriptors, depth+1),
			ShadowMode: d.ShadowMode, DetailedMetric: d.DetailedMetric}
		if rl := d.RateLimit; rl != nil {
			y := &yamlRateLimit{RequestsPerUnit: rl.RequestsPerUnit, Unlimited: rl.Unlimited, Name: rl.Name}
			// The unit is an enum, so always has a value: UNKNOWN (0) is
			// no unit, and an unlimited policy's unit is not read.
			if rl.Unit != rlconf.RateLimitUnit_UNKNOWN && !rl.Unlimited {
				y.Unit = strings.ToLower(rl.Unit.String())
			}
			for _, r := range rl.Replaces {
				y.Replaces = append(y.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = y
		}
	}
	return out
}
