package quota

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestFileStoreRoundTrip(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "policies.json")
	st := NewFileStore(path)
	if _, err := st.Load(ctx); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("Load(missing) = %v, want ErrNoSnapshot", err)
	}
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Store: st, Clock: clk})
	if err := r.Seed(ctx, "system", DefaultPolicies()); err != nil {
		t.Fatal(err)
	}
	mustPut(t, r, tb("free-default", "free", 20, 40))
	if err := r.Delete(ctx, "t", "free-daily", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PutOverride(ctx, "t", Override{ID: "o1", Subject: "user:1", Policy: "pro-default", Burst: 500, ExpiresAt: clk.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := r.PutKey(ctx, "t", "sk_1", "pro"); err != nil {
		t.Fatal(err)
	}
	// A temporary file left by a crash is ignored.
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), ".policies.json.tmp-123"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	r2 := NewRegistry(RegistryConfig{Store: st, Clock: clk})
	if err := r2.Load(ctx); err != nil {
		t.Fatalf("Load = %v", err)
	}
	if !reflect.DeepEqual(r2.Snapshot(), r.Snapshot()) {
		t.Errorf("loaded %+v, want %+v", r2.Snapshot(), r.Snapshot())
	}
	q := Query{Tier: "pro", Subject: "user:1", Method: "GET", Route: "/v1/x"}
	if a, b := r.Match(q), r2.Match(q); !reflect.DeepEqual(a, b) {
		t.Errorf("loaded registry matches %+v, want %+v", b, a)
	}
	if tier, ok := r2.KeyTier(KeyID("sk_1")); !ok || tier != "pro" {
		t.Errorf("loaded KeyTier = %q, %v", tier, ok)
	}
	vs, _ := r2.Versions("free-daily")
	if len(vs) != 1 {
		t.Errorf("deleted policy's history = %d versions, want 1", len(vs))
	}
	if p, err := r2.Put(ctx, "t", tb("free-daily", "free", 1, 1), nil); err != nil || p.Version != 2 {
		t.Errorf("Put after reload of a deleted policy = v%d, %v; want v2", p.Version, err)
	}
}

func TestFileStoreCorrupt(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	good := NewFileStore(filepath.Join(dir, "good.json"))
	if err := good.Save(ctx, NewRegistry(RegistryConfig{}).Snapshot()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(good.Path())
	tests := []struct {
		name, content, want string
	}{
		{"truncated", string(data[:len(data)/2]), "corrupt"},
		{"empty", "", "corrupt"},
		{"garbage after", string(data) + "{}", "corrupt"},
		{"unknown field", `{"format":1,"policies":[],"overrides":[],"keys":[],"extra":1}`, "corrupt"},
		{"future format", `{"format":99,"policies":[],"overrides":[],"keys":[]}`, "format 99"},
	}
	for _, tt := range tests {
		path := filepath.Join(dir, tt.name+".json")
		if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := NewFileStore(path).Load(ctx)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: Load = %v, want an error naming %s and saying %q", tt.name, err, path, tt.want)
		}
	}
	// A snapshot that decodes but breaks the rules is refused by Restore,
	// and the registry keeps what it had.
	r := NewRegistry(RegistryConfig{})
	mustPut(t, r, tb("keep", "", 1, 1))
	bad := Snapshot{Format: SnapshotFormat, Policies: []PolicyHistory{{ID: "x", NextVersion: 2, Versions: []Policy{tb("x", "", 0, 1)}}}}
	if err := r.Restore(bad); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("Restore(invalid) = %v, want ErrInvalidPolicy", err)
	}
	if _, ok := r.Get("keep"); !ok {
		t.Error("a failed Restore dropped the state in force")
	}
}

const crashEnv = "QUOTA_TEST_CRASH_WRITER"

// TestFileStoreKillMidWrite runs a child process (this test binary) that
// saves new versions in a loop, kills it with SIGKILL at a random moment,
// and checks that the file loads whole, with the last version the child
// reported saved or the one it was saving. Repeated over several rounds.
func TestFileStoreKillMidWrite(t *testing.T) {
	if path := os.Getenv(crashEnv); path != "" {
		crashWriter(path)
		return
	}
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "policies.json")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	last := 0
	for round := range 8 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFileStoreKillMidWrite$")
		cmd.Env = append(os.Environ(), crashEnv+"="+path)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		killAfter := 3 + rng.IntN(30)
		saved := 0
		for n := 0; n < killAfter && sc.Scan(); n++ {
			v, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "saved "))
			if err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			saved = v
		}
		if saved == 0 {
			t.Fatalf("round %d: child saved nothing", round)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The child went on saving while this process, on a loaded
		// machine, may not have run between its last read and the kill:
		// what it reported is in the pipe until its end.
		for sc.Scan() {
			if v, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "saved ")); err == nil {
				saved = v
			}
		}
		_ = cmd.Wait()

		r := NewRegistry(RegistryConfig{Store: NewFileStore(path)})
		if err := r.Load(ctx); err != nil {
			t.Fatalf("round %d: Load after kill -9 = %v", round, err)
		}
		p, ok := r.Get("counter")
		if !ok || p.Version < saved || p.Version > saved+1 {
			t.Fatalf("round %d: loaded counter version %d, child last reported %d saved", round, p.Version, saved)
		}
		if want := fmt.Sprintf("version %d", p.Version); !strings.HasPrefix(p.Description, want) {
			t.Fatalf("round %d: version %d has description %.20q: torn state", round, p.Version, p.Description)
		}
		if p.Version < last {
			t.Fatalf("round %d: version went back from %d to %d", round, last, p.Version)
		}
		last = p.Version
	}
	tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".policies.json.tmp-*"))
	t.Logf("%d kills left a temporary file behind (killed mid-save)", len(tmps))
}

// crashWriter is the child of TestFileStoreKillMidWrite: it loads (or
// seeds) a large state and publishes new versions of "counter" forever,
// printing each version once it is saved.
func crashWriter(path string) {
	ctx := context.Background()
	r := NewRegistry(RegistryConfig{Store: NewFileStore(path)})
	if err := r.Load(ctx); errors.Is(err, ErrNoSnapshot) {
		var ps []Policy
		for i := range 300 { // about 400 KB, so that a kill often lands mid-write
			p := tb(fmt.Sprintf("filler-%d", i), fmt.Sprintf("t%d", i), 1, 1)
			p.Description = strings.Repeat("x", 1000)
			ps = append(ps, p)
		}
		if err := r.Seed(ctx, "system", ps); err != nil {
			panic(err)
		}
	} else if err != nil {
		panic(err)
	}
	for i := 0; ; i++ {
		next := 1
		if p, ok := r.Get("counter"); ok {
			next = p.Version + 1
		}
		p := tb("counter", "", float64(1+i%100), 1)
		p.Description = fmt.Sprintf("version %d %s", next, strings.Repeat("y", 900))
		got, err := r.Put(ctx, "child", p, nil)
		if err != nil {
			panic(err)
		}
		fmt.Printf("saved %d\n", got.Version)
	}
}
