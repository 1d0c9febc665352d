package loopback

import (
	"net"
	"strconv"
	"testing"
)

func TestPortBelowEphemeralRangeFreeAndNeverRepeated(t *testing.T) {
	top := ephemeralStart()
	seen := map[int]bool{}
	for i := range 300 {
		udp := i%2 == 0
		p, err := Port(udp)
		if err != nil {
			t.Fatal(err)
		}
		if p < lowest || p >= top {
			t.Fatalf("port %d outside [%d, %d)", p, lowest, top)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		l.Close()
		if udp {
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				t.Fatalf("port %d not bindable for UDP: %v", p, err)
			}
			u.Close()
		}
	}
}

func TestPortSkipsAPortInUse(t *testing.T) {
	// A port something listens on, for TCP or for UDP, is not free.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if free(port, false) {
		t.Fatalf("free(%d) with a listener on it", port)
	}
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	uport := u.LocalAddr().(*net.UDPAddr).Port
	if free(uport, true) {
		t.Fatalf("free(%d, udp) with a UDP socket on it", uport)
	}
}

func TestAddr(t *testing.T) {
	a, err := Addr(false)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr() = %q: %v", a, err)
	}
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("Addr() = %q: port %v", a, err)
	}
}
