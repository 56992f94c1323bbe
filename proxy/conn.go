package proxy

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"syscall"
	"time"
)

// ConnContext is the http.Server's ConnContext that the proxy's server must have (the
// sidecar sets it). For each client connection it:
//   - bounds, on Linux 5.11 or later, how long the connection may hold data the client
//     does not take: TCP_USER_TIMEOUT (tcp(7)) of twice the body idle timeout, after
//     which the kernel closes a connection whose data stays unacknowledged, or unsent
//     behind a zero window (Linux applies the option to a zero window since 5.11), and
//     a blocked write fails. This bounds the proxy's own answers (a limit answer, a
//     stored result, a refusal, Core's answer to a bridged poll, read whole first) at
//     no cost to them; without it (older kernels, other systems, a socket that refuses
//     the option, a server without this ConnContext) each of those answers sets a
//     write deadline, a runtime timer set and cleared, which cost about 3.6% of the
//     limit answers a core serves (README, Performance). During a forwarded exchange,
//     from its token to the handler's end, the option is off and the exchange's writes
//     have deadlines instead, so that a client that stops reading Core's answer is
//     counted (mdproxy_body_timeouts_total), not taken for one that left (see
//     exchange.unbindWrites);
//   - keeps the connection's socket for batching the reads of a large upload
//     (Options.UploadReadBatch), for a plain TCP connection only: a TLS connection's
//     uploads are read without a mark.
//
// The connection may come from LazyDeadlines. A connection that is neither TCP nor TLS
// over TCP (a Unix socket) is returned unchanged. Safe for concurrent use.
func (p *Proxy) ConnContext(ctx context.Context, c net.Conn) context.Context {
	nc := c
	tlsConn, isTLS := c.(*tls.Conn)
	if isTLS {
		nc = tlsConn.NetConn()
	}
	if lc, ok := nc.(*lazyConn); ok {
		nc = lc.tcp() // from LazyDeadlines
	}
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return ctx
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return ctx
	}
	cc := &clientConn{rc: rc, plain: !isTLS, bound: 2 * p.bodyIdle}
	if p.bodyIdle > 0 && userTimeoutBoundsZeroWindow() && setUserTimeout(rc, cc.bound) == nil {
		cc.writeBound = true
	}
	return context.WithValue(ctx, clientConnKey{}, cc)
}

// clientConn is what ConnContext learned of a client connection. Its requests are
// served one after another, each by the connection's goroutine (HTTP/1.1), the only
// one that reads or writes it.
type clientConn struct {
	// rc is the TCP socket under the connection, TLS or not.
	rc syscall.RawConn
	// plain: no TLS; rc may batch the reads of an upload.
	plain bool
	// bound is the connection's TCP_USER_TIMEOUT while the proxy answers on its own:
	// twice the body idle timeout.
	bound time.Duration
	// writeBound: the kernel closes the connection once the client has taken none of
	// its data for bound (TCP_USER_TIMEOUT), except during a forwarded exchange.
	writeBound bool
}

// clientConnKey is the context key of the *clientConn of a request's connection.
type clientConnKey struct{}

// clientConnOf returns what ConnContext learned of r's connection, or nil when the
// server has no such ConnContext.
func clientConnOf(r *http.Request) *clientConn {
	cc, _ := r.Context().Value(clientConnKey{}).(*clientConn)
	return cc
}
