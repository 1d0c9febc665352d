package live

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/sluice-rl/sluice/internal/redistest"
)

// startRedis runs a throwaway redis-server (no persistence) on a free
// loopback port and returns once it answers; Close stops it.
func startRedis() (*redistest.Process, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("live store redis: redis-server is not on PATH")
	}
	p, err := redistest.Launch(bin)
	if err != nil {
		return nil, fmt.Errorf("live store redis: %w", err)
	}
	return p, nil
}
