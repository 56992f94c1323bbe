//go:build !linux

package proxy

import (
	"errors"
	"syscall"
)

// setRcvLowat is Linux's alone here: elsewhere a socket's low-water mark may not wake
// a reader the way the batching counts on (it needs tcp_set_rcvlowat's wake-up when the
// mark drops), so every mark is refused and uploads are read without one.
func setRcvLowat(syscall.RawConn, int) error {
	return errors.ErrUnsupported
}
