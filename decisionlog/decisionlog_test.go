package decisionlog

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestTopKIsExactWithinItsCapacity(t *testing.T) {
	tk := NewTopK(4)
	for i, n := range []int{5, 3, 9, 1} {
		for range n {
			tk.Add(fmt.Sprint("s", i), 1)
		}
	}
	got := tk.Top(3)
	want := []Count{{"s2", 9, 0}, {"s0", 5, 0}, {"s1", 3, 0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Top(3) = %v, want %v", got, want)
	}
	if tk.Total() != 18 {
		t.Errorf("Total() = %d, want 18", tk.Total())
	}
}

// A subject above total/k is always kept, and its count bounds its true
// count from above with the overcount as the margin, however many light
// subjects pass through.
func TestTopKKeepsHeavyHitters(t *testing.T) {
	tests := []struct {
		k, light, heavyEvery int
	}{
		{k: 8, light: 10000, heavyEvery: 4},
		{k: 16, light: 50000, heavyEvery: 10},
		{k: 2, light: 1000, heavyEvery: 2},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc), func(t *testing.T) {
			tk := NewTopK(tc.k)
			heavy := 0
			for i := range tc.light {
				tk.Add(fmt.Sprint("light-", i), 1)
				if i%tc.heavyEvery == 0 {
					tk.Add("heavy", 1)
					heavy++
				}
			}
			top := tk.Top(1)
			if len(top) != 1 || top[0].Key != "heavy" {
				t.Fatalf("Top(1) = %v, want heavy first", top)
			}
			if c := top[0]; c.Count < uint64(heavy) || c.Count-c.Overcount > uint64(heavy) {
				t.Errorf("heavy = %d (overcount %d), true count %d not in [count-overcount, count]", c.Count, c.Overcount, heavy)
			}
			if len(tk.Top(-1)) > tc.k {
				t.Errorf("%d counters, want at most %d", len(tk.Top(-1)), tc.k)
			}
		})
	}
}

func TestWindowForgetsOldEpochs(t *testing.T) {
	t0 := time.Unix(1_000_000, 0).Truncate(time.Minute)
	w := newWindowed(4, time.Minute)
	w.add(t0, "a")
	w.add(t0.Add(30*time.Second), "a")
	w.add(t0.Add(70*time.Second), "b") // next epoch: a's epoch is the old one
	tests := []struct {
		at   time.Duration
		want string
	}{
		{80 * time.Second, "[{a 2 0} {b 1 0}]"},
		{125 * time.Second, "[{b 1 0}]"}, // a's epoch is two back
		{300 * time.Second, "[]"},
	}
	for _, tc := range tests {
		got, _ := w.top(t0.Add(tc.at), 10)
		if fmt.Sprint(got) != tc.want {
			t.Errorf("top at +%v = %v, want %s", tc.at, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error, "" for none
	}{
		{"defaults", DefaultConfig(), ""},
		{"reject rate above 1", Config{RejectRate: 1.5}, "reject rate must be in [0, 1], got 1.5"},
		{"negative allow rate", Config{RejectRate: 1, AllowRate: -0.1}, "allow rate must be in [0, 1], got -0.1"},
		{"negative queue", Config{QueueSize: -1}, "must not be negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
			if _, nerr := New(tc.cfg, nil, nil); (nerr == nil) != (tc.want == "") {
				t.Errorf("New() = %v, want an error iff Validate fails", nerr)
			}
		})
	}
}

func TestUnwritablePathFailsAtStart(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{filepath.Join(dir, "no", "such", "dir", "events.jsonl"), dir} {
		cfg := DefaultConfig()
		cfg.Path = p
		if _, err := New(cfg, nil, nil); err == nil || !strings.HasPrefix(err.Error(), "decision log: ") {
			t.Errorf("New(path %s) = %v, want a decision log error", p, err)
		}
	}
}

// Events reach the file as JSON lines, subjects hashed unless raw is asked
// for; a full queue drops and counts without blocking.
func TestStreamWritesSampledEvents(t *testing.T) {
	for _, raw := range []bool{false, true} {
		t.Run(fmt.Sprint("raw=", raw), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "events.jsonl")
			cfg := DefaultConfig()
			cfg.Path, cfg.RawSubjects, cfg.AllowRate, cfg.HashKey = path, raw, 0, []byte("k")
			reg := prometheus.NewRegistry()
			l, err := New(cfg, nil, reg)
			if err != nil {
				t.Fatal(err)
			}
			if !l.Sample(true) || l.Sample(false) {
				t.Fatalf("Sample(limited) = %v, Sample(allowed) = %v at rates 1 and 0", l.Sample(true), l.Sample(false))
			}
			l.Write(Event{Subject: "user:alice", Decision: "allowed", WouldReject: []string{"shadow-p"}, Route: "/v1/x"}, true)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- l.Run(ctx) }()
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			var got []Event
			for sc.Scan() {
				var e Event
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				got = append(got, e)
			}
			if len(got) != 1 {
				t.Fatalf("%d events, want 1", len(got))
			}
			e := got[0]
			if raw && (e.Subject != "user:alice" || e.SubjectHash != "") || !raw && (e.Subject != "" || e.SubjectHash != l.Hash("user:alice") || len(e.SubjectHash) != 16) {
				t.Errorf("subject %q hash %q, want raw=%v", e.Subject, e.SubjectHash, raw)
			}
			if len(e.WouldReject) != 1 || e.WouldReject[0] != "shadow-p" || e.SampleRate != 1 {
				t.Errorf("event %+v, want would_reject [shadow-p] at rate 1", e)
			}
			if n := counterValue(t, l.written); n != 1 {
				t.Errorf("written = %v, want 1", n)
			}
		})
	}
}

