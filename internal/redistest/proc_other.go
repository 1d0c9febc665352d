//go:build !linux

package redistest

import "syscall"

// sysProcAttr returns nil: only Linux has a parent-death signal, so elsewhere
// a server can outlive a test binary that crashes before its cleanups run.
func sysProcAttr() *syscall.SysProcAttr { return nil }
