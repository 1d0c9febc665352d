package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testwait"
)

// cliRun is one run of the sluice binary as a command-line tool.
type cliRun struct {
	stdout, stderr string
	code           int
}

// cli runs bin with args and SLUICE_ADMIN_TOKEN=token (none if empty),
// and no other SLUICE_ variable of the test's environment.
func cli(t *testing.T, bin, token string, args ...string) cliRun {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if token != "" {
		cmd.Env = append(cmd.Env, "SLUICE_ADMIN_TOKEN="+token)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("sluice %v: %v", args, err)
	}
	return cliRun{out.String(), errb.String(), code}
}

// ok fails unless the run exited 0 with nothing on stderr.
func (r cliRun) ok(t *testing.T, args ...string) cliRun {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("sluice %v: exit %d, stderr %q, stdout %q", args, r.code, r.stderr, r.stdout)
	}
	return r
}

// oneLineError fails unless the run exited 1 with one line on stderr
// holding every want, and nothing on stdout.
func (r cliRun) oneLineError(t *testing.T, what string, want ...string) {
	t.Helper()
	if r.code != 1 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and one line on stderr", what, r.code, r.stdout, r.stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("%s: stderr %q does not name %q", what, r.stderr, w)
		}
	}
}

// jsonOut decodes the run's stdout, failing if it is not JSON.
func (r cliRun) jsonOut(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("-o json output is not JSON: %v\n%s", err, r.stdout)
	}
}

