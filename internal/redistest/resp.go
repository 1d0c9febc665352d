package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// do sends one command on a fresh connection and returns its RESP2 reply:
// a string (simple or bulk), an int64, nil, or a []any of those. A Redis error
// reply is returned as a respError. The harness talks to servers this way,
// rather than through go-redis, so its probes never retry, pool, log or shape
// the connection state the code under test sees.
func do(addr string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// doString is do for commands whose reply is a simple or bulk string.
func doString(addr string, timeout time.Duration, args ...string) (string, error) {
	v, err := do(addr, timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: reply %v is not a string", strings.Join(args, " "), v)
	}
	return s, nil
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
