package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// The shutdown of issue 9, case 9: on SIGTERM /readyz turns 503 at once while the proxy
// keeps serving for MDPROXY_SHUTDOWN_DELAY, so that a load balancer that has not yet
// seen the change is not refused; only then does the listener close and in-flight
// requests drain.

// freshGet sends GET url on a connection of its own and returns the status and body,
// or the error.
func freshGet(url string) (int, string, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// await fails t unless ch closes within the safety bound.
func await(t *testing.T, p *proc, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(safety):
		t.Fatalf("mdproxy did not log %q within %v; stderr:\n%s", what, safety, p.logs.String())
	}
}

// checkReadyz checks that the admin /readyz answers 503.
func checkReadyz(t *testing.T, p *proc) {
	t.Helper()
	code, body, err := freshGet(p.adminURL + "/readyz")
	if err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("GET admin /readyz after SIGTERM = %d %q, %v; want 503 at once", code, body, err)
	}
}

// checkPoll checks that GET path through the proxy, on a new connection, is answered
// 200 by the upstream.
func checkPoll(t *testing.T, p *proc, up *sidecartest.Upstream, path, when string) {
	t.Helper()
	code, body, err := freshGet(p.proxyURL + path)
	if want := "upstream " + path + "\n"; err != nil || code != http.StatusOK || body != want {
		t.Errorf("GET proxy %s %s = %d %q, %v; want 200 %q from the upstream", path, when, code, sidecartest.Short(body), err, want)
	}
	if !up.Saw("GET " + path) {
		t.Errorf("upstream saw %q, want GET %s among them", up.Requests(), path)
	}
}

