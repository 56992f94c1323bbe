package proxy

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// serveProxy serves h on a loopback httptest.Server (TLS when tls is set), with
// p.ConnContext and LazyDeadlines as the sidecar sets them when connContext is set, and
// without either otherwise; conns receives the server's side of each connection (a
// *tls.Conn over TLS), when there is room. The server is closed by t.Cleanup.
func serveProxy(t *testing.T, p *Proxy, h http.Handler, connContext, tls bool, conns chan<- net.Conn) *httptest.Server {
	t.Helper()
	front := httptest.NewUnstartedServer(h)
	if connContext {
		front.Listener = LazyDeadlines(front.Listener, testResolution, 0)
	}
	front.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		select {
		case conns <- c:
		default:
		}
		if connContext {
			return p.ConnContext(ctx, c)
		}
		return ctx
	}
	if tls {
		front.StartTLS()
	} else {
		front.Start()
	}
	t.Cleanup(front.Close)
	return front
}

// userTimeout returns the TCP_USER_TIMEOUT of c's socket, in milliseconds.
func userTimeout(t *testing.T, c net.Conn) int {
	t.Helper()
	got, err := userTimeoutOf(c)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// userTimeoutOf returns the TCP_USER_TIMEOUT of c's socket (c from LazyDeadlines or
// not), in milliseconds.
func userTimeoutOf(c net.Conn) (int, error) {
	if lc, ok := c.(*lazyConn); ok {
		c = lc.tcp()
	}
	return sockopt(c.(*net.TCPConn), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
}

// TestConnContextBoundsWrites: ConnContext sets TCP_USER_TIMEOUT to twice the body
// idle timeout on each client connection, TLS ones included (on the TCP connection
// under them), and keeps the connection for upload read batches on plain TCP only; with
// the body idle timeout off, it sets nothing.
func TestConnContextBoundsWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		idle time.Duration
		tls  bool
		want int // milliseconds
	}{
		{"plain", 700 * time.Millisecond, false, 1400},
		{"TLS", 700 * time.Millisecond, true, 1400},
		{"idle timeout off", -1, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()), BodyIdleTimeout: tc.idle})
			if err != nil {
				t.Fatal(err)
			}
			conns := make(chan net.Conn, 1)
			var seen atomic.Pointer[clientConn]
			front := serveProxy(t, p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen.Store(clientConnOf(r))
			}), true, tc.tls, conns)
			resp, err := front.Client().Get(front.URL + "/version")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			c := <-conns
			if tc.tls {
				c = c.(interface{ NetConn() net.Conn }).NetConn()
			}
			if got := userTimeout(t, c); got != tc.want {
				t.Errorf("TCP_USER_TIMEOUT = %d ms, want %d", got, tc.want)
			}
			cc := seen.Load()
			if cc.writeBound != (tc.want > 0) {
				t.Errorf("writeBound = %v, want %v", cc.writeBound, tc.want > 0)
			}
			if cc.plain == tc.tls {
				t.Errorf("connection's reads may be batched: %v, want %v (plain TCP only)", cc.plain, !tc.tls)
			}
		})
	}
}

// TestOwnAnswersToStalledReaderCut: a client that sends polls back to back and reads
// none of the limit answers has its connection closed, whether the kernel bounds the
// connection (ConnContext: TCP_USER_TIMEOUT) or each answer sets a write deadline (a
// server without ConnContext). The bucket lets the first poll through (forwarded, its
// answer Core's with a deadline of its own) and no other for 1000 s.
func TestOwnAnswersToStalledReaderCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, connContext := range []bool{true, false} {
		name := "write deadline"
		if connContext {
			name = "kernel"
		}
		t.Run(name, func(t *testing.T) {
			p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()), BodyIdleTimeout: idle,
				Limits: limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}}, nil)})
			if err != nil {
				t.Fatal(err)
			}
			front := serveProxy(t, p, p, connContext, false, nil)
			c, err := net.Dial("tcp", front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			var sent atomic.Int64
			wrote := make(chan struct{})
			go func() {
				defer close(wrote)
				batch := []byte(strings.Repeat("GET /file/0123456789abcdef HTTP/1.1\r\nHost: x\r\n\r\n", 100))
				for sent.Load() < 100000 {
					if _, err := c.Write(batch); err != nil {
						return
					}
					sent.Add(100)
				}
			}()
			// Wait until the proxy has taken no request for ten times the body idle
			// timeout: the kernel's bound is twice it, counted from when the client's
			// kernel stops taking data, which can be a second later than when the proxy
			// stops taking requests (it makes room for a while by compacting its queue).
			for last, quiet := sent.Load(), 0; quiet < 30; {
				time.Sleep(idle / 3)
				if n := sent.Load(); n != last {
					last, quiet = n, 0
				} else {
					quiet++
				}
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			answers, err := readAnswers(c)
			c.Close()
			<-wrote
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || answers >= int(sent.Load()) {
				t.Errorf("answers unread for %v: the connection still open, %d of %d requests answered (%v); want it closed",
					10*idle, answers, sent.Load(), err)
			}
		})
	}
}

