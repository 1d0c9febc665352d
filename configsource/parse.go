package configsource

import (
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
func asError(file string, err error) *Error { return rls.AsConfigError(file, err) }

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
		efs := make([]rls.EnvoyFile, len(files))
		for i, f := range files {
			efs[i] = rls.EnvoyFile{Path: f.Path, Data: f.Data}
		}
		return rls.ParseEnvoyConfigs(efs, merge)
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
