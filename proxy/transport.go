package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdproxy/mdproxy/internal/netx"
)

// TransportOptions tunes NewTransport. Each zero field takes the default given.
type TransportOptions struct {
	// DialTimeout bounds connecting to Core. Default 5 s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for Core's response headers after the
	// request, body included, was sent; past it the client gets 504. Default 60 s.
	// Uploads are never cut by it: it starts once the body is written.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes kept-alive connections to Core idle that long. Default 90 s,
	// and at most half of BodyIdleTimeout.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost is the number of idle connections kept to Core. Default 256,
	// enough for a fleet of pollers without a new connection each poll.
	MaxIdleConnsPerHost int
	// BodyIdleTimeout bounds how long Core may make no progress on a connection while
	// a request is being sent or a response received: not reading an upload, not
	// sending the rest of an answer. The connection is then closed and the exchange
	// counted as an upstream timeout. The wait for response headers is bounded by the
	// larger of it and ResponseHeaderTimeout. Idle pooled connections are closed
	// after it too. Default 60 s; negative turns the bound off.
	BodyIdleTimeout time.Duration
	// TLSClientConfig is the TLS configuration towards an https Core: the CAs that
	// verify it, the client certificate, the server name. The transport reads it for
	// each new connection: it must not be changed once in use. nil means Go's defaults
	// (the system's roots, no client certificate). It has no effect on an http Core.
	// TLS runs over the connection DialContext returns, so the body idle bound holds
	// under it; connections to Core stay HTTP/1.1 either way.
	TLSClientConfig *tls.Config
}

// NewTransport returns the http.Transport to Core: explicit timeouts, no proxy from the
// environment (a sidecar talks to its Core directly), no transparent compression (bodies
// pass as they are), Expect: 100-continue honoured for a second so Core can refuse an
// upload before its body is sent.
func NewTransport(o TransportOptions) *http.Transport {
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ResponseHeaderTimeout == 0 {
		o.ResponseHeaderTimeout = 60 * time.Second
	}
	if o.IdleConnTimeout == 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.MaxIdleConnsPerHost == 0 {
		o.MaxIdleConnsPerHost = 256
	}
	if o.BodyIdleTimeout == 0 {
		o.BodyIdleTimeout = 60 * time.Second
	}
	dialer := &net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	idle := max(o.BodyIdleTimeout, 0)
	headers := max(idle, o.ResponseHeaderTimeout)
	if idle > 0 {
		// The pool drops an idle connection before its read deadline can close it
		// under a request just handed to it.
		o.IdleConnTimeout = min(o.IdleConnTimeout, idle/2)
	}
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &coreConn{Conn: c, idle: idle, headers: headers, closed: make(chan struct{})}, nil
		},
		ForceAttemptHTTP2:     false,
		MaxIdleConns:          o.MaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   o.MaxIdleConnsPerHost,
		IdleConnTimeout:       o.IdleConnTimeout,
		ResponseHeaderTimeout: o.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		TLSHandshakeTimeout:   o.DialTimeout,
		TLSClientConfig:       o.TLSClientConfig,
		DisableCompression:    true,
		// An upload is written to Core through the transport's buffer, in reads of the
		// client's body as large as it: net/http's 4 KiB default makes a 1 GiB upload
		// a quarter of a million writes, each with its deadline (coreConn).
		WriteBufferSize: transportBufferSize,
		ReadBufferSize:  transportBufferSize,
	}
}

// transportBufferSize is the size of the transport's write and read buffers for each
// connection to Core, in bytes: 64 KiB each, 128 KiB a connection, kept while the
// connection is pooled (MaxIdleConnsPerHost bounds them).
const transportBufferSize = 64 << 10

// earlyAnswerGrace bounds how long a failed write to Core is held back so that Core's
// answer, already on its way, wins over the write error.
const earlyAnswerGrace = 2 * time.Second