// TestAdminCLI runs every admin subcommand of the real binary against a
// running daemon, in table and JSON output, and its errors.
func TestAdminCLI(t *testing.T) {
	bin := buildSluice(t)
	policies := writeFile(t, "policies.json",
		`[{"id":"burst","algorithm":"token_bucket","rate_per_sec":0.01,"burst":2,"mode":"enforce"}]`)
	d := startDaemon(t, bin, "--policies", policies)
	srv := "http://" + d.addr
	tok := e2eToken
	run := func(args ...string) cliRun { t.Helper(); return cli(t, bin, tok, append(args, "--server", srv)...) }

	t.Run("policies", func(t *testing.T) {
		out := run("policies", "list").ok(t).stdout
		if !strings.Contains(out, "ID") || !strings.Contains(out, "burst") || !strings.Contains(out, "token_bucket 0.01/s burst 2") {
			t.Errorf("policies list:\n%s", out)
		}
		var ps []struct {
			ID      string `json:"id"`
			Version int    `json:"version"`
		}
		run("policies", "list", "-o", "json").ok(t).jsonOut(t, &ps)
		if len(ps) != 1 || ps[0].ID != "burst" || ps[0].Version != 1 {
			t.Fatalf("policies list -o json = %+v", ps)
		}

		v2 := writeFile(t, "v2.json", `{"id":"burst","algorithm":"token_bucket","rate_per_sec":0.01,"burst":3,"mode":"enforce"}`)
		out = run("policies", "apply", "-f", v2).ok(t).stdout
		if !strings.Contains(out, "burst") || !strings.Contains(out, " 2 ") {
			t.Errorf("policies apply:\n%s", out)
		}

		// Refused by the daemon: its problem, one line, and nothing changes.
		bad := writeFile(t, "bad.json", `{"id":"burst","algorithm":"token_bucket","rate_per_sec":0.01,"burst":0}`)
		run("policies", "apply", "-f", bad).oneLineError(t, "apply of a refused policy", "policy burst", "400", "burst: must be at least 1")
		unknown := writeFile(t, "unknown.json", `{"id":"burst","algorithm":"token_bucket","rate_per_sec":1,"burst":2,"colour":"red"}`)
		run("policies", "apply", "-f", unknown).oneLineError(t, "apply with an unknown field", "colour")
		run("policies", "apply", "-f", v2, "--if-match", "7").oneLineError(t, "apply with a stale If-Match", "412", "version in force is 2")
		array := writeFile(t, "array.json", `[{"id":"a","algorithm":"token_bucket","rate_per_sec":1,"burst":2},{"id":"b","algorithm":"token_bucket","rate_per_sec":1,"burst":-1}]`)
		run("policies", "apply", "-f", array).oneLineError(t, "apply of an array with an invalid document", "[1].burst")
		run("policies", "apply", "-f", writeFile(t, "empty.json", "")).oneLineError(t, "apply of an empty file", "want a policy document")
		run("policies", "apply").oneLineError(t, "apply without -f", "-f FILE is required")

		var doc struct {
			Version int     `json:"version"`
			Burst   float64 `json:"burst"`
		}
		run("policies", "get", "burst").ok(t).jsonOut(t, &doc)
		if doc.Version != 2 || doc.Burst != 3 {
			t.Errorf("after the refused applies, policies get = %+v, want version 2, burst 3", doc)
		}
		run("policies", "get", "nope").oneLineError(t, "get of an unknown policy", "404")

		out = run("policies", "history", "burst").ok(t).stdout
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(lines[2], "*") {
			t.Errorf("policies history: want a header and 2 versions, the second in force:\n%s", out)
		}
		var hist struct {
			InForce  int `json:"in_force"`
			Versions []struct {
				Version int `json:"version"`
			} `json:"versions"`
		}
		run("policies", "history", "burst", "-o", "json").ok(t).jsonOut(t, &hist)
		if hist.InForce != 2 || len(hist.Versions) != 2 {
			t.Errorf("policies history -o json = %+v", hist)
		}

		out = run("policies", "rollback", "burst", "1").ok(t).stdout
		if !strings.Contains(out, "version 3 in force, the content of version 1") {
			t.Errorf("policies rollback: %s", out)
		}
		run("policies", "get", "burst").ok(t).jsonOut(t, &doc)
		if doc.Version != 3 || doc.Burst != 2 {
			t.Errorf("after rollback to 1, policies get = %+v, want version 3, burst 2", doc)
		}
		run("policies", "rollback", "burst", "9").oneLineError(t, "rollback to an unknown version", "no kept version 9")
		run("policies", "rollback", "burst", "two").oneLineError(t, "rollback to a non-number", "VERSION")
	})

	t.Run("overrides", func(t *testing.T) {
		run("overrides", "set", "vip", "--subject", "user:7", "--policy", "burst", "--burst", "50", "--expires-in", "1h").ok(t)
		run("overrides", "set", "free-pass", "--subject", "user:8", "--policy", "burst", "--unlimited", "--expires-in", "1h").ok(t)
		out := run("overrides", "list").ok(t).stdout
		if !strings.Contains(out, "vip") || !strings.Contains(out, "burst=50") || !strings.Contains(out, "unlimited") {
			t.Errorf("overrides list:\n%s", out)
		}
		var os []struct {
			ID    string  `json:"id"`
			Burst float64 `json:"burst"`
		}
		run("overrides", "list", "-o", "json").ok(t).jsonOut(t, &os)
		if len(os) != 2 || os[0].ID != "free-pass" || os[1].Burst != 50 {
			t.Errorf("overrides list -o json = %+v", os)
		}
		run("overrides", "set", "bad", "--subject", "user:9", "--policy", "burst", "--unlimited", "--burst", "5").
			oneLineError(t, "an exemption with a limit", "400", "unlimited")
		run("overrides", "set", "x", "--subject", "user:9", "--policy", "burst", "--expires-at", "tomorrow").
			oneLineError(t, "a bad --expires-at", "--expires-at")
		run("overrides", "delete", "vip").ok(t)
		run("overrides", "delete", "vip").oneLineError(t, "delete of a deleted override", "override vip", "404")
	})

	t.Run("keys and usage", func(t *testing.T) {
		var k struct {
			KeyID   string `json:"key_id"`
			Subject string `json:"subject"`
			Tier    string `json:"tier"`
		}
		run("keys", "put", "sk_test_123", "--tier", "pro", "-o", "json").ok(t).jsonOut(t, &k)
		if k.Tier != "pro" || k.Subject != "key:"+k.KeyID {
			t.Errorf("keys put -o json = %+v", k)
		}
		run("keys", "put", "sk_test_123").oneLineError(t, "keys put without --tier", "--tier")

		// Spend one unit as user:7, then read it back.
		cli(t, bin, "", "check", "--server", srv, "--user", "7", "--route", "/v1/orders").ok(t)
		out := run("usage", "user:7").ok(t).stdout
		if !strings.Contains(out, "subject user:7") || !strings.Contains(out, "burst") {
			t.Errorf("usage:\n%s", out)
		}
		var u struct {
			Subject  string `json:"subject"`
			Policies []struct {
				ID        string `json:"id"`
				Remaining int64  `json:"remaining"`
			} `json:"policies"`
		}
		run("usage", k.Subject, "-o", "json").ok(t).jsonOut(t, &u)
		if u.Subject != k.Subject || len(u.Policies) != 1 || u.Policies[0].Remaining != 2 {
			t.Errorf("usage -o json = %+v", u)
		}
		run("keys", "delete", "sk_test_123").ok(t)
		run("keys", "delete", "sk_test_123").oneLineError(t, "delete of a forgotten key", "404")
	})

	t.Run("regions single", func(t *testing.T) {
		if out := run("regions").ok(t).stdout; !strings.Contains(out, "single region") {
			t.Errorf("regions: %s", out)
		}
		var r struct {
			MultiRegion *bool `json:"multi_region"`
		}
		run("regions", "-o", "json").ok(t).jsonOut(t, &r)
		if r.MultiRegion == nil || *r.MultiRegion {
			t.Errorf("regions -o json: multi_region = %v", r.MultiRegion)
		}
	})

	t.Run("errors", func(t *testing.T) {
		cli(t, bin, "wrong-token", "policies", "list", "--server", srv).oneLineError(t, "a wrong token", "403")
		cli(t, bin, "", "policies", "list", "--server", srv).oneLineError(t, "no token", "401", "SLUICE_ADMIN_TOKEN")
		tokenFile := writeFile(t, "token", e2eToken+"\n")
		cli(t, bin, "wrong-token", "policies", "list", "--server", srv, "--token-file", tokenFile).ok(t)
		cli(t, bin, "", "policies", "list", "--server", srv, "--token-file", "/nonexistent/token").oneLineError(t, "a missing token file", "--token-file")
		down := closedPort(t)
		for _, args := range [][]string{{"policies", "list"}, {"regions"}, {"usage", "user:1"}, {"check", "--user", "1", "--route", "/"}} {
			cli(t, bin, tok, append(args, "--server", down)...).oneLineError(t, "unreachable server: "+strings.Join(args, " "), strings.TrimPrefix(down, "http://"), "cannot connect")
		}
		run("policies", "list", "-o", "yaml").oneLineError(t, "-o yaml", "--output")
		cli(t, bin, tok, "policies", "list", "--server", "ftp://x").oneLineError(t, "a bad --server", "--server")
		cli(t, bin, tok, "policies", "frobnicate").oneLineError(t, "an unknown subcommand", "unknown command", "frobnicate")
		cli(t, bin, tok, "policies", "--server", srv).oneLineError(t, "no subcommand", "give a subcommand", "list")
	})

	t.Run("completion", func(t *testing.T) {
		out := cli(t, bin, "", "completion", "bash").ok(t).stdout
		if !strings.Contains(out, "bash completion") {
			t.Errorf("completion bash: %.200s", out)
		}
		// What the shell scripts run to complete `sluice policies get <TAB>`.
		out = cli(t, bin, tok, "__complete", "policies", "get", "--server", srv, "").stdout
		if !strings.HasPrefix(out, "burst\n") {
			t.Errorf("completing a policy id: %q", out)
		}
	})
}

