//go:build !linux

package redisproc

import "syscall"

// sysProcAttr is nil where there is no parent-death signal: only Stop or Kill stops
// redis-server.
func sysProcAttr() *syscall.SysProcAttr { return nil }
