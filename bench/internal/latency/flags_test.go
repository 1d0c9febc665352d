package latency

import (
	"flag"
	"io"
	"testing"
	"time"
)

func TestFlagsRegister(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f Flags
	f.Register(fs, "call", "calls back to back on every stream")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := Flags{Users: 10000, Duration: 10 * time.Second, Warmup: time.Second, Timeout: 5 * time.Second}
	if f != want {
		t.Errorf("defaults = %+v, want %+v", f, want)
	}
	if err := fs.Parse([]string{"-users", "3", "-rate", "250", "-duration", "2s", "-warmup", "0", "-timeout", "1s"}); err != nil {
		t.Fatal(err)
	}
	want = Flags{Users: 3, Rate: 250, Duration: 2 * time.Second, Timeout: time.Second}
	if f != want {
		t.Errorf("parsed = %+v, want %+v", f, want)
	}
	if got, want := fs.Lookup("rate").Usage, "offered calls per second; 0 calls back to back on every stream (closed loop)"; got != want {
		t.Errorf("-rate usage = %q, want %q", got, want)
	}
	if got, want := fs.Lookup("timeout").Usage, "per-call deadline; a call past it counts as an error"; got != want {
		t.Errorf("-timeout usage = %q, want %q", got, want)
	}
}

func TestFlagsValidate(t *testing.T) {
	ok := Flags{Users: 1, Duration: time.Second}
	tests := []struct {
		name string
		f    func(*Flags)
		want string
	}{
		{"in range", func(*Flags) {}, ""},
		{"open loop", func(f *Flags) { f.Rate = 100 }, ""},
		{"no users", func(f *Flags) { f.Users = 0 }, "-users: must be at least 1"},
		{"negative rate", func(f *Flags) { f.Rate = -1 }, "-rate: must not be negative"},
		{"no duration", func(f *Flags) { f.Duration = 0 }, "-duration: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := ok
			tt.f(&f)
			got := ""
			if err := f.Validate(); err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate(%+v) = %q, want %q", f, got, tt.want)
			}
		})
	}
}

func TestFlagsRun(t *testing.T) {
	f := Flags{Users: 5, Rate: 10, Duration: 3 * time.Second, Warmup: time.Second, Timeout: time.Second}
	want := RunConfig{Warmup: time.Second, Duration: 3 * time.Second, Rate: 10, Senders: 4}
	if got := f.Run(4); got != want {
		t.Errorf("Run(4) = %+v, want %+v", got, want)
	}
}
