package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"syscall"
)

// ConnContext is the http.Server's ConnContext that the proxy's server must have (the
// sidecar sets it). For each client connection it:
//   - bounds, on Linux, how long the connection may hold data the client does not take:
//     TCP_USER_TIMEOUT (tcp(7)) of twice the body idle timeout, after which the kernel
//     closes a connection whose data stays unacknowledged, or unsent behind a zero
//     window, and a blocked write fails. This bounds the proxy's own answers (a limit
//     answer, a stored result, a refusal) at no cost a request; without it (other
//     systems, a socket that refuses the option, a server without this ConnContext)
//     each of those answers sets a write deadline, a runtime timer set and cleared,
//     which cost about 3.5% of the limit answers a core serves (README, Performance);
//   - keeps the connection's syscall.RawConn for batching the reads of a large upload
//     (Options.UploadReadBatch), for a plain TCP connection only: a TLS connection's
//     uploads are read without a mark.
//
// A connection that is neither TCP nor TLS over TCP (a Unix socket) is returned
// unchanged. Safe for concurrent use.
func (p *Proxy) ConnContext(ctx context.Context, c net.Conn) context.Context {
	nc := c
	if tc, ok := c.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return ctx
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return ctx
	}
	cc := &clientConn{}
	if nc == c {
		cc.rc = rc
	}
	if p.bodyIdle > 0 && setUserTimeout(rc, 2*p.bodyIdle) == nil {
		cc.writeBound = true
	}
	return context.WithValue(ctx, clientConnKey{}, cc)
}

// clientConn is what ConnContext learned of a client connection.
type clientConn struct {
	// rc is the plain TCP connection, for upload read batches; nil over TLS.
	rc syscall.RawConn
	// writeBound: the kernel closes the connection once the client has taken none of
	// its data for twice the body idle timeout (TCP_USER_TIMEOUT).
	writeBound bool
}

// clientConnKey is the context key of the *clientConn of a request's connection.
type clientConnKey struct{}

// clientConnOf returns what ConnContext learned of r's connection, or the zero
// clientConn when the server has no such ConnContext.
func clientConnOf(r *http.Request) clientConn {
	if cc, ok := r.Context().Value(clientConnKey{}).(*clientConn); ok {
		return *cc
	}
	return clientConn{}
}
