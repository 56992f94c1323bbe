package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestMain fails the package when a test leaves a goroutine behind: a server, a
// connection or a paced reader that was not stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// safety bounds a wait that only a broken program would reach.
const safety = sidecartest.Safety

// routeVar returns the variable of a route's setting, e.g. MDPROXY_FILE_RESULT_RATE.
func routeVar(route, setting string) string {
	return EnvPrefix + strings.ToUpper(route) + "_" + setting
}

// instance is one Run in a goroutine.
type instance struct {
	proxyURL, adminURL string
	proxyAddr          string
	logs               *sidecartest.LogBuffer
	cancel             context.CancelFunc
	done               chan error // receives Run's result once

	once sync.Once
	err  error
}

// startRun starts Run with env plus loopback listen addresses, no shutdown delay
// (unless env sets MDPROXY_SHUTDOWN_DELAY: only the tests of the delay want it), a
// limits file settle time of 100ms (unless env sets MDPROXY_LIMITS_FILE_SETTLE) and,
// when upstreamURL is not empty, MDPROXY_UPSTREAM_URL; it returns once both listeners
// serve, with opts. Cleanup stops it.
func startRun(t *testing.T, upstreamURL string, env map[string]string, opts ...Option) *instance {
	t.Helper()
	environ := map[string]string{
		"MDPROXY_LISTEN_ADDR":    "127.0.0.1:0",
		"MDPROXY_ADMIN_ADDR":     "127.0.0.1:0",
		"MDPROXY_SHUTDOWN_DELAY": "0s",
		// The bridge's callback listener on a port of its own: tests run in parallel.
		"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		// The tests of the limits file write it whole at once (or rename it): a short
		// settle time keeps them quick. The settle time's own tests set theirs.
		"MDPROXY_LIMITS_FILE_SETTLE": "100ms",
		// The check of Core asks its /readyz: off, as tests count what Core is asked;
		// its own tests turn it on.
		"MDPROXY_UPSTREAM_CHECK_INTERVAL": "0s",
	}
	if upstreamURL != "" {
		environ["MDPROXY_UPSTREAM_URL"] = upstreamURL
	}
	for k, v := range env {
		environ[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{logs: &sidecartest.LogBuffer{}, cancel: cancel, done: make(chan error, 1)}
	type addrs struct{ proxy, admin net.Addr }
	started := make(chan addrs, 1)
	go func() {
		in.done <- Run(ctx, environ, in.logs, func(p, a net.Addr) { started <- addrs{p, a} }, opts...)
	}()
	select {
	case a := <-started:
		in.proxyAddr = a.proxy.String()
		in.proxyURL = "http://" + a.proxy.String()
		in.adminURL = "http://" + a.admin.String()
	case err := <-in.done:
		cancel()
		t.Fatalf("Run(%v) = %v before it served, want it serving", environ, err)
	case <-time.After(safety):
		cancel()
		t.Fatalf("Run(%v) did not call started within %v", environ, safety)
	}
	t.Cleanup(func() { in.stop(t) })
	return in
}

// stop cancels Run's context and returns Run's result.
func (in *instance) stop(t *testing.T) error {
	t.Helper()
	in.cancel()
	return in.wait(t)
}

// wait returns Run's result, once it returned.
func (in *instance) wait(t *testing.T) error {
	t.Helper()
	in.once.Do(func() {
		select {
		case in.err = <-in.done:
		case <-time.After(safety):
			in.err = fmt.Errorf("Run did not return within %v of its context's end", safety)
			t.Errorf("%v", in.err)
		}
	})
	return in.err
}

func findLog(lines []map[string]any, msg string) map[string]any {
	for _, l := range lines {
		if l["msg"] == msg {
			return l
		}
	}
	return nil
}

// pacedReader reads src at most perSecond bytes a second (a token bucket of chunk
// bytes), as a slow client uploads. After stallAfter bytes it sends nothing for stall;
// when release is not nil it sends nothing after stallAfter bytes until release is
// closed, then fails. It stops with ctx's error when ctx ends.
type pacedReader struct {
	ctx        context.Context
	src        io.Reader
	lim        *rate.Limiter
	chunk      int
	sent       int64
	stallAfter int64
	stall      time.Duration
	release    <-chan struct{}
}

func newPacedReader(ctx context.Context, src io.Reader, perSecond float64, chunk int) *pacedReader {
	return &pacedReader{ctx: ctx, src: src, lim: rate.NewLimiter(rate.Limit(perSecond), chunk), chunk: chunk, stallAfter: -1}
}

func (r *pacedReader) Read(p []byte) (int, error) {
	if r.stallAfter >= 0 && r.sent >= r.stallAfter {
		if r.release != nil {
			select {
			case <-r.release:
				return 0, errors.New("paced reader: released, upload abandoned")
			case <-r.ctx.Done():
				return 0, r.ctx.Err()
			}
		}
		if r.stall > 0 {
			t := time.NewTimer(r.stall)
			select {
			case <-t.C:
			case <-r.ctx.Done():
				t.Stop()
				return 0, r.ctx.Err()
			}
			r.stallAfter = -1
		}
	}
	if len(p) > r.chunk {
		p = p[:r.chunk]
	}
	if r.stallAfter >= 0 && int64(len(p)) > r.stallAfter-r.sent {
		p = p[:r.stallAfter-r.sent]
	}
	if err := r.lim.WaitN(r.ctx, len(p)); err != nil {
		return 0, err
	}
	n, err := r.src.Read(p)
	r.sent += int64(n)
	return n, err
}
