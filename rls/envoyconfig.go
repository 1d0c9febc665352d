package rls

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/quota"
)

// MaxEnvoyConfigBytes bounds one configuration file.
const MaxEnvoyConfigBytes = 4 << 20

// maxEnvoyDescriptors bounds the descriptors (at every level) of one file.
const maxEnvoyDescriptors = 10000

// envoyUnits are the units of envoyproxy/ratelimit, in seconds (a month
// is 30 days and a year 365, as there).
var envoyUnits = map[string]float64{
	"second": 1, "minute": 60, "hour": 3600, "day": 86400,
	"week": 7 * 86400, "month": 30 * 86400, "year": 365 * 86400,
}

// ConfigError is a configuration file that cannot be loaded: the file, the
// line and the field, e.g. "descriptors[0].rate_limit.unit". Error is one
// line.
type ConfigError struct {
	File   string
	Line   int
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Reason)
	return strings.ReplaceAll(b.String(), "\n", " ")
}

// LoadEnvoyConfigs reads envoyproxy/ratelimit configuration files, each
// path a file or a directory whose *.yaml and *.yml files are read (not
// recursively, in name order), and parses them with ParseEnvoyConfigs.
func LoadEnvoyConfigs(paths []string, merge bool) ([]quota.Policy, error) {
	var names []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			names = append(names, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		n := 0
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				names = append(names, filepath.Join(p, e.Name()))
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s: no *.yaml or *.yml file in this directory", p)
		}
	}
	files := make([]EnvoyFile, len(names))
	for i, f := range names {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if len(data) > MaxEnvoyConfigBytes {
			return nil, &ConfigError{File: f, Reason: fmt.Sprintf("%d bytes, at most %d", len(data), MaxEnvoyConfigBytes)}
		}
		files[i] = EnvoyFile{Path: f, Data: data}
	}
	return ParseEnvoyConfigs(files, merge)
}

// EnvoyFile is one envoyproxy/ratelimit configuration file as read.
type EnvoyFile struct {
	Path string
	Data []byte
}

// ParseEnvoyConfigs parses files as one configuration, in their order
// (ParseEnvoyConfig). Two files may configure one domain only with merge,
// as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: the domain's descriptors
// are then those of every file, and one descriptor in two files is an
// error. Without merge, a domain in two files is an error. Every error is
// a *ConfigError naming the file.
func ParseEnvoyConfigs(files []EnvoyFile, merge bool) ([]quota.Policy, error) {
	var out []quota.Policy
	domains := map[string]string{}
	ids := map[string]string{}
	for _, f := range files {
		domain, ps, err := ParseEnvoyConfig(f.Path, f.Data)
		if err != nil {
			return nil, AsConfigError(f.Path, err)
		}
		if other, dup := domains[domain]; dup && !merge {
			return nil, &ConfigError{File: f.Path, Field: "domain", Reason: fmt.Sprintf("domain %q is also configured by %s (merging domains is off)", domain, other)}
		}
		domains[domain] = f.Path
		for _, p := range ps {
			if other, dup := ids[p.ID]; dup {
				return nil, &ConfigError{File: f.Path, Field: "descriptors", Reason: fmt.Sprintf("policy %s (domain %q) is also configured by %s", p.ID, domain, other)}
			}
			ids[p.ID] = f.Path
		}
		out = append(out, ps...)
	}
	return out, nil
}

// AsConfigError turns the error of parsing file into a *ConfigError
// naming the file, the line and the field as far as err knows them.
func AsConfigError(file string, err error) *ConfigError {
	var e *ConfigError
	if errors.As(err, &e) {
		return e
	}
	var ve *quota.ValidationError
	if errors.As(err, &ve) && len(ve.Problems) > 0 {
		p := ve.Problems[0]
		reason := p.Reason
		if n := len(ve.Problems) - 1; n > 0 {
			reason += fmt.Sprintf(" (and %d more)", n)
		}
		return &ConfigError{File: file, Field: p.Field, Reason: reason}
	}
	return &ConfigError{File: file, Reason: err.Error()}
}