func TestFullQueueDropsAndCounts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Path, cfg.QueueSize = filepath.Join(t.TempDir(), "e.jsonl"), 2
	l, err := New(cfg, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		l.Write(Event{Subject: "s"}, true) // no writer running: the queue fills
	}
	if n := counterValue(t, l.droppedFull); n != 3 {
		t.Errorf("dropped = %v, want 3", n)
	}
}

func TestSampleRate(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Path, cfg.RejectRate, cfg.AllowRate = "-", 0.5, 0.01
	l, err := New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	rej, all := 0, 0
	for range n {
		if l.Sample(true) {
			rej++
		}
		if l.Sample(false) {
			all++
		}
	}
	// Six standard deviations of a binomial either side.
	if rej < 9576 || rej > 10424 {
		t.Errorf("%d of %d limited sampled at 0.5", rej, n)
	}
	if all < 115 || all > 285 {
		t.Errorf("%d of %d allowed sampled at 0.01", all, n)
	}
}

func TestTopListsByPolicyAndKind(t *testing.T) {
	l, err := New(DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	for range 3 {
		l.Limited(now, "shadow", KindWouldReject, "user:a")
	}
	l.Limited(now, "shadow", KindWouldReject, "user:b")
	l.Limited(now, "login", KindRejected, "ip:192.0.2.1")
	got := l.Top(now, "shadow", 1)
	if len(got) != 1 || got[0].Kind != KindWouldReject || got[0].Total != 4 || len(got[0].Subjects) != 1 ||
		got[0].Subjects[0].Subject != "user:a" || got[0].Subjects[0].Count != 3 || got[0].Subjects[0].SubjectHash != l.Hash("user:a") {
		t.Errorf("Top(shadow, 1) = %+v, want user:a 3 of 4", got)
	}
	if all := l.Top(now, "", 10); len(all) != 2 || all[0].Policy != "login" {
		t.Errorf("Top(all) = %+v, want login then shadow", all)
	}
	if later := l.Top(now.Add(2*l.Window()), "", 10); len(later) != 0 {
		t.Errorf("Top two windows later = %+v, want nothing", later)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