// readAnswers reads c to its end and returns how many HTTP/1.1 answers came, and the
// error that ended them (nil for the connection's end).
func readAnswers(c net.Conn) (int, error) {
	data, err := io.ReadAll(c)
	return strings.Count(string(data), "HTTP/1.1 "), err
}

// TestReleaseAtLeast: the kernel's release, as uname gives it, against the first that
// applies TCP_USER_TIMEOUT to a zero window (5.11).
func TestReleaseAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v669":       true,
		"6.1.0-18-amd64":        true,
		"5.11.0":                true,
		"5.10.0-28-amd64":       false,
		"4.18.0-513.el8.x86_64": false,
		"10.0":                  true,
		"":                      false,
		"linux":                 false,
	} {
		if got := releaseAtLeast(release, 5, 11); got != want {
			t.Errorf("releaseAtLeast(%q, 5, 11) = %v, want %v", release, got, want)
		}
	}
}

// TestSetUserTimeoutRange: TCP_USER_TIMEOUT is a 32-bit count of milliseconds: a
// longer bound is set to its largest, not wrapped around to a short one; 0 turns it off.
func TestSetUserTimeoutRange(t *testing.T) {
	c, _ := loopbackPair(t)
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{600 * time.Hour, math.MaxInt32},
		{1500 * time.Microsecond, 1},
		{120 * time.Second, 120000},
		{0, 0},
	} {
		if err := setUserTimeout(rc, tc.d); err != nil {
			t.Fatalf("setUserTimeout(%v): %v", tc.d, err)
		}
		if got := userTimeout(t, c); got != tc.want {
			t.Errorf("setUserTimeout(%v): TCP_USER_TIMEOUT = %d ms, want %d", tc.d, got, tc.want)
		}
	}
}

// TestKernelBoundOffWhileRelaying: while Core's answer is relayed, the kernel's bound
// is off the client's connection, its writes bounded by their deadlines instead, and
// it is back on after: a client that stops reading Core's answer is cut by a deadline
// and counted as such (mdproxy_body_timeouts_total), where the kernel, whose clock
// runs from when the client's window closed, could cut it first, seen by the handler
// as a client that left (499).
func TestKernelBoundOffWhileRelaying(t *testing.T) {
	const idle = 300 * time.Millisecond
	during := make(chan int, 1)
	conns, fronts := make(chan net.Conn, 1), make(chan net.Conn, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		front := <-fronts
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(make([]byte, 64<<10))
		http.NewResponseController(w).Flush()
		time.Sleep(100 * time.Millisecond) // the proxy relays the first bytes meanwhile
		ms, err := userTimeoutOf(front)
		if err != nil {
			ms = -1
		}
		during <- ms
		_, _ = w.Write(make([]byte, 64<<10))
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	reg := prometheus.NewRegistry()
	tr := NewTransport(TransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	p, err := New(Options{Upstream: u, Metrics: metrics.New(reg), Transport: tr, BodyIdleTimeout: idle})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveProxy(t, p, p, true, false, conns)
	type result struct {
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := srv.Client().Get(srv.URL + "/file/converted/0123456789abcdef")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		got <- result{n, err}
	}()
	front := <-conns // at the connection's accept, before its request is read
	fronts <- front
	if r := <-got; r.err != nil || r.n != 128<<10 {
		t.Fatalf("read %d bytes of Core's answer (%v), want %d", r.n, r.err, 128<<10)
	}
	if ms := <-during; ms != 0 {
		t.Errorf("TCP_USER_TIMEOUT while Core's answer is relayed = %d ms, want 0 (off)", ms)
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "sanitized_download", "method": "GET", "code": "200"}, 1)
	if ms := userTimeout(t, front); ms != int((2 * idle).Milliseconds()) {
		t.Errorf("TCP_USER_TIMEOUT after the exchange = %d ms, want %d (back on)", ms, (2 * idle).Milliseconds())
	}
}
