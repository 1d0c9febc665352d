package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// do sends one command to s on a fresh connection and returns its RESP2
// reply: a string (simple or bulk), an int64, nil, or a []any of those. A
// Redis error reply is returned as a respError. The harness talks to
// servers this way, rather than through go-redis, so its probes never
// retry, pool, log or shape the connection state the code under test sees.
// On a server started with TLS the probe speaks TLS, and on one that
// requires a password it authenticates first.
func (s *Server) do(timeout time.Duration, args ...string) (any, error) {
	return probe(s.Addr(), s.tls, s.auth, timeout, args...)
}

// probe is do for the server at addr: over TLS when tc is not nil, after
// AUTH with auth (user and password, or a password alone) when not empty.
func probe(addr string, tc *tls.Config, auth []string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if tc != nil {
		if tc.ServerName == "" {
			tc = tc.Clone()
			tc.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tconn := tls.Client(conn, tc)
		if err := tconn.Handshake(); err != nil {
			return nil, err
		}
		conn = tconn
	}
	var b strings.Builder
	writeCommand(&b, args)
	if len(auth) > 0 {
		b.Reset()
		writeCommand(&b, append([]string{"AUTH"}, auth...))
		writeCommand(&b, args)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	if len(auth) > 0 {
		if _, err := readReply(r); err != nil {
			return nil, fmt.Errorf("AUTH: %w", err)
		}
	}
	return readReply(r)
}

func writeCommand(b *strings.Builder, args []string) {
	fmt.Fprintf(b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(b, "$%d\r\n%s\r\n", len(a), a)
	}
}

// doString is do for commands whose reply is a simple or bulk string.
func (s *Server) doString(timeout time.Duration, args ...string) (string, error) {
	v, err := s.do(timeout, args...)
	if err != nil {
		return "", err
	}
	str, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: reply %v is not a string", strings.Join(args, " "), v)
	}
	return str, nil
}

// respError is an error reply from Redis, such as "ERR unknown command".
type respError string

func (e respError) Error() string { return string(e) }

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || !strings.HasSuffix(line, "\r\n") {
		return nil, fmt.Errorf("malformed RESP line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		items := make([]any, n)
		for i := range items {
			v, err := readReply(r)
			var re respError
			if err != nil && !errors.As(err, &re) {
				return nil, err
			}
			if err != nil {
				v = re
			}
			items[i] = v
		}
		return items, nil
	}
	return nil, fmt.Errorf("unknown RESP type %q", kind)
}
