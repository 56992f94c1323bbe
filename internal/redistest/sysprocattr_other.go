//go:build !linux

package redistest

import "syscall"

// sysProcAttr is nil where there is no parent-death signal: the clean-up alone stops
// redis-server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
