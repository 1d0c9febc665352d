package main

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
)

// harnessTB lets internal/redistest, written for tests, start and stop
// Redis deployments in this program: it keeps their cleanups, gives them
// directories under the run's, logs what they log, and turns a Fatal into
// a panic of fatalError that try recovers.
type harnessTB struct {
	testing.TB // nil: a method redistest does not call panics
	dir        string
	log        *slog.Logger

	mu       sync.Mutex
	cleanups []func()
}

type fatalError string

func (e fatalError) Error() string { return string(e) }

func (h *harnessTB) Helper() {}
func (h *harnessTB) Cleanup(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cleanups = append(h.cleanups, f)
}
func (h *harnessTB) TempDir() string {
	d, err := os.MkdirTemp(h.dir, "redis-")
	if err != nil {
		panic(fatalError(err.Error()))
	}
	return d
}
func (h *harnessTB) Logf(format string, a ...any) { h.log.Debug(fmt.Sprintf(format, a...)) }
func (h *harnessTB) Log(a ...any)                 { h.log.Debug(fmt.Sprint(a...)) }
func (h *harnessTB) Fatalf(format string, a ...any) {
	panic(fatalError(fmt.Sprintf(format, a...)))
}
func (h *harnessTB) Fatal(a ...any) { panic(fatalError(fmt.Sprint(a...))) }
func (h *harnessTB) Skip(a ...any)  { panic(fatalError(fmt.Sprint(a...))) }
func (h *harnessTB) Failed() bool   { return false }

// close runs the cleanups, the last registered first.
func (h *harnessTB) close() {
	h.mu.Lock()
	cs := slices.Clone(h.cleanups)
	h.cleanups = nil
	h.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		func() {
			defer func() { _ = recover() }()
			cs[i]()
		}()
	}
}

// try runs f and returns the Fatal it made, if any.
func try(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fe, ok := r.(fatalError); ok {
				err = fe
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}
