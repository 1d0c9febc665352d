//go:build linux

package redistest

import "syscall"

// sysProcAttr makes the kernel SIGKILL redis-server when the thread that
// started it dies, so a panicking or killed test binary leaves no server
// behind. Go only retires an OS thread when a goroutine exits while locked to
// it, which the testing package does not do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
