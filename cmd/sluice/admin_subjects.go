package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/quota"
)

func newOverridesCmd() *cobra.Command {
	o := &adminOpts{}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the overrides in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			ovs, err := c.Overrides(cmd.Context())
			if err != nil {
				return adminError(err)
			}
			if ovs == nil {
				ovs = []quota.Override{}
			}
			return o.emit(cmd.OutOrStdout(), ovs, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "ID\tSUBJECT\tPOLICY\tCHANGE\tEXPIRES")
				for _, ov := range ovs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ov.ID, ov.Subject, ov.Policy, overrideText(ov), ov.ExpiresAt.UTC().Format(time.RFC3339))
				}
			})
		},
	}

	var (
		ov        quota.Override
		expiresIn time.Duration
		expiresAt string
	)
	set := &cobra.Command{
		Use:   "set ID --subject SUBJECT --policy POLICY (--rate-per-sec|--burst|--limit|--window|--unlimited) (--expires-in|--expires-at)",
		Short: "Create or replace an override: changed limits, or an exemption, for one subject and policy until it expires",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ov.ID = args[0]
			switch {
			case expiresAt != "" && cmd.Flags().Changed("expires-in"):
				return fmt.Errorf("set: give --expires-in or --expires-at, not both")
			case expiresAt != "":
				t, err := time.Parse(time.RFC3339, expiresAt)
				if err != nil {
					return fmt.Errorf("--expires-at: want RFC 3339 such as 2030-01-02T15:04:05Z, got %q", expiresAt)
				}
				ov.ExpiresAt = t
			case expiresIn > 0:
				ov.ExpiresAt = time.Now().Add(expiresIn).UTC().Truncate(time.Second)
			default:
				return fmt.Errorf("--expires-in: must be positive, e.g. 24h (or give --expires-at)")
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			out, err := c.PutOverride(cmd.Context(), ov)
			if err != nil {
				return fmt.Errorf("override %s: %w", ov.ID, adminError(err))
			}
			return o.emit(cmd.OutOrStdout(), out, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "override %s: %s on %s for %s until %s\n", out.ID, overrideText(out), out.Policy, out.Subject, out.ExpiresAt.UTC().Format(time.RFC3339))
			})
		},
	}
	f := set.Flags()
	f.StringVar(&ov.Subject, "subject", "", `the subject as checks count it: "key:<key id>", "user:42", "ip:192.0.2.1"`)
	f.StringVar(&ov.Policy, "policy", "", "the policy it changes")
	f.Float64Var(&ov.RatePerSec, "rate-per-sec", 0, "bucket rate, units per second")
	f.Float64Var(&ov.Burst, "burst", 0, "bucket capacity")
	f.Float64Var(&ov.Count, "limit", 0, "window count")
	f.Float64Var(&ov.Window, "window", 0, "window length, seconds")
	f.BoolVar(&ov.Unlimited, "unlimited", false, "exempt the subject from the policy (no limit parameter beside it)")
	f.DurationVar(&expiresIn, "expires-in", 24*time.Hour, "how long it applies")
	f.StringVar(&expiresAt, "expires-at", "", "when it stops applying, RFC 3339 (instead of --expires-in)")

	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete an override",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.DeleteOverride(cmd.Context(), args[0]); err != nil {
				return fmt.Errorf("override %s: %w", args[0], adminError(err))
			}
			return o.emit(cmd.OutOrStdout(), map[string]any{"deleted": args[0]}, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "override %s deleted\n", args[0])
			})
		},
	}
	return adminGroup("overrides", "List, set and delete per-subject overrides (admin API)", o, list, set, del)
}

// overrideText is what an override changes, for a table cell.
func overrideText(o quota.Override) string {
	if o.Unlimited {
		return "unlimited"
	}
	var parts []string
	for _, p := range []struct {
		name string
		v    float64
	}{{"rate_per_sec", o.RatePerSec}, {"burst", o.Burst}, {"limit", o.Count}, {"window", o.Window}} {
		if p.v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%g", p.name, p.v))
		}
	}
	return orDash(strings.Join(parts, " "))
}