// envoyLimit is one rate_limit block, with where it sits.
type envoyLimit struct {
	path      []quota.DescriptorEntry
	field     string
	line      int
	unlimited bool
	// open is a descriptor with neither a rate_limit nor nested
	// descriptors: matched, but limiting nothing.
	open      bool
	rpu       uint32
	unit      float64
	mult      uint32 // unit_multiplier; 0 when not given
	algorithm string
	scope     string
	name      string
	replaces  []string
	shadow    bool
}

type envoyParser struct {
	file   string
	limits []envoyLimit
	count  int
	// countOver is the domain's Sluice field count_over_limit.
	countOver bool
	// longest is wildcard_precedence: longest.
	longest bool
}

func (p *envoyParser) fail(n *yaml.Node, field, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ConfigError{File: p.file, Line: line, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ParseEnvoyConfig reads one envoyproxy/ratelimit configuration file into
// descriptor policies of its domain, one per rate_limit block and one
// unlimited shadow policy per descriptor with neither a rate_limit nor
// nested descriptors (envoyproxy/ratelimit lets those through, answering
// no limit and 0 remaining). Each policy's match.order is its position in
// the file, so that of several value patterns the first in file order is
// taken, as envoyproxy/ratelimit takes it; the Sluice field
// wildcard_precedence: longest, beside domain, leaves the orders out, so
// that the pattern with the most literal text is taken. file names the
// file in errors.
//
// A rate_limit of requests_per_unit per unit becomes, by default, a
// fixed_window policy of limit requests_per_unit and window one unit (or
// unit_multiplier units): the windows envoyproxy/ratelimit counts in,
// aligned to the unit. Booleans may be spelt as YAML 1.1 spells them
// (yes, no, on, off), as envoyproxy/ratelimit reads them. The Sluice
// field algorithm in a rate_limit block picks another: token_bucket or
// leaky_bucket (rate requests_per_unit per unit, burst requests_per_unit),
// sliding_window_counter or sliding_window_log (limit requests_per_unit
// per window of one unit). The Sluice field scope, region (the default)
// or global, makes a global-scope policy: one limit shared by the
// regions. requests_per_unit 0 denies every descriptor
// it matches. shadow_mode makes the policy shadow; name and replaces
// become replaces between the policies of the file; detailed_metric and
// value_to_metric name metrics in envoyproxy/ratelimit and change no
// decision, so they are accepted and ignored. The Sluice field
// count_over_limit beside domain (a boolean) counts the hits of every
// request of the domain even over the limit, as envoyproxy/ratelimit
// does (quota.Policy.CountOverLimit). Every other field, and
// quota_mode, share_threshold or metadata, is an error naming it.
func ParseEnvoyConfig(file string, data []byte) (string, []quota.Policy, error) {
	p := &envoyParser{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", nil, &ConfigError{File: file, Reason: "not YAML: " + err.Error()}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return "", nil, p.fail(&doc, "", "want a mapping with domain and descriptors")
	}
	root := doc.Content[0]
	var domain string
	var descs *yaml.Node
	if err := p.fields(root, "", func(k string, v *yaml.Node) error {
		switch k {
		case "domain":
			return p.str(v, "domain", &domain)
		case "descriptors":
			descs = v
			return nil
		case "count_over_limit":
			return p.boolean(v, k, &p.countOver)
		case "wildcard_precedence":
			var w string
			if err := p.str(v, k, &w); err != nil {
				return err
			}
			switch w {
			case "first":
			case "longest":
				p.longest = true
			default:
				return p.fail(v, k, "%q is neither first nor longest", w)
			}
			return nil
		}
		return p.fail(v, k, "unknown field (want domain, descriptors, count_over_limit, wildcard_precedence)")
	}); err != nil {
		return "", nil, err
	}
	if domain == "" {
		return "", nil, p.fail(root, "domain", "required")
	}
	if err := quota.ValidDescriptorText(domain, quota.MaxDomainBytes); err != nil {
		return "", nil, p.fail(root, "domain", "%v", err)
	}
	if descs != nil {
		if err := p.descriptors(descs, "descriptors", nil); err != nil {
			return "", nil, err
		}
	}
	ps, err := p.policies(domain)
	if err != nil {
		return "", nil, err
	}
	return domain, ps, nil
}

// fields calls fn for each key of a mapping, refusing duplicates.
func (p *envoyParser) fields(n *yaml.Node, at string, fn func(k string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return p.fail(n, at, "want a mapping")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		if kn.Kind != yaml.ScalarNode {
			return p.fail(kn, at, "keys must be strings")
		}
		k := kn.Value
		f := k
		if at != "" {
			f = at + "." + k
		}
		if seen[k] {
			return p.fail(kn, f, "given twice")
		}
		seen[k] = true
		if err := fn(k, v); err != nil {
			// A field's problem is reported on the line of its name.
			var ce *ConfigError
			if errors.As(err, &ce) && ce.Line == v.Line && ce.Field == f {
				ce.Line = kn.Line
			}
			return err
		}
	}
	return nil
}

func (p *envoyParser) str(v *yaml.Node, f string, out *string) error {
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!str" && v.Tag != "!!int" && v.Tag != "!!float" && v.Tag != "!!bool") {
		return p.fail(v, f, "want a string")
	}
	*out = v.Value
	return nil
}

// boolean reads a YAML boolean, YAML 1.1's spellings included (yes, no,
// on, off, y, n in any case), as envoyproxy/ratelimit's YAML library
// reads them.
func (p *envoyParser) boolean(v *yaml.Node, f string, out *bool) error {
	if v.Kind == yaml.ScalarNode && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
		switch strings.ToLower(v.Value) {
		case "yes", "on", "y":
			*out = true
			return nil
		case "no", "off", "n":
			*out = false
			return nil
		}
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return p.fail(v, f, "want true or false")
	}
	return v.Decode(out)
}

