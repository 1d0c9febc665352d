package configsource

import (
	"errors"
	"fmt"

	"github.com/sluice-rl/sluice/quota"
	"github.com/sluice-rl/sluice/rls"
)

// Error is configuration that cannot be put in force: the file (or xDS
// resource), the line when known, the field, and why; Error is one line.
// It is the Envoy configuration parser's own error type, so that an error
// of any source reads the same.
type Error = rls.ConfigError

// asError turns the error of parsing file into an *Error naming the file,
// the line and the field as far as err knows them.
func asError(file string, err error) *Error {
	var e *Error
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
		return &Error{File: file, Field: p.Field, Reason: reason}
	}
	return &Error{File: file, Reason: err.Error()}
}

// Parser turns the files of one source into the policies they configure.
// An error is an *Error naming the file and, where it can, the line and
// field. A Parser is pure: it reads no file and keeps nothing.
type Parser func(files Files) ([]quota.Policy, error)

// EnvoyExts are the names of envoyproxy/ratelimit configuration files in
// a directory.
var EnvoyExts = []string{".yaml", ".yml"}

// PolicyExts are the names of policy document files in a directory.
var PolicyExts = []string{".json"}

// EnvoyParser reads envoyproxy/ratelimit configuration files
// (rls.ParseEnvoyConfig). Two files may configure one domain only with
// merge, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: the domain's
// descriptors are then those of every file, and one descriptor in two
// files is an error. Without merge, a domain in two files is an error.
func EnvoyParser(merge bool) Parser {
	return func(files Files) ([]quota.Policy, error) {
		var out []quota.Policy
		domains := map[string]string{}
		ids := map[string]string{}
		for _, f := range files {
			domain, ps, err := rls.ParseEnvoyConfig(f.Path, f.Data)
			if err != nil {
				return nil, asError(f.Path, err)
			}
			if other, dup := domains[domain]; dup && !merge {
				return nil, &Error{File: f.Path, Field: "domain", Reason: fmt.Sprintf("domain %q is also configured by %s (merging domains is off)", domain, other)}
			}
			domains[domain] = f.Path
			for _, p := range ps {
				if other, dup := ids[p.ID]; dup {
					return nil, &Error{File: f.Path, Field: "descriptors", Reason: fmt.Sprintf("policy %s (domain %q) is also configured by %s", p.ID, domain, other)}
				}
				ids[p.ID] = f.Path
			}
			out = append(out, ps...)
		}
		return out, nil
	}
}

// PolicyParser reads files of policy documents, each a JSON array
// (quota.ParsePolicies). One policy id in two files is an error.
func PolicyParser(files Files) ([]quota.Policy, error) {
	var out []quota.Policy
	ids := map[string]string{}
	for _, f := range files {
		ps, err := quota.ParsePolicies(f.Data)
		if err != nil {
			return nil, asError(f.Path, err)
		}
		for i, p := range ps {
			if other, dup := ids[p.ID]; dup {
				return nil, &Error{File: f.Path, Field: fmt.Sprintf("[%d].id", i), Reason: fmt.Sprintf("policy %s is also in %s", p.ID, other)}
			}
			ids[p.ID] = f.Path
		}
		out = append(out, ps...)
	}
	return out, nil
}
