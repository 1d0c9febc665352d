package soak

import (
	"testing"
	"time"
)

func TestLeaks(t *testing.T) {
	s := func(sec int, rss, g int64, daemons int) Sample {
		return Sample{At: t0.Add(time.Duration(sec) * time.Second), RSSBytes: rss, Goroutines: g, FDs: 40, FDKinds: map[string]int64{"redis": 10, "tcp": 30},
			RedisKeys: 100, RedisDataset: 20_000, Daemons: daemons}
	}
	// conns is s with redis Redis connections of its descriptors.
	conns := func(x Sample, redis int64) Sample {
		x.FDs += redis - x.FDKinds["redis"]
		x.FDKinds = map[string]int64{"redis": redis, "tcp": x.FDKinds["tcp"]}
		return x
	}
	// keys is s with n Redis keys and active active keys.
	keys := func(x Sample, n, active int64) Sample {
		x.RedisKeys, x.ActiveKeys = n, active
		return x
	}
	from, to := t0.Add(30*time.Second), t0.Add(100*time.Second)
	tests := []struct {
		name    string
		samples []Sample
		bad     []string
	}{
		{"back within 10%", []Sample{s(10, 100, 50, 6), s(20, 100, 50, 6), s(150, 109, 54, 6)}, nil},
		{"grew", []Sample{s(10, 100, 50, 6), s(150, 150, 50, 6)}, []string{"rss_bytes"}},
		{"goroutines grew", []Sample{s(10, 100, 50, 6), s(150, 100, 80, 6)}, []string{"goroutines"}},
		{"a sample with a daemon down does not count", []Sample{s(10, 100, 50, 6), s(150, 100, 50, 6), s(160, 10, 5, 5)}, nil},
		{"during the faults does not count", []Sample{s(10, 100, 50, 6), s(50, 900, 500, 6), s(150, 100, 50, 6)}, nil},
		{"nor the warm-up", []Sample{s(0, 10, 5, 6), s(10, 100, 50, 6), s(150, 100, 50, 6)}, nil},
		{"keys per active key grew: TTLs do not work", []Sample{s(10, 100, 50, 6), func() Sample {
			x := s(150, 100, 50, 6)
			x.RedisKeys = 300
			return x
		}()}, []string{"redis_keys_per_1000_active"}},
		{"descriptors other than Redis's grew", []Sample{s(10, 100, 50, 6), func() Sample {
			x := s(150, 100, 50, 6)
			x.FDs, x.FDKinds["tcp"] = 60, 50
			return x
		}()}, []string{"fds"}},
		{"Redis pool back at its mark from the faults", []Sample{s(10, 100, 50, 6), conns(s(50, 100, 50, 6), 20), conns(s(150, 100, 50, 6), 21)}, nil},
		{"Redis connections past the mark", []Sample{s(10, 100, 50, 6), conns(s(50, 100, 50, 6), 20), conns(s(150, 100, 50, 6), 23)}, []string{"redis_conns"}},
		{"Redis connections grew with no fault's mark", []Sample{s(10, 100, 50, 6), conns(s(150, 100, 50, 6), 12)}, []string{"redis_conns"}},
		{"a mark in a sample with a daemon down does not count", []Sample{s(10, 100, 50, 6), conns(s(50, 100, 50, 5), 40), conns(s(150, 100, 50, 6), 20)}, []string{"redis_conns"}},
		{"keys per active key grew up to one per active key", []Sample{keys(s(10, 100, 50, 6), 60, 100), keys(s(150, 100, 50, 6), 105, 100)}, nil},
		{"keys per active key past one per active key", []Sample{keys(s(10, 100, 50, 6), 60, 100), keys(s(150, 100, 50, 6), 120, 100)}, []string{"redis_keys_per_1000_active"}},
		{"keys without a TTL grew", []Sample{func() Sample {
			x := s(10, 100, 50, 6)
			x.RedisPersistent = 3
			return x
		}(), func() Sample {
			x := s(150, 100, 50, 6)
			x.RedisPersistent = 40
			return x
		}()}, []string{"redis_keys_without_ttl"}},
		{"dataset grew, active keys as before", []Sample{keys(s(10, 100, 50, 6), 100, 100), func() Sample {
			x := keys(s(150, 100, 50, 6), 100, 100)
			x.RedisDataset = 30_000
			return x
		}()}, []string{"redis_dataset_bytes"}},
		{"dataset grew with the active keys", []Sample{keys(s(10, 100, 50, 6), 100, 100), func() Sample {
			x := keys(s(150, 100, 50, 6), 100, 150)
			x.RedisDataset = 30_000
			return x
		}()}, nil},
		{"dataset as before, fewer active keys", []Sample{keys(s(10, 100, 50, 6), 100, 550), keys(s(150, 100, 50, 6), 100, 200)}, nil},
		{"dataset grew more than the active keys", []Sample{keys(s(10, 100, 50, 6), 100, 100), func() Sample {
			x := keys(s(150, 100, 50, 6), 100, 120)
			x.RedisDataset = 30_000
			return x
		}()}, []string{"redis_dataset_bytes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			figs := Leaks(tc.samples, t0, from, to, 10*time.Second, 6)
			if len(figs) != 7 {
				t.Fatalf("Leaks() = %d figures, want 7", len(figs))
			}
			var bad []string
			for _, v := range LeakViolations(figs, to) {
				bad = append(bad, v.Key)
			}
			if len(bad) != len(tc.bad) || (len(bad) > 0 && bad[0] != tc.bad[0]) {
				t.Errorf("Leaks() not OK for %v, want %v (%+v)", bad, tc.bad, figs)
			}
		})
	}
	if figs := Leaks([]Sample{s(150, 1, 1, 6)}, t0, from, to, 10*time.Second, 6); figs != nil {
		t.Errorf("Leaks() with nothing before the faults = %v, want none", figs)
	}
}

func TestCountActive(t *testing.T) {
	reqs := join(admitted(3, "eu", "api", "u1", 0), admitted(1, "us", "api", "u1", 0), admitted(1, "eu", "api", "u2", 30),
		[]Request{{Start: at(1), Region: "eu", Policy: "api", Subject: "u3", Err: "refused"}})
	samples := []Sample{{At: at(5)}, {At: at(31)}, {At: at(60)}}
	CountActive(samples, reqs, []PolicyState{policy("api", 20, false, "local")})
	for i, want := range []int64{2, 1, 0} {
		if samples[i].ActiveKeys != want {
			t.Errorf("CountActive: sample at %v has %d active keys, want %d", samples[i].At.Sub(t0), samples[i].ActiveKeys, want)
		}
	}
}
