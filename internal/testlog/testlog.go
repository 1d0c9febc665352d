// Package testlog holds what tests need to read a logger's output while
// the code under test still writes to it.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a log destination that a logger's goroutines and a test may
// use at once. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p, as bytes.Buffer.Write does.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
