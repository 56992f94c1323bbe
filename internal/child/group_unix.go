//go:build unix

package child

import "syscall"

// groupAttr puts the child in a process group of its own whose id is its pid; on
// Linux the child is also killed should the parent die (pdeathsig, group_linux.go).
func groupAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	setPdeathsig(a)
	return a
}

// signalGroup sends sig to the process group pgid.
func signalGroup(pgid int, sig syscall.Signal) { _ = syscall.Kill(-pgid, sig) }

// killGroup kills whatever is left of the process group pgid.
func killGroup(pgid int) { _ = syscall.Kill(-pgid, syscall.SIGKILL) }
