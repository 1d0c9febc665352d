package quota

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestAuditLog(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenAuditLog(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	r := NewRegistry(RegistryConfig{Audit: a, Clock: clk})
	mustPut(t, r, tb("a", "", 1, 1))
	mustPut(t, r, tb("a", "", 2, 2))
	if _, err := r.Rollback(ctx, "bob", "a", nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, "carol", "a", nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		action, who   string
		before, after bool
		beforeVersion int
	}{
		{"policy.put", "test", true, true, 1},
		{"policy.rollback", "bob", true, true, 2},
		{"policy.delete", "carol", true, false, 3},
	}
	last := a.Last(10) // keeps 3
	if len(last) != len(tests) {
		t.Fatalf("Last(10) = %d entries, want %d", len(last), len(tests))
	}
	for i, tt := range tests {
		e := last[i]
		if e.Action != tt.action || e.Who != tt.who || e.Target != "a" || !e.Time.Equal(clk.Now()) ||
			(e.Before != nil) != tt.before || (e.After != nil) != tt.after {
			t.Errorf("entry %d = %+v, want %s by %s", i, e, tt.action, tt.who)
		}
		var before Policy
		if err := json.Unmarshal(e.Before, &before); err != nil || before.Version != tt.beforeVersion {
			t.Errorf("entry %d before = %s, want version %d", i, e.Before, tt.beforeVersion)
		}
	}
	if got := a.Last(1); len(got) != 1 || got[0].Action != "policy.delete" {
		t.Errorf("Last(1) = %+v, want the delete", got)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Append(AuditEntry{Action: "late"}); err == nil {
		t.Error("Append after Close succeeded")
	}

	// A torn last line (a crash mid-append) is skipped on reopen and does
	// not swallow the next entry.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"time":"2026-01-01T00:00:00Z","who":"x","act`)
	f.Close()
	a2, err := OpenAuditLog(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := a2.Last(10); len(got) != 4 || got[0].Action != "policy.put" || got[0].Before != nil {
		t.Errorf("reopened Last = %d entries starting %+v, want 4 starting with the creation", len(got), got[0])
	}
	if err := a2.Append(AuditEntry{Time: time.Now(), Who: "dave", Action: "key.put", Target: "k"}); err != nil {
		t.Fatal(err)
	}
	a2.Close()
	a3, _ := OpenAuditLog(path, 10)
	defer a3.Close()
	if got := a3.Last(1); len(got) != 1 || got[0].Who != "dave" {
		t.Errorf("entry after a torn line = %+v, want dave's", got)
	}
}
