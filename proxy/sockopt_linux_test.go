package proxy

import (
	"net"
	"syscall"
)

// sockopt returns the SOL_SOCKET option opt (SO_SNDBUF, SO_RCVLOWAT...) of c's socket.
func sockopt(c *net.TCPConn, opt int) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) }); err != nil {
		return 0, err
	}
	return got, serr
}
