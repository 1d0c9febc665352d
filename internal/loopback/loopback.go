// Package loopback hands out ports on 127.0.0.1 for the processes a test
// or a harness starts and tells where to listen (redis-server, daemons,
// envoyproxy/ratelimit).
//
// A port picked by listening on port 0 and closing comes from the
// kernel's ephemeral range, the range every outgoing connection and every
// other test's port-0 listener also draws from: until the process told
// to use it binds it, any of them can take it, and a daemon then finds
// another program's server at its own address. Port picks below that
// range, where only a program that names its port binds.
package loopback

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// lowest is the bottom of the range Port picks from; the top is the
// kernel's ephemeral range's start, less one.
const lowest = 10000

// defaultEphemeral is where Linux's ephemeral range starts by default,
// used when /proc does not say.
const defaultEphemeral = 32768

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Port returns a port on 127.0.0.1 that nothing listened on a moment ago
// (for UDP as well, if udp), below the kernel's ephemeral range, and that
// this process has not been given before: the picks are random, and a
// harness starting a dozen listeners would otherwise give two of them one
// port now and then. Nothing holds the port after Port returns; a caller
// that must be sure retries with a new one when the bind fails.
func Port(udp bool) (int, error) {
	top := ephemeralStart()
	if top-lowest < 1000 {
		return 0, errors.New("loopback: the ephemeral port range leaves no room below it")
	}
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := lowest + rand.IntN(top-lowest)
		if handedOut.ports[port] || !free(port, udp) {
			continue
		}
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, errors.New("loopback: no free port below the ephemeral range after 200 tries")
}

// Addr is Port as "127.0.0.1:port".
func Addr(udp bool) (string, error) {
	p, err := Port(udp)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

func free(port int, udp bool) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	if !udp {
		return true
	}
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeral
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultEphemeral
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 {
		return defaultEphemeral
	}
	return n
}
