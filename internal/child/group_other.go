//go:build unix && !linux

package child

import "syscall"

func setPdeathsig(*syscall.SysProcAttr) {}
