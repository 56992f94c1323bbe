//go:build !linux

package bench

import "syscall"

// redisSysProcAttr is nil where there is no parent-death signal: the case's stop alone
// stops redis-server.
func redisSysProcAttr() *syscall.SysProcAttr { return nil }
