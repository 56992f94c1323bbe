package main

import (
	"io"
	"net"
	"sync"

	"github.com/mdproxy/mdproxy/internal/netx"
)

// relay accepts connections on addr until SIGTERM or SIGINT and relays each, byte for
// byte and knowing nothing of HTTP, to a connection of its own to upstream (host:port):
// what a process between client and upstream spends moving an upload with no HTTP
// work, beside direct uploads. With splice false it copies through a buffer of
// netx.UploadChunk bytes, as mdproxy does; with splice true Go moves the
// bytes with Linux splice(2) through a pipe (net.TCPConn.ReadFrom of another TCPConn),
// never into the process: the zero-copy path the standard library offers.
func relay(addr, upstream string, splice bool) error {
	return serveUntilSignal(addr, func(ln net.Listener) error { return serveRelay(ln, upstream, splice) }, nil)
}

// serveRelay relays every connection ln accepts to upstream until ln is closed, and
// returns once the connections it relayed have ended too: the error that stopped
// Accept (net.ErrClosed after a Close).
func serveRelay(ln net.Listener, upstream string, splice bool) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		wg.Go(func() { relayConn(c.(*net.TCPConn), upstream, splice) })
	}
}

// relayConn relays c to a new connection to upstream, both ways, until both directions
// end; each end's write side is closed when its reading side reaches EOF. A direction
// that fails (a reset, a write to a closed peer) closes both connections, so that the
// other direction ends too rather than wait for bytes that will never come.
func relayConn(c *net.TCPConn, upstream string, splice bool) {
	defer c.Close()
	uc, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	u := uc.(*net.TCPConn)
	defer u.Close()
	both := func(dst, src *net.TCPConn) {
		if pipe(dst, src, splice) != nil {
			_ = c.Close()
			_ = u.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		both(c, u)
	}()
	both(u, c)
	<-done
}

// pipe copies src to dst until src's EOF or an error, then closes dst's write side. It
// returns the error that stopped the copy, nil at src's EOF.
func pipe(dst, src *net.TCPConn, splice bool) error {
	var err error
	if splice {
		_, err = dst.ReadFrom(src)
	} else {
		// Hidden behind plain interfaces, net.TCPConn's ReadFrom and WriteTo, which
		// would splice, are out of the way: io.CopyBuffer reads into buf and writes it.
		buf := make([]byte, netx.UploadChunk)
		_, err = io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	}
	if cerr := dst.CloseWrite(); err == nil {
		err = cerr
	}
	return err
}