func newKeysCmd() *cobra.Command {
	o := &adminOpts{}
	var tier string
	put := &cobra.Command{
		Use:   "put API_KEY --tier TIER",
		Short: "Register an API key with a tier (in every region)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tier == "" {
				return fmt.Errorf("--tier: required, e.g. pro")
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			k, err := c.PutKey(cmd.Context(), args[0], tier)
			if err != nil {
				return fmt.Errorf("key: %w", adminError(err))
			}
			return o.emit(cmd.OutOrStdout(), k, func(tw *tabwriter.Writer) {
				fmt.Fprintln(tw, "KEY ID\tSUBJECT\tTIER")
				fmt.Fprintf(tw, "%s\t%s\t%s\n", k.KeyID, k.Subject, k.Tier)
			})
		},
	}
	put.Flags().StringVar(&tier, "tier", "", "the key's tier")
	del := &cobra.Command{
		Use:   "delete API_KEY",
		Short: "Forget an API key: its requests get the anonymous tier again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if err := c.DeleteKey(cmd.Context(), args[0]); err != nil {
				return fmt.Errorf("key: %w", adminError(err))
			}
			id := quota.KeyID(args[0])
			return o.emit(cmd.OutOrStdout(), map[string]any{"deleted": id}, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "key %s deleted\n", id)
			})
		},
	}
	return adminGroup("keys", "Register and forget API keys (admin API)", o, put, del)
}

func newRegionsCmd() *cobra.Command {
	o := &adminOpts{}
	cmd := &cobra.Command{
		Use:   "regions",
		Short: "Show the multi-region view: regions, members, policy revisions and skew",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			r, err := c.Regions(cmd.Context())
			if err != nil {
				return adminError(err)
			}
			return o.emit(cmd.OutOrStdout(), r, func(tw *tabwriter.Writer) { regionsTable(tw, r) })
		},
	}
	o.register(cmd.Flags())
	return cmd
}

func regionsTable(tw *tabwriter.Writer, r *client.Regions) {
	if !r.MultiRegion {
		fmt.Fprintln(tw, "single region: this daemon runs without --region")
		return
	}
	skew := "no"
	if r.PolicySkew {
		skew = "YES"
	}
	fmt.Fprintf(tw, "node %s of region %s, epoch %d, policy revision %d, policy skew %s\n\n", r.Node, r.Region, r.Epoch, r.PolicyRevision, skew)
	fmt.Fprintln(tw, "REGION\tLIVE\tNODES\tLAST REPORT\tKEYS\tREVISIONS")
	for _, ri := range r.Regions {
		last := "-"
		if !ri.LastReport.IsZero() {
			last = ri.LastReport.UTC().Format(time.RFC3339)
		}
		revs := make([]string, len(r.PolicyRevisions[ri.Region]))
		for i, v := range r.PolicyRevisions[ri.Region] {
			revs[i] = fmt.Sprint(v)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%d\t%s\n", ri.Region, ri.Live, orDash(strings.Join(ri.Nodes, ",")), last, ri.LastReportKeys, orDash(strings.Join(revs, ",")))
	}
	fmt.Fprintln(tw, "\nNODE\tREGION\tADDR\tSTATE\tREVISION")
	ms := append([]client.Member(nil), r.Members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Region+"/"+ms[i].Node < ms[j].Region+"/"+ms[j].Node })
	for _, m := range ms {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", m.Node, m.Region, m.Addr, m.State, m.PolicyRevision)
	}
}

func newUsageCmd() *cobra.Command {
	o := &adminOpts{}
	var q client.UsageQuery
	cmd := &cobra.Command{
		Use:   "usage SUBJECT",
		Short: `Show a subject's state under each policy, without spending ("key:<key id>", "user:42", "ip:192.0.2.1")`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			u, err := c.Usage(cmd.Context(), args[0], q)
			if err != nil {
				return adminError(err)
			}
			return o.emit(cmd.OutOrStdout(), u, func(tw *tabwriter.Writer) {
				fmt.Fprintf(tw, "subject %s, tier %s\n\n", u.Subject, orDash(u.Tier))
				fmt.Fprintln(tw, "POLICY\tVERSION\tMODE\tLIMIT\tREMAINING\tRESET\tOVERRIDE")
				for _, p := range u.Policies {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\n", p.ID, p.Version, p.Mode, p.Limit, p.Remaining,
						(time.Duration(p.ResetMS) * time.Millisecond).String(), orDash(p.Override))
				}
				for _, e := range u.Exempt {
					fmt.Fprintf(tw, "%s\t%d\t%s\texempt\t-\t-\t%s\n", e.ID, e.Version, e.Mode, e.Override)
				}
				for _, g := range u.GlobalQuotas {
					fmt.Fprintf(tw, "\nglobal quota %s: %d of %d used across regions\n", g.Policy, g.Used, g.Limit)
				}
			})
		},
	}
	o.register(cmd.Flags())
	cmd.Flags().StringVar(&q.Tier, "tier", "", "the subject's tier (default: the key registry's, or every policy)")
	cmd.Flags().StringVar(&q.Route, "route", "", "report exactly the policies a request to this route meets")
	cmd.Flags().StringVar(&q.Method, "method", "", "the method of that request (default GET)")
	return cmd
}
