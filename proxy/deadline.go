package proxy

import (
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// LazyDeadlines returns ln with the read deadlines of the TCP connections it accepts kept
// by the listener instead of by each socket, for the proxy's server (the sidecar wraps
// its listener with it before TLS). net/http sets a read deadline on a connection
// several times a request to enforce ReadHeaderTimeout and IdleTimeout (the idle wait,
// the header read, none while the handler runs), and each deadline in the future is a
// runtime timer added, moved or removed under the poller's lock (README, Performance).
// A connection from LazyDeadlines records such a deadline in memory; one goroutine,
// running while the listener has connections, looks at them every resolution
// (resolution <= 0: 100 ms) and ends the read of each whose deadline has passed by
// setting its socket's deadline in the past. What a caller sees is net.Conn's contract,
// the deadline up to one resolution late: a Read returns os.ErrDeadlineExceeded once
// the deadline last set has passed, and a deadline set at or before now (net/http's
// end of its background read) reaches the socket at once, ending a Read blocked in
// another goroutine. Write deadlines are the socket's own. Setting a deadline with a
// monotonic reading reads the clock, even when it is far: a sweeper held up (a loaded
// process) must not make a deadline at now look like one in the future, which would end
// a blocked Read only at its next look.
//
// With maxConns above 0, at most maxConns of its connections are open at once: Accept
// waits for one to close before it takes the next from ln (they wait in the kernel's
// backlog meanwhile), as golang.org/x/net/netutil's LimitListener does, whose
// connections would hide the *net.TCPConn that the deadlines and ConnContext work on.
// Each open connection holds memory (README, Memory), which so stays bounded.
//
// Connections that are not *net.TCPConn are returned as they are, and not counted. The
// returned listener is safe for concurrent use, as are its connections, as net.Conn is.
func LazyDeadlines(ln net.Listener, resolution time.Duration, maxConns int) net.Listener {
	if resolution <= 0 {
		resolution = 100 * time.Millisecond
	}
	l := &lazyListener{Listener: ln, conns: newSweepSet(resolution, (*lazyConn).sweep), closed: make(chan struct{})}
	if maxConns > 0 {
		l.slots = make(chan struct{}, maxConns)
	}
	return l
}

// lazyListener is LazyDeadlines' listener. Its open connections are in a sweepSet,
// whose goroutine (the sweeper) runs while there is one.
type lazyListener struct {
	net.Listener
	conns *sweepSet[*lazyConn]
	// slots holds a token for each open connection when maxConns bounds them; nil
	// otherwise.
	slots     chan struct{}
	closed    chan struct{} // closed by Close: an Accept waiting for a slot returns
	closeOnce sync.Once
}

func (l *lazyListener) Accept() (net.Conn, error) {
	if l.slots != nil {
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return c, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		l.release()
		return c, nil
	}
	lc := &lazyConn{Conn: tc, ln: l}
	lc.asked.Store(noDeadline)
	l.conns.add(lc)
	return lc, nil
}

// release gives back the slot of a connection closed, or of one not taken.
func (l *lazyListener) release() {
	if l.slots != nil {
		<-l.slots
	}
}

// Close closes the listener: Accept, waiting for a slot or not, returns net.ErrClosed.
func (l *lazyListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// noDeadline is a lazyConn's deadline when there is none: later than any other.
const noDeadline = int64(1<<63 - 1)

// deadlineBase is the origin of a lazyConn's deadlines, which are nanoseconds since it
// on the monotonic clock (see deadlineOf).
var deadlineBase = time.Now()

// sinceBase returns now as a lazyConn deadline.
func sinceBase() int64 { return int64(time.Since(deadlineBase)) }

// deadlineOf returns t as a lazyConn deadline, and whether it is at or before now:
// noDeadline for the zero time; a time before 2000 (net/http's instant deadline is
// 1970) has passed, whatever the clock, and is told without reading it; else now (as
// sinceBase) plus how long until t, counted as the runtime counts a socket's deadline:
// on the monotonic clock when t has its reading, else on the wall clock from now
// (time.Unix, t.UTC(), t.Round(0)), so that a step of the wall clock before t was set
// moves it no more than it moves a socket's (saturated, as time.Time.Sub is).
func deadlineOf(t time.Time) (d int64, past bool) {
	switch {
	case t.IsZero():
		return noDeadline, false
	case t.Before(longAgo):
		return math.MinInt64, true
	case t != t.Round(0): // a monotonic reading
		d = int64(t.Sub(deadlineBase))
		return d, d <= sinceBase()
	}
	now := time.Now()
	since, left := int64(now.Sub(deadlineBase)), int64(t.Sub(now))
	if left > noDeadline-since {
		return noDeadline, false
	}
	return since + left, left <= 0
}

// longAgo is the start of 2000: a deadline before it has passed.
var longAgo = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// aLongTimeAgo is the socket's read deadline that ends its reads.
var aLongTimeAgo = time.Unix(1, 0)

// lazyConn is a connection from LazyDeadlines. Its socket has no read deadline, or one
// in the past (past) once the deadline asked for (asked) has passed. The socket's
// deadline changes under mu only, and only while asked is the deadline the change was
// decided on: a deadline asked for meanwhile is its setter's to carry to the socket. A
// socket left with a past deadline while a later one is asked for is cleared by the
// next SetReadDeadline or Read.
type lazyConn struct {
	net.Conn // a *net.TCPConn (tcp)
	ln       *lazyListener
	asked    atomic.Int64 // deadlineOf the last SetReadDeadline
	past     atomic.Bool  // the socket's read deadline is in the past (else it has none)
	closed   atomic.Bool  // Close was called
	mu       sync.Mutex
}

// SetReadDeadline records t; a t at or before now also reaches the socket, ending the
// reads at once, and a later one clears the socket's deadline if it was in the past.
func (c *lazyConn) SetReadDeadline(t time.Time) error {
	if c.closed.Load() {
		return c.Conn.SetReadDeadline(t) // the socket's error: net.ErrClosed
	}
	d, past := deadlineOf(t)
	c.asked.Store(d)
	if past {
		return c.setPast(d)
	}
	if c.past.Load() {
		return c.clearPast(d)
	}
	return nil
}

// SetDeadline sets the read deadline as SetReadDeadline does, and the write deadline.
func (c *lazyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// sweep ends c's reads if its deadline has passed at now: the sweeper's visit.
func (c *lazyConn) sweep(now time.Time) {
	n := int64(now.Sub(deadlineBase))
	if d := c.asked.Load(); d != noDeadline && n >= d && !c.past.Load() {
		_ = c.setPast(d)
	}
}

// setPast sets the socket's read deadline in the past, ending its reads, if the deadline
// asked for is still d, which has passed.
func (c *lazyConn) setPast(d int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.past.Load() || c.asked.Load() != d {
		return nil
	}
	c.past.Store(true)
	return c.Conn.SetReadDeadline(aLongTimeAgo)
}

// clearPast removes the socket's read deadline, if the deadline asked for is still d,
// which has not passed.
func (c *lazyConn) clearPast(d int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asked.Load() != d {
		return nil
	}
	c.past.Store(false)
	return c.Conn.SetReadDeadline(time.Time{})
}

// Read reads from the socket. When the socket's deadline ended the read but the deadline
// asked for has not passed (it moved on since), it clears the socket's and reads again.
func (c *lazyConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		d := c.asked.Load()
		if d != noDeadline && sinceBase() >= d {
			return n, err
		}
		if c.clearPast(d) != nil {
			return n, err
		}
	}
}

// Close closes the connection, forgets it and gives its slot back.
func (c *lazyConn) Close() error {
	if !c.closed.Swap(true) {
		c.ln.conns.remove(c)
		c.ln.release()
	}
	return c.Conn.Close()
}

// CloseWrite shuts down the writing side of the connection, as net.TCPConn's does
// (net/http uses it to close a connection gracefully).
func (c *lazyConn) CloseWrite() error { return c.tcp().CloseWrite() }

// ReadFrom writes what r has to the connection, as net.TCPConn's does (with Linux's
// splice or sendfile where it can).
func (c *lazyConn) ReadFrom(r io.Reader) (int64, error) { return c.tcp().ReadFrom(r) }

// tcp returns the TCP connection under c.
func (c *lazyConn) tcp() *net.TCPConn { return c.Conn.(*net.TCPConn) }
