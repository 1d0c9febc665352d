package quota

import (
	"testing"
)

// TestSeedAtStart: a start seeds the configuration's content unless a
// later change replaced what it put in force before.
func TestSeedAtStart(t *testing.T) {
	pol := func(burst float64) Policy {
		return Policy{ID: "p", Algorithm: "token_bucket", RatePerSec: 1, Burst: burst, Mode: ModeEnforce}
	}
	tests := []struct {
		name        string
		maxVersions int
		history     func(t *testing.T, r *Registry) // what happened since the first seed of pol(8)
		file        Policy                          // the configuration at the restart
		want        float64                         // burst in force after it; 0 for none
	}{
		{"an admin change outlives the restart", 0, func(t *testing.T, r *Registry) { put(t, r, pol(4)) }, pol(8), 4},
		{"an admin deletion outlives it", 0, func(t *testing.T, r *Registry) {
			if err := r.Delete(t.Context(), "admin", "p", nil); err != nil {
				t.Fatal(err)
			}
		}, pol(8), 0},
		{"a file edited meanwhile wins", 0, func(t *testing.T, r *Registry) { put(t, r, pol(4)) }, pol(6), 6},
		{"an unchanged set is left alone", 0, func(*testing.T, *Registry) {}, pol(8), 8},
		{"a change set back to the file's content is left alone", 0, func(t *testing.T, r *Registry) {
			put(t, r, pol(4))
			put(t, r, pol(8))
		}, pol(8), 8},
		{"the seeded version out of the kept history: seeded again", 2, func(t *testing.T, r *Registry) {
			put(t, r, pol(4))
			put(t, r, pol(5))
		}, pol(8), 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRegistry(RegistryConfig{MaxVersions: tt.maxVersions})
			if err := r.SeedAtStart(t.Context(), "system", []Policy{pol(8)}); err != nil {
				t.Fatal(err)
			}
			tt.history(t, r)
			before := r.Snapshot()
			if err := r.SeedAtStart(t.Context(), "system", []Policy{tt.file}); err != nil {
				t.Fatal(err)
			}
			got, ok := r.Get("p")
			switch {
			case tt.want == 0 && ok:
				t.Fatalf("p in force with burst %g, want it deleted", got.Burst)
			case tt.want != 0 && (!ok || got.Burst != tt.want):
				t.Fatalf("p in force %v with burst %g, want burst %g", ok, got.Burst, tt.want)
			}
			if tt.want != tt.file.Burst && !snapshotsEqual(before, r.Snapshot()) {
				t.Fatal("a seed that kept the later change still wrote a version")
			}
		})
	}
}

// TestSeedRevertsALaterChange: Seed, unlike SeedAtStart, puts the
// configuration's content back whatever came after it (a watched file's
// change is the newer word).
func TestSeedRevertsALaterChange(t *testing.T) {
	p := Policy{ID: "p", Algorithm: "token_bucket", RatePerSec: 1, Burst: 8, Mode: ModeEnforce}
	r := NewRegistry(RegistryConfig{})
	if err := r.Seed(t.Context(), "system", []Policy{p}); err != nil {
		t.Fatal(err)
	}
	q := p
	q.Burst = 4
	put(t, r, q)
	if err := r.Seed(t.Context(), "system", []Policy{p}); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Get("p"); got.Burst != 8 {
		t.Fatalf("burst %g after Seed, want 8", got.Burst)
	}
}

func put(t *testing.T, r *Registry, p Policy) {
	t.Helper()
	if _, err := r.Put(t.Context(), "admin", p, nil); err != nil {
		t.Fatal(err)
	}
}

func snapshotsEqual(a, b Snapshot) bool {
	if len(a.Policies) != len(b.Policies) {
		return false
	}
	for i := range a.Policies {
		if a.Policies[i].NextVersion != b.Policies[i].NextVersion || a.Policies[i].Deleted != b.Policies[i].Deleted {
			return false
		}
	}
	return true
}
