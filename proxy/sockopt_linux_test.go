package proxy

import (
	"net"
	"syscall"
	"testing"
)

// sockopt returns the integer option opt of level (SOL_SOCKET's SO_SNDBUF or
// SO_RCVLOWAT, IPPROTO_TCP's TCP_USER_TIMEOUT...) of c's socket.
func sockopt(c *net.TCPConn, level, opt int) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), level, opt) }); err != nil {
		return 0, err
	}
	return got, serr
}

// loopbackPair returns both ends of a TCP connection on loopback, closed by t.Cleanup.
func loopbackPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}