// TestCheckCLI runs `sluice check` against a daemon and in-process: exit 0
// while allowed, 2 once limited, the headers printed, JSON that parses.
func TestCheckCLI(t *testing.T) {
	bin := buildSluice(t)
	doc := `[{"id":"burst","algorithm":"token_bucket","rate_per_sec":0.01,"burst":2,"mode":"enforce"}]`
	policies := writeFile(t, "policies.json", doc)
	d := startDaemon(t, bin, "--policies", policies)
	for _, where := range []struct {
		name string
		args []string
	}{
		{"daemon", []string{"--server", "http://" + d.addr}},
		{"in-process", []string{"--policies", policies}},
	} {
		t.Run(where.name, func(t *testing.T) {
			check := func(args ...string) cliRun {
				return cli(t, bin, "", append(append([]string{"check", "--route", "/v1/orders"}, where.args...), args...)...)
			}
			r := check("--user", "1").ok(t)
			for _, want := range []string{"200 allowed: subject user:1", `RateLimit-Policy: "burst";q=2;w=200`, `RateLimit: "burst";r=1;t=100`} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("check: stdout lacks %q:\n%s", want, r.stdout)
				}
			}
			// In-process, every run starts from a full bucket: -n shows
			// where the limit falls.
			r = check("--user", "2", "-n", "3")
			if r.code != exitLimited || !strings.Contains(r.stdout, "429 limited") || !strings.Contains(r.stdout, "Retry-After: 100") || r.stderr != "" {
				t.Errorf("check -n 3: exit %d, stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
			}
			var res []checkResult
			r = check("--user", "3", "-n", "3", "-o", "json")
			r.jsonOut(t, &res)
			if r.code != exitLimited || len(res) != 3 || res[2].Status != 429 || res[2].Headers["Retry-After"] != "100" ||
				res[0].Decision == nil || !res[0].Decision.Allowed || res[2].Problem == nil {
				t.Errorf("check -n 3 -o json: exit %d, %+v", r.code, res)
			}
			check("--user", "1", "--route", "orders").oneLineError(t, "a route without /", "route")
			check("--user", "1", "--ip", "nope").oneLineError(t, "a bad ip", "ip")
		})
	}
	cli(t, bin, "", "check", "--route", "/", "--user", "1", "--policies", "/nonexistent.json").oneLineError(t, "a missing policies file", "--policies")
	bad := writeFile(t, "bad.json", `[{"id":"x","algorithm":"token_bucket","rate_per_sec":1,"burst":0}]`)
	cli(t, bin, "", "check", "--route", "/", "--user", "1", "--policies", bad).oneLineError(t, "an invalid policies file", "burst")
}

