package engine_test

import (
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/engine/storetest"
)

// TestMemoryStore holds the memory store to the semantics every store
// shares.
func TestMemoryStore(t *testing.T) {
	storetest.Run(t, storetest.Case{Name: "memory", New: func(t *testing.T, clock engine.Clock) storetest.Checker {
		return engine.NewMemoryStore(engine.MemoryConfig{Clock: clock})
	}})
}
