package quota

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// AuditEntry records one change.
type AuditEntry struct {
	Time time.Time `json:"time"`
	// Who is the authenticated actor the caller named (e.g. the admin
	// token's name), or "system" for seeding and expiry.
	Who string `json:"who"`
	// Action is one of policy.put, policy.rollback, policy.delete,
	// policy.seed, override.put, override.delete, override.expire, key.put,
	// key.delete.
	Action string `json:"action"`
	// Target is the policy id, override id or key id changed.
	Target string `json:"target"`
	// Before and After are the JSON of the object before and after the
	// change; absent for a creation or a deletion respectively.
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// AuditLog appends entries to an append-only JSON-lines file (one entry a
// line, fsynced) and keeps the most recent ones in memory for Last.
// It is safe for concurrent use.
type AuditLog struct {
	mu     sync.Mutex
	f      *os.File // nil: memory only
	ring   []AuditEntry
	next   int // ring write position
	full   bool
	closed bool
}

// maxAuditTail is how much of an existing file OpenAuditLog reads to fill
// its memory.
const maxAuditTail = 4 << 20

// OpenAuditLog opens (creating if needed) the log file at path and loads
// its last keep entries. path "" keeps entries in memory only. keep <= 0
// means 1000. A line torn by a crash is skipped.
func OpenAuditLog(path string, keep int) (*AuditLog, error) {
	if keep <= 0 {
		keep = 1000
	}
	a := &AuditLog{ring: make([]AuditEntry, keep)}
	if path == "" {
		return a, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	fail := func(err error) (*AuditLog, error) {
		f.Close()
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	off := max(st.Size()-maxAuditTail, 0)
	tail := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(tail, off); err != nil && err != io.EOF {
		return fail(err)
	}
	if off > 0 { // drop the partial first line
		if i := bytes.IndexByte(tail, '\n'); i >= 0 {
			tail = tail[i+1:]
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(tail))
	sc.Buffer(nil, maxAuditTail)
	for sc.Scan() {
		var e AuditEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			a.remember(e)
		}
	}
	// A crash mid-append may leave a line without its newline; end it so
	// the next entry starts on a line of its own.
	if len(tail) > 0 && tail[len(tail)-1] != '\n' {
		if _, err := f.Write([]byte{'\n'}); err != nil {
			return fail(err)
		}
	}
	a.f = f
	return a, nil
}

func (a *AuditLog) remember(e AuditEntry) {
	a.ring[a.next] = e
	a.next = (a.next + 1) % len(a.ring)
	if a.next == 0 {
		a.full = true
	}
}

// Append writes e as one line and fsyncs it before returning.
func (a *AuditLog) Append(e AuditEntry) error {
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return fmt.Errorf("audit log: closed")
	}
	if a.f != nil {
		if _, err := a.f.Write(line); err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		if err := a.f.Sync(); err != nil {
			return fmt.Errorf("audit log: fsync: %w", err)
		}
	}
	a.remember(e)
	return nil
}

// Last returns up to n most recent entries, oldest first.
func (a *AuditLog) Last(n int) []AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	size := a.next
	if a.full {
		size = len(a.ring)
	}
	n = min(max(n, 0), size)
	out := make([]AuditEntry, 0, n)
	for i := n; i > 0; i-- {
		out = append(out, a.ring[(a.next-i+len(a.ring))%len(a.ring)])
	}
	return out
}

// Close closes the file.
func (a *AuditLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || a.f == nil {
		a.closed = true
		return nil
	}
	a.closed = true
	err := a.f.Close()
	a.f = nil
	return err
}
