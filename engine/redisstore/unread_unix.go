//go:build unix

package redisstore

import "syscall"

// peekable reports whether raw's socket has bytes to read.
func peekable(raw syscall.RawConn) bool {
	var n int
	_ = raw.Control(func(fd uintptr) {
		var buf [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}