func (p *envoyParser) descriptors(n *yaml.Node, at string, path []quota.DescriptorEntry) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.fail(n, at, "want a list of descriptors")
	}
	if len(path) >= quota.MaxDescriptorEntries && len(n.Content) > 0 {
		return p.fail(n, at, "nested more than %d levels deep", quota.MaxDescriptorEntries)
	}
	seen := map[quota.DescriptorEntry]bool{}
	for i, d := range n.Content {
		if p.count++; p.count > maxEnvoyDescriptors {
			return p.fail(d, at, "more than %d descriptors in one file", maxEnvoyDescriptors)
		}
		f := fmt.Sprintf("%s[%d]", at, i)
		var e quota.DescriptorEntry
		var rl, nested *yaml.Node
		var shadow bool
		err := p.fields(d, f, func(k string, v *yaml.Node) error {
			kf := f + "." + k
			switch k {
			case "key":
				return p.str(v, kf, &e.Key)
			case "value":
				return p.str(v, kf, &e.Value)
			case "rate_limit":
				rl = v
				return nil
			case "descriptors":
				nested = v
				return nil
			case "shadow_mode":
				return p.boolean(v, kf, &shadow)
			case "detailed_metric", "value_to_metric":
				var b bool
				return p.boolean(v, kf, &b)
			case "quota_mode", "share_threshold":
				var b bool
				if err := p.boolean(v, kf, &b); err != nil || !b {
					return err
				}
				return p.fail(v, kf, "not supported by Sluice")
			case "metadata":
				return p.fail(v, kf, "not supported by Sluice (no dynamic metadata is returned)")
			}
			return p.fail(v, kf, "unknown field")
		})
		if err != nil {
			return err
		}
		if e.Key == "" {
			return p.fail(d, f+".key", "required")
		}
		if err := quota.ValidDescriptorText(e.Key, quota.MaxDescriptorKeyBytes); err != nil {
			return p.fail(d, f+".key", "%v", err)
		}
		if err := quota.ValidDescriptorText(e.Value, quota.MaxDescriptorValueBytes); err != nil {
			return p.fail(d, f+".value", "%v", err)
		}
		if seen[e] {
			return p.fail(d, f, "duplicate descriptor key %q value %q at this level", e.Key, e.Value)
		}
		seen[e] = true
		here := append(slices.Clip(path), e)
		hasNested := nested != nil && nested.Kind == yaml.SequenceNode && len(nested.Content) > 0
		if rl != nil {
			l, err := p.rateLimit(rl, f+".rate_limit", here, shadow)
			if err != nil {
				return err
			}
			p.limits = append(p.limits, l)
		} else if !hasNested {
			// Neither a limit nor nested descriptors: matched, limits
			// nothing.
			p.limits = append(p.limits, envoyLimit{path: here, field: f, line: d.Line, unlimited: true, open: true})
		}
		if nested != nil {
			if err := p.descriptors(nested, f+".descriptors", here); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *envoyParser) rateLimit(n *yaml.Node, f string, path []quota.DescriptorEntry, shadow bool) (envoyLimit, error) {
	l := envoyLimit{path: path, field: f, line: n.Line, shadow: shadow}
	var unit string
	var rpu, unitNode *yaml.Node
	err := p.fields(n, f, func(k string, v *yaml.Node) error {
		kf := f + "." + k
		switch k {
		case "unit":
			unitNode = v
			return p.str(v, kf, &unit)
		case "requests_per_unit":
			rpu = v
			return nil
		case "unit_multiplier":
			var m uint64
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Decode(&m) != nil || m == 0 || m > math.MaxUint32 {
				return p.fail(v, kf, "want a whole number from 1 to %d", uint32(math.MaxUint32))
			}
			l.mult = uint32(m)
			return nil
		case "unlimited":
			return p.boolean(v, kf, &l.unlimited)
		case "name":
			return p.str(v, kf, &l.name)
		case "algorithm":
			return p.str(v, kf, &l.algorithm)
		case "scope":
			if err := p.str(v, kf, &l.scope); err != nil {
				return err
			}
			if l.scope != quota.ScopeRegion && l.scope != quota.ScopeGlobal {
				return p.fail(v, kf, "unknown scope %q (want region or global)", l.scope)
			}
			return nil
		case "replaces":
			if v.Kind != yaml.SequenceNode {
				return p.fail(v, kf, "want a list of {name: ...}")
			}
			for i, r := range v.Content {
				rf := fmt.Sprintf("%s[%d]", kf, i)
				var name string
				if err := p.fields(r, rf, func(k string, v *yaml.Node) error {
					if k != "name" {
						return p.fail(v, rf+"."+k, "unknown field (want name)")
					}
					return p.str(v, rf+".name", &name)
				}); err != nil {
					return err
				}
				if name == "" {
					return p.fail(r, rf+".name", "required")
				}
				l.replaces = append(l.replaces, name)
			}
			return nil
		}
		return p.fail(v, kf, "unknown field")
	})
	if err != nil {
		return l, err
	}
	if rpu != nil {
		var v uint64
		if rpu.Kind != yaml.ScalarNode || rpu.Tag != "!!int" || rpu.Decode(&v) != nil || v > math.MaxUint32 {
			return l, p.fail(rpu, f+".requests_per_unit", "want a whole number from 0 to %d", uint32(math.MaxUint32))
		}
		l.rpu = uint32(v)
	}
	sec, known := envoyUnits[strings.ToLower(unit)]
	switch {
	case l.unlimited && unit != "":
		return l, p.fail(n, f+".unit", "must not be given with unlimited")
	case l.unlimited && l.algorithm != "":
		return l, p.fail(n, f+".algorithm", "must not be given with unlimited")
	case l.unlimited && l.scope != "":
		return l, p.fail(n, f+".scope", "must not be given with unlimited")
	case l.unlimited:
	case unit == "":
		return l, p.fail(n, f+".unit", "required: second, minute, hour, day, week, month or year")
	case !known:
		return l, p.fail(unitNode, f+".unit", "unknown unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	if l.mult > 0 && l.unlimited {
		return l, p.fail(n, f+".unit_multiplier", "must not be given with unlimited")
	}
	l.unit = sec * float64(max(l.mult, 1))
	if l.unit > maxOverrideWindow {
		return l, p.fail(n, f+".unit_multiplier", "the window (unit times unit_multiplier) must be at most ten years")
	}
	if slices.Contains(l.replaces, l.name) && l.name != "" {
		return l, p.fail(n, f+".replaces", "must not name this rate limit itself (%q)", l.name)
	}
	if l.algorithm != "" {
		a, err := engine.ParseAlgorithm(l.algorithm)
		if err != nil {
			return l, p.fail(n, f+".algorithm", "%v", err)
		}
		l.algorithm = a.String()
	}
	return l, nil
}

// policies turns the parsed limits into policies of domain.
func (p *envoyParser) policies(domain string) ([]quota.Policy, error) {
	ids := make([]string, len(p.limits))
	taken := map[string]bool{}
	byName := map[string][]string{}
	for i, l := range p.limits {
		ids[i] = policyID(domain, l.path, taken)
		if l.name != "" {
			byName[l.name] = append(byName[l.name], ids[i])
		}
	}
	out := make([]quota.Policy, 0, len(p.limits))
	for i, l := range p.limits {
		pol := quota.Policy{
			ID:    ids[i],
			Match: quota.Match{Domain: domain, Descriptors: l.path},
			Mode:  quota.ModeEnforce,
			Class: quota.ClassQuota,
			Scope: quota.ScopeRegion,
		}
		if !p.longest {
			// Policies in file order: patterns are tried in it.
			pol.Match.Order = i + 1
		}
		if l.scope != "" {
			pol.Scope = l.scope
		}
		desc := fmt.Sprintf("envoyproxy/ratelimit %s %s", filepath.Base(p.file), l.field)
		if !strings.ContainsFunc(desc, func(r rune) bool { return r == 0xfffd }) && len(desc) <= 1024 {
			pol.Description = desc
		}
		// An unlimited descriptor is answered unlimited whatever its
		// shadow_mode, as envoyproxy/ratelimit answers it. A descriptor
		// that limits nothing is an unlimited shadow policy: a shadow
		// policy changes no answer, so it is answered as if nothing had
		// matched, yet it is matched, so no pattern or key-only
		// descriptor after it applies.
		if l.shadow && !l.unlimited || l.open {
			pol.Mode = quota.ModeShadow
		}
		for _, name := range l.replaces {
			for _, id := range byName[name] {
				if id != pol.ID && !slices.Contains(pol.Replaces, id) {
					pol.Replaces = append(pol.Replaces, id)
				}
			}
		}
		sort.Strings(pol.Replaces)
		switch {
		case l.unlimited:
			pol.Unlimited = true
		case l.rpu == 0 || l.algorithm == "" || l.algorithm == engine.FixedWindow.String():
			pol.Algorithm, pol.Count, pol.Window = engine.FixedWindow.String(), float64(l.rpu), l.unit
		case l.algorithm == engine.TokenBucket.String() || l.algorithm == engine.LeakyBucket.String():
			pol.Algorithm, pol.RatePerSec, pol.Burst = l.algorithm, float64(l.rpu)/l.unit, float64(l.rpu)
		default:
			pol.Algorithm, pol.Count, pol.Window = l.algorithm, float64(l.rpu), l.unit
		}
		pol.CountOverLimit = p.countOver && !l.unlimited
		pol = pol.Normalize()
		if err := pol.Validate(); err != nil {
			var ve *quota.ValidationError
			reason := err.Error()
			if errors.As(err, &ve) && len(ve.Problems) > 0 {
				reason = ve.Problems[0].String()
			}
			return nil, &ConfigError{File: p.file, Line: l.line, Field: l.field, Reason: "cannot be a Sluice policy: " + reason}
		}
		out = append(out, pol)
	}
	return out, nil
}

// policyID names the policy of a descriptor path: the domain and the
// path's keys and values in lower case, other characters as '-', when
// that is a valid id not taken yet; else its first 47 characters and a
// hash of the domain and path.
func policyID(domain string, path []quota.DescriptorEntry, taken map[string]bool) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range path {
		b.WriteString("." + e.Key)
		if e.Value != "" {
			b.WriteString("_" + e.Value)
		}
	}
	raw := b.String()
	slug := []byte(strings.ToLower(raw))
	for i, c := range slug {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			slug[i] = '-'
		}
	}
	id := string(slug)
	if len(id) == 0 || id[0] == '.' || id[0] == '_' || id[0] == '-' {
		id = "d" + id
	}
	if len(id) > 64 || taken[id] {
		h := sha256.New()
		h.Write([]byte(domain))
		for _, e := range path {
			h.Write([]byte{0x1f})
			h.Write([]byte(e.Key))
			h.Write([]byte{0x1e})
			h.Write([]byte(e.Value))
		}
		id = id[:min(len(id), 47)] + "-" + hex.EncodeToString(h.Sum(nil))[:16]
	}
	taken[id] = true
	return id
}
