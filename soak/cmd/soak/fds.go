package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// The kinds of open descriptor fdKinds tells apart: a leak of one kind
// reads differently from another's (a Redis pool that grew to its
// high-water mark after a failover is not a socket left open per request).
const (
	fdRedis  = "redis"  // TCP to a Redis server or Sentinel of the deployment
	fdListen = "listen" // listening TCP sockets
	fdTCP    = "tcp"    // every other TCP socket (clients, gossip streams)
	fdUDP    = "udp"
	fdOther  = "other" // files, pipes, epoll, Unix sockets
)

// fdKinds counts pid's open descriptors by kind, a socket's kind read from
// the process's view of /proc/net/tcp{,6} and udp{,6} by inode; redis holds
// the ports of the deployment's Redis processes.
func fdKinds(pid int, redis map[int]bool) (map[string]int64, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	socks := map[string]sockInfo{}
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6"} {
		fh, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue // no IPv6, say
		}
		parseSockTable(fh, strings.HasPrefix(f, "udp"), socks)
		fh.Close()
	}
	out := map[string]int64{}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		out[fdKind(link, socks, redis)]++
	}
	return out, nil
}

// sockInfo is one row of /proc/net/{tcp,udp}: the remote port and whether
// the socket listens.
type sockInfo struct {
	udp        bool
	listen     bool
	remotePort int
}

// parseSockTable adds the rows of one /proc/net/{tcp,udp}{,6} table to
// socks, keyed by inode. Rows it cannot read are skipped.
func parseSockTable(r io.Reader, udp bool, socks map[string]sockInfo) {
	sc := bufio.NewScanner(r)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		_, rp, ok := strings.Cut(f[2], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseInt(rp, 16, 32)
		if err != nil {
			continue
		}
		socks[f[9]] = sockInfo{udp: udp, listen: !udp && f[3] == "0A", remotePort: int(port)}
	}
}

// fdKind is the kind of the descriptor whose /proc/PID/fd link is link.
func fdKind(link string, socks map[string]sockInfo, redis map[int]bool) string {
	inode, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return fdOther
	}
	s, ok := socks[strings.TrimSuffix(inode, "]")]
	switch {
	case !ok:
		return fdOther // a Unix socket
	case s.udp:
		return fdUDP
	case s.listen:
		return fdListen
	case redis[s.remotePort]:
		return fdRedis
	}
	return fdTCP
}