// coreConn is a connection to Core. It bounds each read and write by the body idle
// timeout, and holds back a failed write of an upload until the connection closes, so
// that Core's early answer to an upload is relayed rather than lost.
//
// Core may answer an upload before reading all of it (a bad apikey, a full scan queue,
// a file over its size limit) and close the connection. net/http's transport then
// races the write error against reading that answer and often returns the error
// (golang/go#11745): the client would get 502 instead of Core's status. Holding the
// write error until the transport's read side is done with the connection (it closes
// it after the answer, or on its own read error) lets the answer through every time.
type coreConn struct {
	net.Conn
	idle    time.Duration // each read and write; 0: none
	headers time.Duration // the wait for an answer's headers, each read until they are in
	closed  chan struct{}
	once    sync.Once

	// answering is set once the headers of Core's answer to the request on the
	// connection are in (exchange.answered): its reads are then of the body, each bounded
	// by idle. It is cleared when the connection is given a request (exchange.trace):
	// until the headers are in, each read waits up to headers, so that Core may take the
	// upstream timeout to answer whatever the body idle timeout, whether the answer's
	// headers come in one read or several (after a 1xx, a status line in parts) and
	// whether the transport's first read starts before the request's write or after.
	answering atomic.Bool

	mu    sync.Mutex
	owner *exchange // the request whose upload is on it, told when it closes; nil: none
}

func (c *coreConn) Read(p []byte) (int, error) {
	if c.idle > 0 {
		bound := c.headers
		if c.answering.Load() {
			bound = c.idle
		}
		if c.uploading() {
			// The transport's read of the answer may start after the upload's first
			// write (two goroutines): it must not cut Core's wait on a stalled client
			// sooner than Write's bound, or the client's 408 loses to a 502.
			bound = c.idle + c.headers
		}
		_ = c.Conn.SetReadDeadline(time.Now().Add(bound))
	}
	return c.Conn.Read(p)
}

func (c *coreConn) Write(p []byte) (int, error) {
	if c.idle > 0 {
		now := time.Now()
		_ = c.Conn.SetWriteDeadline(now.Add(c.idle))
		// The read side is waiting for the answer to what is being written. While
		// the client is still sending its upload, Core waits for the rest of it: a
		// client that stalls is cut by its own bound (the body idle timeout, 408)
		// before Core's wait ends, whatever the two timeouts. The wait for headers
		// once the body is sent is the transport's ResponseHeaderTimeout.
		wait := c.headers
		if c.uploading() {
			wait += c.idle
		}
		_ = c.Conn.SetReadDeadline(now.Add(wait))
	}
	n, err := c.Conn.Write(p)
	if err != nil && c.watched() {
		t := time.NewTimer(earlyAnswerGrace)
		select {
		case <-c.closed:
		case <-t.C:
		}
		t.Stop()
	}
	return n, err
}

// ReadFrom copies an upload's body from r to Core, as the transport does through its
// writer's ReadFrom: in large chunks (netx.CopyUpload), each write through Write, with
// its deadlines.
func (c *coreConn) ReadFrom(r io.Reader) (int64, error) {
	return netx.CopyUpload(writerOnly{c}, r)
}

// writerOnly hides a writer's ReadFrom from io.CopyBuffer, which would call it back.
type writerOnly struct{ io.Writer }

// Close closes the connection and tells its owner, once.
func (c *coreConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		close(c.closed)
		c.mu.Lock()
		ex := c.owner
		c.mu.Unlock()
		if ex != nil {
			ex.coreClosed()
		}
	})
	return err
}

// watch makes ex the owner told when the connection closes.
func (c *coreConn) watch(ex *exchange) {
	c.mu.Lock()
	c.owner = ex
	c.mu.Unlock()
	select {
	case <-c.closed:
		ex.coreClosed()
	default:
	}
}

// watched reports whether an upload's exchange owns the connection: only then may
// Core answer before it has read everything, and is a failed write held back. A
// failed write of anything else, such as the client's side of a TLS handshake that
// Core refused (the transport would wait for the write before it closes the
// connection), returns at once.
func (c *coreConn) watched() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owner != nil
}

// uploading reports whether the request on the connection has a body the client has
// not sent to its end yet.
func (c *coreConn) uploading() bool {
	c.mu.Lock()
	ex := c.owner
	c.mu.Unlock()
	return ex != nil && ex.bodyUnread() // ex.mu is taken after c.mu is let go: finish takes them the other way
}

// unwatch drops ex as the owner, if it still is: a connection back in the pool keeps
// no finished request alive.
func (c *coreConn) unwatch(ex *exchange) {
	c.mu.Lock()
	if c.owner == ex {
		c.owner = nil
	}
	c.mu.Unlock()
}

// coreConnOf returns the *coreConn under c (directly, or under TLS), or nil.
func coreConnOf(c net.Conn) *coreConn {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	cc, _ := c.(*coreConn)
	return cc
}
