//go:build linux

package main

import (
	"maps"
	"net"
	"os"
	"strings"
	"testing"
)

func TestParseSockTable(t *testing.T) {
	const tcp = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 0100007F:D431 0100007F:18EB 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0 20 4 30 10 -1
   2: 0100007F:D432 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1
   3: short row
`
	socks := map[string]sockInfo{}
	parseSockTable(strings.NewReader(tcp), false, socks)
	want := map[string]sockInfo{
		"111": {listen: true, remotePort: 0},
		"222": {remotePort: 0x18EB},
		"333": {remotePort: 0x1F90},
	}
	if !maps.Equal(socks, want) {
		t.Fatalf("parseSockTable = %v, want %v", socks, want)
	}
	redis := map[int]bool{0x18EB: true}
	for link, kind := range map[string]string{
		"socket:[111]": fdListen, "socket:[222]": fdRedis, "socket:[333]": fdTCP,
		"socket:[999]": fdOther, "pipe:[5]": fdOther, "/tmp/x.log": fdOther,
	} {
		if got := fdKind(link, socks, redis); got != kind {
			t.Errorf("fdKind(%q) = %q, want %q", link, got, kind)
		}
	}
}

// TestFDKindsOfThisProcess counts this process's own sockets: a listener,
// a connection to a port named as Redis's and one to another.
func TestFDKindsOfThisProcess(t *testing.T) {
	redisL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer redisL.Close()
	otherL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer otherL.Close()
	before, err := fdKinds(os.Getpid(), map[int]bool{redisL.Addr().(*net.TCPAddr).Port: true})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := net.Dial("tcp", redisL.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := net.Dial("tcp", otherL.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	after, err := fdKinds(os.Getpid(), map[int]bool{redisL.Addr().(*net.TCPAddr).Port: true})
	if err != nil {
		t.Fatal(err)
	}
	// The dials add one Redis connection and one other; the accept
	// queue's ends are not this process's descriptors until accepted.
	if d := after[fdRedis] - before[fdRedis]; d != 1 {
		t.Errorf("redis connections grew by %d, want 1 (%v -> %v)", d, before, after)
	}
	if d := after[fdTCP] - before[fdTCP]; d != 1 {
		t.Errorf("other TCP grew by %d, want 1 (%v -> %v)", d, before, after)
	}
	if before[fdListen] < 2 {
		t.Errorf("listeners %d, want at least the 2 opened", before[fdListen])
	}
}
