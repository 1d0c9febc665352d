package redistest

import (
	"errors"
	"net"
	"strconv"
)

// busOffset is the distance from a cluster node's client port to its
// cluster-bus port, fixed by Redis.
const busOffset = 10000

// portPicker hands out loopback ports that were free a moment ago and that it
// has not handed out before. Nothing reserves a port after pick returns, so
// callers retry with a new port when the bind fails.
type portPicker struct {
	used map[int]bool
}

// pick returns a free port; withBus also requires port+10000 to be free, for
// a cluster node's bus.
func (pp *portPicker) pick(withBus bool) (int, error) {
	if pp.used == nil {
		pp.used = make(map[int]bool)
	}
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := !pp.used[port]
		if ok && withBus {
			ok = port+busOffset <= 65535 && !pp.used[port+busOffset]
			if ok {
				bl, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+busOffset))
				if err == nil {
					bl.Close()
				}
				ok = err == nil
			}
		}
		l.Close()
		if ok {
			pp.used[port] = true
			if withBus {
				pp.used[port+busOffset] = true
			}
			return port, nil
		}
	}
	return 0, errors.New("no free loopback port found after 200 tries")
}
