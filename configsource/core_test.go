package configsource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/sluice-rl/sluice/quota"
)

func policy(id string, limit float64) quota.Policy {
	return quota.Policy{ID: id, Match: quota.Match{Domain: "d", Descriptors: []quota.DescriptorEntry{{Key: id}}},
		Algorithm: "fixed_window", Count: limit, Window: 60, Mode: quota.ModeEnforce}
}

func TestDiff(t *testing.T) {
	inForce := map[string]quota.Policy{
		"a": policy("a", 1).Normalize(), "b": policy("b", 2).Normalize(), "admin": policy("admin", 3).Normalize(), "other": policy("other", 4).Normalize(),
	}
	owners := map[string]string{"a": "files", "b": "files", "gone": "files", "other": "xds"}
	get := func(id string) (quota.Policy, bool) { p, ok := inForce[id]; return p, ok }
	tests := []struct {
		name    string
		want    []quota.Policy
		put     []string
		del     []string
		owner   string // an *OwnerError naming this owner
		changed bool
	}{
		{name: "unchanged", want: []quota.Policy{policy("a", 1), policy("b", 2)}},
		{name: "one changed", want: []quota.Policy{policy("a", 1), policy("b", 20)}, put: []string{"b"}},
		{name: "one removed", want: []quota.Policy{policy("a", 1)}, del: []string{"b"}},
		{name: "all removed", want: nil, del: []string{"a", "b"}},
		{name: "one added", want: []quota.Policy{policy("a", 1), policy("b", 2), policy("c", 5)}, put: []string{"c"}},
		{name: "an admin API policy taken over", want: []quota.Policy{policy("a", 1), policy("b", 2), policy("admin", 30)}, put: []string{"admin"}},
		{name: "another source's policy", want: []quota.Policy{policy("other", 4)}, owner: "xds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Diff("files", owners, get, tt.want)
			if tt.owner != "" {
				var oe *OwnerError
				if !errors.As(err, &oe) || oe.Owner != tt.owner {
					t.Fatalf("Diff = %v, want an OwnerError naming %s", err, tt.owner)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var put []string
			for _, q := range p.Put {
				put = append(put, q.ID)
			}
			if !slices.Equal(put, tt.put) || !slices.Equal(p.Delete, tt.del) {
				t.Errorf("Diff = put %v delete %v, want put %v delete %v", put, p.Delete, tt.put, tt.del)
			}
		})
	}
}

func TestSettle(t *testing.T) {
	tests := []struct {
		name  string
		start string // "" for none
		reads []string
		done  []bool // Done after an applied read
		want  []bool
	}{
		{"the start's reads are not applied again", "A", []string{"A", "A", "A"}, nil, []bool{false, false, false}},
		{"a change is applied after two equal reads, once", "A", []string{"B", "B", "B"}, nil, []bool{false, true, false}},
		{"a file changing between reads is not applied", "A", []string{"B", "C", "D", "D"}, nil, []bool{false, false, false, true}},
		{"a change back to the start is nothing", "A", []string{"B", "A", "A"}, nil, []bool{false, false, false}},
		{"no start: the first stable read is applied", "", []string{"A", "A"}, nil, []bool{false, true}},
		{"a failed apply is retried", "A", []string{"B", "B", "B", "B"}, []bool{false, false, true, true}, []bool{false, true, true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Settle
			if tt.start != "" {
				s.Taken(tt.start)
			}
			for i, fp := range tt.reads {
				got := s.Observe(fp)
				if got != tt.want[i] {
					t.Fatalf("read %d (%s): Observe = %v, want %v", i, fp, got, tt.want[i])
				}
				if got && (tt.done == nil || tt.done[i]) {
					s.Done(fp)
				}
			}
		})
	}
}

// fakeTarget is a registry whose writes can be made to fail.
type fakeTarget struct {
	ps      map[string]quota.Policy
	failDel bool
}

func (f *fakeTarget) Get(id string) (quota.Policy, bool) { p, ok := f.ps[id]; return p, ok }
func (f *fakeTarget) Seed(_ context.Context, _ string, ps []quota.Policy) error {
	for _, p := range ps {
		if p.Count < 0 {
			return &quota.ValidationError{Problems: []quota.FieldError{{Field: "limit", Reason: "negative"}}}
		}
	}
	for _, p := range ps {
		f.ps[p.ID] = p.Normalize()
	}
	return nil
}
func (f *fakeTarget) Delete(_ context.Context, _, id string, _ *int) error {
	if f.failDel {
		return errors.New("store down")
	}
	if _, ok := f.ps[id]; !ok {
		return quota.ErrNotFound
	}
	delete(f.ps, id)
	return nil
}

func (f *fakeTarget) ids() string {
	return fmt.Sprint(slices.Sorted(maps.Keys(f.ps)))
}

func TestApplier(t *testing.T) {
	ctx := t.Context()
	ft := &fakeTarget{ps: map[string]quota.Policy{"admin": policy("admin", 1)}}
	a := NewApplier(ft)
	if _, err := a.Apply(ctx, "files", []quota.Policy{policy("a", 1), policy("b", 2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, "xds", []quota.Policy{policy("x", 1)}); err != nil {
		t.Fatal(err)
	}
	if got := ft.ids(); got != "[a admin b x]" {
		t.Fatalf("after two sources, policies %s", got)
	}
	if _, err := a.Apply(ctx, "xds", []quota.Policy{policy("a", 1)}); err == nil {
		t.Fatal("xds took a policy of files")
	}
	if _, err := a.Apply(ctx, "files", []quota.Policy{policy("a", -1)}); !errors.As(err, new(*RefusedError)) {
		t.Fatalf("an invalid policy = %v, want a RefusedError", err)
	}
	if got := ft.ids(); got != "[a admin b x]" {
		t.Fatalf("a refused apply changed policies: %s", got)
	}
	ft.failDel = true
	if _, err := a.Apply(ctx, "files", []quota.Policy{policy("a", 1)}); err == nil {
		t.Fatal("a failed delete reported no error")
	}
	ft.failDel = false
	if _, err := a.Apply(ctx, "files", []quota.Policy{policy("a", 1)}); err != nil {
		t.Fatal(err)
	}
	if got := ft.ids(); got != "[a admin x]" {
		t.Fatalf("after the retry, policies %s, want [a admin x]", got)
	}
	if _, err := a.Apply(ctx, "files", nil); err != nil {
		t.Fatal(err)
	}
	if got := ft.ids(); got != "[admin x]" {
		t.Fatalf("after files emptied, policies %s, want the admin API's and xds's", got)
	}
	if n := a.Owned("files"); n != 0 {
		t.Errorf("files owns %d, want 0", n)
	}
}
