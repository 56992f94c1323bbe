//go:build unix

package sidecartest

import (
	"errors"
	"syscall"
)

// ReceiveBuffer returns a net.Dialer Control function that sets a socket's receive
// buffer to size bytes before it connects: tcp(7) says a buffer size must be set before
// connect(2) to take effect. Tests use a small one so that answers a client leaves
// unread soon block the writer.
func ReceiveBuffer(size int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, size) })
		return errors.Join(err, serr)
	}
}
