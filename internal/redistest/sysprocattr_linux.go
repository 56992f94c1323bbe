package redistest

import "syscall"

// sysProcAttr has redis-server killed (SIGKILL) if the test binary dies without running
// its clean-up, as when a test's timeout panics. Strictly, Linux sends it when the OS
// thread that started the server ends, which Go's runtime does only with the process
// (no goroutine of this package locks its thread).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
