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
	// ResponseHeaderTimeout bounds the wait for Core's headers once the request is sent
	// (then 504); it never cuts an upload. Default 60 s.
	ResponseHeaderTimeout time.Duration
	// IdleConnTimeout closes pooled connections idle that long. Default 90 s, at most half of
	// BodyIdleTimeout.
	IdleConnTimeout time.Duration
	// MaxIdleConnsPerHost is the number of idle connections kept to Core. Default 256,
	// enough for a fleet of pollers without a new connection each poll.
	MaxIdleConnsPerHost int
	// BodyIdleTimeout bounds each read and write on Core's connection once a response is
	// under way (the wait for headers: the larger of it and ResponseHeaderTimeout); the
	// exchange is then cut and counted as an upstream timeout. Default 60 s; negative: off.
	BodyIdleTimeout time.Duration
	// TLSClientConfig is the TLS configuration towards an https Core, read for each new
	// connection (not to be changed once in use); nil: Go's defaults. Connections stay
	// HTTP/1.1.
	TLSClientConfig *tls.Config
}

// NewTransport returns the transport to Core: explicit timeouts, no proxy from the
// environment, no transparent compression, Expect: 100-continue honoured for a second.
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
		// Idle connections leave the pool before their read deadline could cut a new request.
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
		// Buffers as large as an upload's reads: net/http's 4 KiB makes many small writes.
		WriteBufferSize: transportBufferSize,
		ReadBufferSize:  transportBufferSize,
	}
}

// transportBufferSize is each buffer of a connection to Core, in bytes.
const transportBufferSize = 64 << 10

// earlyAnswerGrace bounds how long a failed write to Core is held back for Core's answer.
const earlyAnswerGrace = 2 * time.Second

// coreConn is a connection to Core: each read and write bounded by the body idle timeout,
// and a failed write of an upload held back until the connection closes, so that Core's
// early answer to an upload (a bad apikey, a full queue) is relayed rather than lost to
// the transport's race of the write error against the answer (golang/go#11745).
type coreConn struct {
	net.Conn
	idle    time.Duration // each read and write; 0: none
	headers time.Duration // the wait for an answer's headers, each read until they are in
	closed  chan struct{}
	once    sync.Once

	// answering: the headers of the answer are in (exchange.answered), reads are of its body,
	// each bounded by idle; until then each read waits up to headers.
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
			// A read started before the upload's write must not cut Core's wait on a stalled
			// client sooner than Write does (the client's 408 would lose to a 502).
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
		// While the client still sends its upload, Core waits for the rest: the client's own
		// bound (408) comes first.
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

// ReadFrom copies an upload to Core in large chunks (netx.CopyUpload), through Write.
func (c *coreConn) ReadFrom(r io.Reader) (int64, error) {
	return netx.CopyUpload(writerOnly{c}, r)
}

// writerOnly hides ReadFrom from io.CopyBuffer, which would call it back.
type writerOnly struct{ io.Writer }

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

// watched reports whether an upload owns the connection: only then is a failed write held
// back (a refused TLS handshake is not).
func (c *coreConn) watched() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owner != nil
}

func (c *coreConn) uploading() bool {
	c.mu.Lock()
	ex := c.owner
	c.mu.Unlock()
	return ex != nil && ex.bodyUnread() // ex.mu is taken after c.mu is let go: finish takes them the other way
}

// unwatch drops ex as the owner, so a pooled connection keeps no finished request.
func (c *coreConn) unwatch(ex *exchange) {
	c.mu.Lock()
	if c.owner == ex {
		c.owner = nil
	}
	c.mu.Unlock()
}

func coreConnOf(c net.Conn) *coreConn {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		c = nc.NetConn()
	}
	cc, _ := c.(*coreConn)
	return cc
}
