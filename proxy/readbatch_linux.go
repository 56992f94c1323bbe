package proxy

import "syscall"

// rcvLowatWakes: Linux wakes a read waiting on a mark when the mark drops
// (tcp_set_rcvlowat), which the batching counts on.
const rcvLowatWakes = true

// setRcvLowat sets the receive low-water mark (SO_RCVLOWAT) of the socket under rc to n
// bytes; it returns the error of either the socket's closing or setsockopt(2).
func setRcvLowat(rc syscall.RawConn, n int) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, n)
	}); err != nil {
		return err
	}
	return serr
}
