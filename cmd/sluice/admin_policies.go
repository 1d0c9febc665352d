package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/quota"
)

func newPoliciesCmd() *cobra.Command {
	o := &adminOpts{}
	var tier string
	list := &cobra.Command{
		Use:   "list",
		Short: "List the policies in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			ps, err := c.Policies(cmd.Context(), tier)
			if err != nil {
				return adminError(err)
			}
			if ps == nil {
				ps = []quota.Policy{}
			}
			return o.emit(cmd.OutOrStdout(), ps, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "ID\tVERSION\tMODE\tCLASS\tSCOPE\tLIMIT\tTIER\tROUTES")
				for _, p := range ps {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Version, p.Mode, p.Class, p.Scope,
						limitText(p), orDash(p.Match.Tier), orDash(strings.Join(p.Match.Routes, ",")))
				}
			})
		},
	}
	list.Flags().StringVar(&tier, "tier", "", "only the policies of this tier (its own and every-tier ones)")

	get := &cobra.Command{
		Use:   "get ID",
		Short: "Print the version in force of a policy, as the document apply takes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vs, err := o.policyVersions(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			p, ok := vs.Current()
			if !ok {
				return fmt.Errorf("policy %s is deleted (no version in force)", args[0])
			}
			// A document is JSON in both formats.
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(p)
		},
	}

	var file string
	var ifMatch int
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Publish the policy documents of a file (one object or an array) as new versions",
		Long: `Publish each policy document of FILE ("-" for standard input) as the next
version of the policy its "id" names. A document without "mode" starts in
shadow. A document the daemon refuses changes nothing, and the daemon's
problem is printed. An array is checked whole first, with the validation the
daemon applies, so that an invalid document stops it before anything is
sent; a refusal after the first document (a concurrent change) leaves the
earlier ones published, and says which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("apply: -f FILE is required (- for standard input)")
			}
			docs, err := readPolicyDocs(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("if-match") && len(docs) != 1 {
				return fmt.Errorf("--if-match: %s holds %d documents; give it for one", file, len(docs))
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			var out []quota.Policy
			for i, d := range docs {
				var im *int
				if cmd.Flags().Changed("if-match") {
					im = &ifMatch
				}
				p, err := c.PutPolicy(cmd.Context(), d.id, d.raw, im)
				if err != nil {
					err = adminError(err)
					if i > 0 {
						return fmt.Errorf("policy %s: %w (published before it: %s)", d.id, err, appliedIDs(out))
					}
					return fmt.Errorf("policy %s: %w", d.id, err)
				}
				out = append(out, p)
			}
			return o.emit(cmd.OutOrStdout(), out, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "ID\tVERSION\tMODE\tLIMIT")
				for _, p := range out {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", p.ID, p.Version, p.Mode, limitText(p))
				}
			})
		},
	}
	apply.Flags().StringVarP(&file, "file", "f", "", "file of one policy document or a JSON array of them; - reads standard input")
	apply.Flags().IntVar(&ifMatch, "if-match", 0, "publish only if this is the version in force (one document)")

	rollback := &cobra.Command{
		Use:   "rollback ID VERSION",
		Short: "Publish the content of a kept version again, as a new version",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 {
				return fmt.Errorf("rollback: VERSION must be a version number such as 2, got %q", args[1])
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			p, err := c.RollbackPolicyTo(cmd.Context(), args[0], n)
			if err != nil {
				return adminError(err)
			}
			return o.emit(cmd.OutOrStdout(), p, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "policy %s: version %d in force, the content of version %d (%s, %s)\n", p.ID, p.Version, n, p.Mode, limitText(p))
			})
		},
	}

	history := &cobra.Command{
		Use:   "history ID",
		Short: "List the kept versions of a policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vs, err := o.policyVersions(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return o.emit(cmd.OutOrStdout(), vs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "VERSION\tIN FORCE\tMODE\tCLASS\tSCOPE\tLIMIT")
				for _, p := range vs.Versions {
					mark := ""
					if p.Version == vs.InForce {
						mark = "*"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", p.Version, orDash(mark), p.Mode, p.Class, p.Scope, limitText(p))
				}
			})
		},
	}
	for _, c := range []*cobra.Command{get, rollback, history} {
		c.ValidArgsFunction = policyIDCompletion(o)
	}
	return adminGroup("policies", "List, read, publish and roll back policies (admin API)", o, list, get, apply, rollback, history)
}

// policyVersions reads the kept versions of policy id from the daemon the
// flags name (get and history).
func (o *adminOpts) policyVersions(ctx context.Context, id string) (*client.PolicyVersions, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	vs, err := c.PolicyVersions(ctx, id)
	if err != nil {
		return nil, adminError(err)
	}
	return vs, nil
}

// policyIDCompletion completes a policy id from the daemon's list.
func policyIDCompletion(o *adminOpts) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		c, err := o.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ps, err := c.Policies(cmd.Context(), "")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ids := make([]string, len(ps))
		for i, p := range ps {
			ids[i] = p.ID
		}
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}

// policyDoc is one document of an apply file: its id and its bytes as
// written, which the daemon parses itself.
type policyDoc struct {
	id  string
	raw json.RawMessage
}

// readPolicyDocs reads an apply file. One document goes to the daemon as
// written, which parses it and answers a problem if it refuses it. An
// array is checked first with quota's validation, the daemon's own, so that
// an invalid document stops the command before anything is sent.
func readPolicyDocs(file string, stdin io.Reader) ([]policyDoc, error) {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(stdin, quota.MaxPoliciesBytes+1))
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) > 0 && trimmed[0] == '{':
		var head struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(trimmed, &head); err != nil {
			return nil, fmt.Errorf("%s: not a JSON policy document: %v", file, err)
		}
		if head.ID == "" {
			return nil, fmt.Errorf("%s: id: required, the policy to publish a version of", file)
		}
		return []policyDoc{{id: head.ID, raw: trimmed}}, nil
	case len(trimmed) > 0 && trimmed[0] == '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(trimmed, &raws); err != nil {
			return nil, fmt.Errorf("%s: not a JSON array of policy documents: %v", file, err)
		}
		ps, err := quota.ParsePolicies(trimmed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(ps) == 0 {
			return nil, fmt.Errorf("%s: holds no policy document", file)
		}
		docs := make([]policyDoc, len(ps))
		for i, p := range ps {
			docs[i] = policyDoc{id: p.ID, raw: raws[i]}
		}
		return docs, nil
	}
	return nil, fmt.Errorf("%s: want a policy document (a JSON object) or an array of them", file)
}

func appliedIDs(ps []quota.Policy) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = fmt.Sprintf("%s v%d", p.ID, p.Version)
	}
	return strings.Join(s, ", ")
}

// limitText is a policy's limit in a table cell: "10/s burst 20" or
// "100 per 60s", with the algorithm.
func limitText(p quota.Policy) string {
	if p.Count > 0 || p.Window > 0 {
		return fmt.Sprintf("%s %g per %gs", p.Algorithm, p.Count, p.Window)
	}
	return fmt.Sprintf("%s %g/s burst %g", p.Algorithm, p.RatePerSec, p.Burst)
}
