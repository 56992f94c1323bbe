//go:build !linux

package proxy

import (
	"errors"
	"syscall"
	"time"
)

// rcvLowatWakes: elsewhere a socket's low-water mark may not wake a waiting reader
// when it drops, which the batching counts on; uploads are read without one.
const rcvLowatWakes = false

// setRcvLowat is never called where rcvLowatWakes is false; it refuses every mark.
func setRcvLowat(syscall.RawConn, int) error {
	return errors.ErrUnsupported
}

// userTimeoutBoundsZeroWindow: TCP_USER_TIMEOUT is Linux's; elsewhere each of the
// proxy's own answers sets a write deadline (see Proxy.ConnContext).
func userTimeoutBoundsZeroWindow() bool { return false }

// setUserTimeout is never called where userTimeoutBoundsZeroWindow is false; it
// refuses.
func setUserTimeout(syscall.RawConn, time.Duration) error {
	return errors.ErrUnsupported
}
