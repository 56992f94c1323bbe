package proxy

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rcvLowatWakes: Linux wakes a read waiting on a mark when the mark drops
// (tcp_set_rcvlowat), which the batching counts on.
const rcvLowatWakes = true

// setRcvLowat sets the receive low-water mark (SO_RCVLOWAT) of the socket under rc to n
// bytes; it returns the error of either the socket's closing or setsockopt(2).
func setRcvLowat(rc syscall.RawConn, n int) error {
	return setsockopt(rc, unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
}

// setUserTimeout sets TCP_USER_TIMEOUT (tcp(7)) of the socket under rc to d, in whole
// milliseconds, at least 1; it returns the error of either the socket's closing or
// setsockopt(2).
func setUserTimeout(rc syscall.RawConn, d time.Duration) error {
	return setsockopt(rc, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(max(d.Milliseconds(), 1)))
}

// setsockopt sets the integer option opt of level to v on the socket under rc; it
// returns the error of either the socket's closing or setsockopt(2).
func setsockopt(rc syscall.RawConn, level, opt, v int) error {
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, v) }); err != nil {
		return err
	}
	return serr
}