// TestRegionsCLI shows `sluice regions` on two regions on one machine.
func TestRegionsCLI(t *testing.T) {
	bin := buildSluice(t)
	key := writeFile(t, "gossip.key", "c2x1aWNlLXRlc3QtZ29zc2lwLWtleS0zMi1ieXRlcyE=")
	var seed string
	var ds []*daemon
	for _, r := range []string{"eu", "us"} {
		port := freeGossipPort(t)
		args := []string{"--region", r, "--node", r + "-1", "--gossip-listen", "127.0.0.1:" + strconv.Itoa(port),
			"--gossip-interval", "1s", "--gossip-preset", "local", "--gossip-key-file", key}
		if seed != "" {
			args = append(args, "--join", seed)
		} else {
			seed = "127.0.0.1:" + strconv.Itoa(port)
		}
		ds = append(ds, startDaemon(t, bin, args...))
	}
	srv := "http://" + ds[0].addr
	var view struct {
		MultiRegion bool `json:"multi_region"`
		Regions     []struct {
			Region string `json:"region"`
		} `json:"regions"`
	}
	testwait.For(t, 20*time.Second, "both regions in `sluice regions -o json`", func() bool {
		cli(t, bin, e2eToken, "regions", "-o", "json", "--server", srv).ok(t).jsonOut(t, &view)
		return view.MultiRegion && len(view.Regions) == 2
	})
	out := cli(t, bin, e2eToken, "regions", "--server", srv).ok(t).stdout
	for _, want := range []string{"node eu-1 of region eu", "REGION", "us-1", "eu-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("regions table lacks %q:\n%s", want, out)
		}
	}
}

// closedPort is the URL of a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	return "http://" + freeLoopbackAddr(t)
}