// awaitRefused fails t unless a new connection to the proxy's port is refused (or reset,
// meeting the listener as it closes) within the safety bound, while the process still
// runs. The listener closes right after the
// "draining" line is logged, so a connection may still be accepted just before.
func awaitRefused(t *testing.T, p *proc) {
	t.Helper()
	deadline := time.Now().Add(safety)
	for {
		if closed(p.exited) {
			t.Fatalf("mdproxy exited before its in-flight requests finished: %v; stderr:\n%s", p.Err(), p.logs.String())
		}
		c, err := net.DialTimeout("tcp", p.proxyAddr, safety)
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
			// Refused once the listener is closed; reset when the dial met it closing
			// (a connection in its accept queue is reset as it closes).
			return
		}
		if err != nil {
			t.Fatalf("dial %s after the delay: %v, want connection refused", p.proxyAddr, err)
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("dial %s after the delay still connects after %v, want connection refused", p.proxyAddr, safety)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gateReader returns io.EOF once gate is closed, or ctx's error once ctx ends; it
// holds an upload in the middle of its body.
type gateReader struct {
	ctx  context.Context
	gate <-chan struct{}
}

func (g gateReader) Read([]byte) (int, error) {
	select {
	case <-g.gate:
		return 0, io.EOF
	case <-g.ctx.Done():
		return 0, g.ctx.Err()
	}
}

// heldUpload is a POST /file through the proxy whose body stops in its middle until
// release is called.
type heldUpload struct {
	size    int64
	sum     string
	release func()
	result  chan sidecartest.UploadResult
}

// startHeldUpload starts a held upload to p on a connection of its own and returns
// once its first bytes reached up. Cleanup ends it.
func startHeldUpload(t *testing.T, p *proc, up *sidecartest.Upstream) *heldUpload {
	t.Helper()
	const half = 64 << 10
	src, _ := sidecartest.Payload(9, 2*half)
	data, err := io.ReadAll(src)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	gate := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	body := io.MultiReader(bytes.NewReader(data[:half]), gateReader{ctx, gate}, bytes.NewReader(data[half:]))
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	u := &heldUpload{size: 2 * half, sum: hex.EncodeToString(h[:]), result: make(chan sidecartest.UploadResult, 1)}
	u.release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(u.release)
	go func() { u.result <- sidecartest.PostFile(ctx, &http.Client{Transport: tr}, p.proxyURL, body, u.size) }()
	select {
	case <-up.FirstByte:
	case res := <-u.result:
		t.Fatalf("upload ended before it reached the upstream: %d %q %v", res.Status, res.Raw, res.Err)
	case <-time.After(safety):
		t.Fatal("no upload byte reached the upstream")
	}
	return u
}

// check releases the upload and checks that it succeeded byte for byte.
func (u *heldUpload) check(t *testing.T, up *sidecartest.Upstream) {
	t.Helper()
	u.release()
	select {
	case res := <-u.result:
		sidecartest.CheckUpload(t, up, res, u.size, u.sum)
	case <-time.After(safety):
		t.Fatalf("upload did not end within %v of its release", safety)
	}
}

// checkPhases checks that the logs are JSON lines with the shutdown's phases in order.
func checkPhases(t *testing.T, p *proc, phases ...string) {
	t.Helper()
	var msgs []string
	for _, l := range sidecartest.CheckJSONLogs(t, p.logs.String()) {
		if m, ok := l["msg"].(string); ok {
			msgs = append(msgs, m)
		}
	}
	last := -1
	for _, phase := range phases {
		i := slices.IndexFunc(msgs, func(m string) bool { return strings.HasPrefix(m, phase) })
		if i < 0 || i < last {
			t.Errorf("log messages %q, want %q in this order", msgs, phases)
			return
		}
		last = i
	}
}

// TestShutdownDelay: the delay runs its course.
func TestShutdownDelay(t *testing.T) {
	t.Parallel()
	const delay = 2 * time.Second
	up := sidecartest.NewUpstream(t)
	p := startBinary(t, up.URL, map[string]string{"MDPROXY_SHUTDOWN_DELAY": delay.String()})
	checkPoll(t, p, up, "/file/before", "before SIGTERM")

	shuttingDown := p.logs.Written("mdproxy shutting down")
	draining := p.logs.Written("mdproxy draining")
	signaled := time.Now()
	p.signal(t, syscall.SIGTERM)
	await(t, p, shuttingDown, "mdproxy shutting down")
	checkReadyz(t, p)

	// Polls sent after the signal, within the delay, are served on new connections.
	for _, after := range []time.Duration{50 * time.Millisecond, delay / 2} {
		time.Sleep(time.Until(signaled.Add(after)))
		if closed(draining) {
			t.Skipf("the machine is too slow: the %v delay ended before the poll %v after SIGTERM", delay, after)
		}
		checkPoll(t, p, up, fmt.Sprintf("/file/poll-%dms", after.Milliseconds()), fmt.Sprintf("%v after SIGTERM", after))
	}
	if closed(draining) {
		t.Skipf("the machine is too slow: the %v delay ended before the upload started", delay)
	}
	upload := startHeldUpload(t, p, up) // in flight across the delay's end

	await(t, p, draining, "mdproxy draining")
	if elapsed := time.Since(signaled); elapsed < delay {
		t.Errorf("listener closing %v after SIGTERM, want at least MDPROXY_SHUTDOWN_DELAY=%v", elapsed, delay)
	}
	awaitRefused(t, p)
	checkReadyz(t, p) // the admin port answers until the drain ends
	upload.check(t, up)
	if code := p.wait(t); code != 0 {
		t.Errorf("mdproxy after SIGTERM exit code = %d, want 0; stderr:\n%s", code, p.logs.String())
	}
	checkPhases(t, p, "mdproxy shutting down", "mdproxy draining", "mdproxy stopped")
	if strings.Contains(p.logs.String(), "cut short") {
		t.Errorf("logs say the delay was cut short, want it run to its end:\n%s", p.logs.String())
	}
}

// TestShutdownSecondSignal: a second SIGTERM or SIGINT during the delay skips the rest
// of it; in-flight requests still drain. The delay is far longer than the test may
// wait: only the second signal can end it in time.
func TestShutdownSecondSignal(t *testing.T) {
	t.Parallel()
	for _, second := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(second.String(), func(t *testing.T) {
			t.Parallel()
			up := sidecartest.NewUpstream(t)
			p := startBinary(t, up.URL, map[string]string{"MDPROXY_SHUTDOWN_DELAY": "1h"})

			shuttingDown := p.logs.Written("mdproxy shutting down")
			cutShort := p.logs.Written("mdproxy shutdown delay cut short")
			draining := p.logs.Written("mdproxy draining")
			p.signal(t, syscall.SIGTERM)
			await(t, p, shuttingDown, "mdproxy shutting down")
			checkReadyz(t, p)
			time.Sleep(50 * time.Millisecond)
			checkPoll(t, p, up, "/file/poll", "during the delay")
			upload := startHeldUpload(t, p, up)

			p.signal(t, second)
			await(t, p, cutShort, "mdproxy shutdown delay cut short")
			await(t, p, draining, "mdproxy draining")
			awaitRefused(t, p)
			upload.check(t, up)
			if code := p.wait(t); code != 0 {
				t.Errorf("mdproxy after SIGTERM then %v exit code = %d, want 0; stderr:\n%s", second, code, p.logs.String())
			}
			checkPhases(t, p, "mdproxy shutting down", "mdproxy shutdown delay cut short", "mdproxy draining", "mdproxy stopped")
		})
	}
}
