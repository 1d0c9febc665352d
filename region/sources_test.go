package region

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/configsource"
	"github.com/sluice-rl/sluice/internal/testwait"
	"github.com/sluice-rl/sluice/quota"
)

// TestSourceChangeOutlivesRestart: a change a watched file makes on every
// daemon is a revision of the cross-region policy set, so a daemon that
// starts after it from the changed file keeps the file's limit rather than
// taking an older set from gossip.
func TestSourceChangeOutlivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("real memberlist on loopback; skipped under -short")
	}
	file := func(rate float64) []quota.Policy {
		return []quota.Policy{{ID: "f", Algorithm: "token_bucket", RatePerSec: rate, Burst: 10, Mode: quota.ModeEnforce, Scope: quota.ScopeRegion}}
	}
	rate := func(l *liveDaemon) float64 {
		p, _ := l.d.Registry().Get("f")
		return p.RatePerSec
	}
	synced := func(ls ...*liveDaemon) bool {
		rev := ls[0].regions(t).PolicyRevision
		for _, l := range ls {
			if st := l.regions(t); st.PolicySkew || st.PolicyRevision != rev || rev == 0 {
				return false
			}
		}
		return true
	}
	a := startRegionDaemon(t, "a", "a1", "", file(8))
	b := startRegionDaemon(t, "b", "b1", a.d.Gossip().Addr(), file(8))
	testwait.For(t, 10*time.Second, "two regions", func() bool { return len(a.regions(t).Members) == 2 })

	// An admin change gives the cluster a set, holding f at 8, to gossip.
	if code, body := a.admin(t, "PUT", "/v1/policies/other", `{"algorithm":"token_bucket","rate_per_sec":1,"burst":1,"mode":"enforce"}`); code != 201 && code != 200 {
		t.Fatalf("PUT = %d %s", code, body)
	}
	testwait.For(t, 10*time.Second, "the admin change everywhere", func() bool {
		_, ok := b.d.Registry().Get("other")
		return ok && synced(a, b)
	})

	// The file changes; each daemon's watcher applies it.
	for _, l := range []*liveDaemon{a, b} {
		ap := configsource.NewApplier(l.d.SourceWriter())
		if err := ap.Claim("file", file(8)); err != nil {
			t.Fatal(err)
		}
		if _, err := ap.Apply(context.Background(), "file", file(5)); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 10*time.Second, "the file change in force everywhere", func() bool {
		return synced(a, b) && rate(a) == 5 && rate(b) == 5
	})

	// Region b's daemon is replaced by one started from the file as it is.
	b.stop()
	c := startRegionDaemon(t, "b", "b2", a.d.Gossip().Addr(), file(5))
	testwait.For(t, 10*time.Second, "the new daemon to adopt the cluster's set", func() bool {
		_, ok := c.d.Registry().Get("other")
		return ok && synced(a, c)
	})
	if got := rate(c); got != 5 {
		t.Errorf("the new daemon enforces f at %g/s, want the file's 5", got)
	}
	if got := rate(a); got != 5 {
		t.Errorf("region a enforces f at %g/s, want the file's 5", got)
	}
}
