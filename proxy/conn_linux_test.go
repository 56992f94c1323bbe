package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
// p.ConnContext as the sidecar sets it when connContext is set, and without any
// otherwise; conns receives the server's side of each connection (a *tls.Conn over
// TLS), when there is room. The server is closed by t.Cleanup.
func serveProxy(t *testing.T, p *Proxy, h http.Handler, connContext, tls bool, conns chan<- net.Conn) *httptest.Server {
	t.Helper()
	front := httptest.NewUnstartedServer(h)
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
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		got, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return got
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
				cc := clientConnOf(r)
				seen.Store(&cc)
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
			if (cc.rc != nil) == tc.tls {
				t.Errorf("connection kept for read batches: %v, want %v (plain TCP only)", cc.rc != nil, !tc.tls)
			}
		})
	}
}

// TestOwnAnswersToStalledReaderCut: a client that sends polls back to back and reads
// none of the limit answers has its connection closed, whether the kernel bounds the
// connection (ConnContext: TCP_USER_TIMEOUT) or each answer sets a write deadline (a
// server without ConnContext).
func TestOwnAnswersToStalledReaderCut(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, connContext := range []bool{true, false} {
		name := "write deadline"
		if connContext {
			name = "kernel"
		}
		t.Run(name, func(t *testing.T) {
			p, err := New(Options{Upstream: closedAddr(t), Metrics: metrics.New(prometheus.NewRegistry()), BodyIdleTimeout: idle,
				Limits: limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 1, Burst: 1}}, nil)})
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
