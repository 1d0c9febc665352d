//go:build !unix

package redisstore

import "syscall"

// peekable reports false: without a way to peek at a socket, a reply is
// never known to wait unread.
func peekable(syscall.RawConn) bool { return false }
