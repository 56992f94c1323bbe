package redisproc

import "syscall"

// sysProcAttr has redis-server killed (SIGKILL) if the process that started it dies
// without stopping it, as on SIGKILL or a test's timeout. Strictly, Linux sends the
// signal when the OS thread that started the server ends, which Go's runtime does only
// with the process (no goroutine of this package locks its thread).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
