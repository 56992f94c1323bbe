package bench

import "syscall"

// redisSysProcAttr has redis-server killed (SIGKILL) if mdbench (or a test binary) dies
// without stopping it, as on SIGKILL or a test's timeout. Strictly, Linux sends the
// signal when the OS thread that started the server ends, which Go's runtime does only
// with the process (no goroutine of this package locks its thread).
func redisSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
