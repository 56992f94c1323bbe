package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestForwardUpstreamDown checks that a request to a Core that refuses connections gets
// 502 with a Core-style body, counted as a refused upstream error.
func TestForwardUpstreamDown(t *testing.T) {
	down := closedAddr(t)
	base, reg := newTestProxy(t, http.NotFoundHandler(), func(o *Options) { o.Upstream = down })
	client := newClient(t)

	for _, tc := range []struct {
		route, method, path string
		body                string
	}{
		{"file_result", http.MethodGet, "/file/61dffeaa728844adbf49eb090e4ece0e", ""},
		{"submit", http.MethodPost, "/file", strings.Repeat("x", 100_000)},
	} {
		t.Run(tc.route, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("%s %s with Core down = %d %q, want 502", tc.method, tc.path, resp.StatusCode, b)
			}
			coreError(t, resp, b)
			mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": tc.route, "code": "502"}, 1)
			checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": tc.route, "kind": "refused"}, 1)
			checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": tc.route}, 1)
		})
	}
}

// TestForwardUpstreamSilent checks that a Core that accepts a request and never answers
// its headers gets the client a 504 once the transport's ResponseHeaderTimeout is over,
// counted as a timeout, and that the proxy hangs up on Core (its handler sees its
// context end).
func TestForwardUpstreamSilent(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	abandoned := make(chan struct{}, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			abandoned <- struct{}{}
		case <-release:
		}
	})
	base, reg := newTestProxy(t, upstream, func(o *Options) {
		o.Transport = upstreamTransport(t, TransportOptions{ResponseHeaderTimeout: 300 * time.Millisecond})
		o.UpstreamTimeout = 300 * time.Millisecond
	})
	t.Cleanup(func() { close(release) }) // runs before the upstream server's Close
	client := newClient(t)

	resp, err := client.Get(base + "/file/61dffeaa728844adbf49eb090e4ece0e")
	if err != nil {
		t.Fatalf("GET /file/{id}: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("GET /file/{id} with Core silent = %d %q, want 504", resp.StatusCode, b)
	}
	coreError(t, resp, b)
	select {
	case <-entered:
	case <-time.After(longWait):
		t.Fatal("upstream never received the request")
	}
	select {
	case <-abandoned:
	case <-time.After(longWait):
		t.Error("upstream request context not cancelled after the 504: the proxy kept the connection to Core")
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "504"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result", "kind": "timeout"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result"}, 1)
}

// TestForwardSlowUploadNotTimedOut checks that ResponseHeaderTimeout does not cut an
// upload that takes longer than it to send: it counts from the end of the body.
func TestForwardSlowUploadNotTimedOut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	got := make(chan string, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sum, _, err := sha256Hex(r.Body)
		if err != nil {
			sum = err.Error()
		}
		got <- sum
		_, _ = io.WriteString(w, `{"data_id":"slow"}`)
	})
	base, _ := newTestProxy(t, upstream, func(o *Options) {
		o.Transport = upstreamTransport(t, TransportOptions{ResponseHeaderTimeout: timeout})
	})
	client := newClient(t)

	const size = 1 << 20
	want, _, _ := sha256Hex(bodyStream(size))
	pr, pw := io.Pipe()
	go func() {
		src := bodyStream(size)
		if _, err := io.CopyN(pw, src, size/2); err != nil {
			pw.CloseWithError(err)
			return
		}
		<-time.After(3 * timeout) // the second half comes well after the timeout
		_, err := io.Copy(pw, src)
		pw.CloseWithError(err)
	}()
	req, err := http.NewRequest(http.MethodPost, base+"/file", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST /file (slow): %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("slow POST /file = %d %q, want 200: the upload was timed out", resp.StatusCode, b)
	}
	if sum := <-got; sum != want {
		t.Errorf("upstream body SHA-256 = %s, want %s", sum, want)
	}
}

// TestForwardCoreErrorsPassThrough checks that Core's own error answers reach the
// client unchanged: status, body and headers (Retry-After on its 503).
func TestForwardCoreErrorsPassThrough(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, route string
		status                    int
		header                    map[string]string
		body                      string
	}{
		{"busy", http.MethodPost, "/file", "submit", http.StatusServiceUnavailable,
			map[string]string{"Retry-After": "17", "Content-Type": "application/json; charset=utf-8", "X-Core-Node": "node-2"},
			`{"err":"Server is too busy. Try again later."}`},
		{"busy without Retry-After", http.MethodPost, "/file", "submit", http.StatusServiceUnavailable,
			map[string]string{"Content-Type": "application/json"},
			`{"err":"Server is too busy. Try again later."}`},
		{"not found", http.MethodGet, "/file/0123456789abcdef", "file_result", http.StatusNotFound,
			map[string]string{"Content-Type": "application/json"},
			`{"0123456789abcdef":"Not Found"}`},
		{"empty file", http.MethodPost, "/file", "submit", http.StatusUnprocessableEntity,
			map[string]string{"Content-Type": "application/json"},
			`{"err":"File is empty."}`},
		{"length required", http.MethodPost, "/file", "submit", http.StatusLengthRequired,
			map[string]string{"Content-Type": "text/plain"},
			"Length Required\n"},
		{"denied", http.MethodGet, "/file/converted/abc", "sanitized_download", http.StatusMethodNotAllowed,
			map[string]string{"Content-Type": "application/json"},
			`{"err":"Access denied"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			base, reg := newTestProxy(t, upstream, nil)
			client := newClient(t)
			var body io.Reader
			if tc.method == http.MethodPost {
				body = strings.NewReader("file content")
			}
			req, err := http.NewRequest(tc.method, base+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || string(b) != tc.body {
				t.Errorf("%s %s = %d %q, want Core's %d %q", tc.method, tc.path, resp.StatusCode, b, tc.status, tc.body)
			}
			for k, v := range tc.header {
				if got := resp.Header.Values(k); len(got) != 1 || got[0] != v {
					t.Errorf("header %s = %q, want [%q]", k, got, v)
				}
			}
			if _, ok := tc.header["Retry-After"]; !ok && resp.Header.Get("Retry-After") != "" {
				t.Errorf("Retry-After = %q, want none: Core sent none", resp.Header.Get("Retry-After"))
			}
			if got := resp.Header.Get("Content-Length"); got != fmt.Sprint(len(tc.body)) {
				t.Errorf("Content-Length = %q, want %d", got, len(tc.body))
			}
			mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": tc.route, "code": fmt.Sprint(tc.status)}, 1)
			checkMetric(t, reg, "mdproxy_upstream_errors_total", nil, 0)
			checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": tc.route, "decision": "allowed"}, 1)
		})
	}
}

// TestForwardClientGoneWhileWaiting checks a poll whose client goes away while Core
// has not answered: the proxy cancels its request to Core, counts 499 and a canceled
// upstream error (not a 502), and leaves no goroutine behind.
func TestForwardClientGoneWhileWaiting(t *testing.T) {
	noLeak(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	canceled := make(chan struct{}, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-r.Context().Done():
			canceled <- struct{}{}
		case <-release:
		}
	})
	base, reg := newTestProxy(t, upstream, nil)
	t.Cleanup(func() { close(release) })
	client := newClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/file/61dffeaa728844adbf49eb090e4ece0e", nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("got %s, want no response", resp.Status)
		}
		errc <- err
	}()
	select {
	case <-entered:
	case <-time.After(longWait):
		t.Fatal("the poll never reached the upstream")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client Do after cancel = %v, want context.Canceled", err)
	}
	select {
	case <-canceled:
	case <-time.After(longWait):
		t.Fatal("upstream request context not cancelled after the client went away")
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "499"}, 1)
	checkMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result", "kind": "canceled"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result"}, 1)
	checkMetric(t, reg, "mdproxy_in_flight_requests", map[string]string{"route": "file_result"}, 0)
}

// TestForwardClientGoneMidUpload checks an upload whose client sends half of its
// declared Content-Length and hangs up: Core sees its body end early, the proxy counts
// 499 and a canceled upstream error, and leaves no goroutine behind.
func TestForwardClientGoneMidUpload(t *testing.T) {
	noLeak(t)
	const declared, sent = 1 << 20, 1 << 19
	type seen struct {
		n   int64
		err error
	}
	got := make(chan seen, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		got <- seen{n, err}
		if err == nil {
			_, _ = io.WriteString(w, `{"data_id":"complete"}`)
		}
	})
	base, reg := newTestProxy(t, upstream, nil)
	u, _ := url.Parse(base)

	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(longWait))
	head := fmt.Sprintf("POST /file HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", u.Host, declared)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(conn, bodyStream(sent)); err != nil {
		t.Fatalf("sending half the body: %v", err)
	}
	if err := conn.Close(); err != nil {
		t.Fatal(err)
	}

	select {
	case s := <-got:
		if s.err == nil || s.n >= declared {
			t.Errorf("upstream read %d bytes, error %v; want fewer than %d and an error", s.n, s.err, declared)
		}
	case <-time.After(longWait):
		t.Fatal("upstream never saw the end of the broken upload")
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "submit", "code": "499"}, 1)
	checkMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "submit"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "submit", "kind": "canceled"}, 1)
	checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "submit"}, 1)
	checkMetric(t, reg, "mdproxy_request_body_bytes_total", map[string]string{"route": "submit"}, sent)
	checkMetric(t, reg, "mdproxy_in_flight_requests", map[string]string{"route": "submit"}, 0)
}

// TestForwardConnectTimeout checks that a connection to Core that times out answers 502
// (Core could not be reached), not 504, which is kept for a Core that does not answer.
func TestForwardConnectTimeout(t *testing.T) {
	dialTimeout := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}}
	front, reg := newTestProxy(t, http.NotFoundHandler(), func(o *Options) { o.Transport = dialTimeout })
	resp, err := http.Get(front + "/file/x")
	if err != nil {
		t.Fatalf("GET /file/x: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "connect timeout") {
		t.Errorf("GET /file/x with a connect timeout = %d %s, want 502 naming the connect timeout", resp.StatusCode, body)
	}
	waitMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"kind": "timeout"}, 1)
}

// TestUpstreamErrorLogSampled checks that a flood of upstream errors writes one warn
// line a second per route, not one per request.
func TestUpstreamErrorLogSampled(t *testing.T) {
	var logs syncBuffer
	down := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}}
	front, _ := newTestProxy(t, http.NotFoundHandler(), func(o *Options) {
		o.Transport = down
		o.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	start := time.Now()
	for range 50 {
		resp, err := http.Get(front + "/file/x")
		if err != nil {
			t.Fatalf("GET /file/x: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("GET /file/x with Core down = %d, want 502", resp.StatusCode)
		}
	}
	lines := strings.Count(logs.String(), `"msg":"upstream error"`)
	if max := 1 + int(time.Since(start)/time.Second); lines < 1 || lines > max {
		t.Errorf("%d upstream error log lines for 50 errors in %v, want 1 to %d", lines, time.Since(start), max)
	}
}

// TestUpstreamErrorLogClockStepBack: the sampling of upstream error lines keeps its
// last line's instant on the wall clock; a clock stepped back (that instant an hour
// ahead) must not silence the lines until the clock catches up.
func TestUpstreamErrorLogClockStepBack(t *testing.T) {
	var logs syncBuffer
	rt := &route{log: slog.New(slog.NewJSONHandler(&logs, nil))}
	err := errors.New("connection refused")
	rt.logUpstream("refused", err)
	rt.logUpstream("refused", err) // within the second: sampled out
	rt.logged.lastLog.Store(time.Now().Add(time.Hour).UnixNano())
	rt.logUpstream("refused", err)
	if n := strings.Count(logs.String(), `"msg":"upstream error"`); n != 2 {
		t.Errorf("%d upstream error lines, want 2: the first, and the first after the clock stepped back an hour", n)
	}
}

// TestUpstreamResponsesCounted checks that Core's own answers are counted by code apart
// from the proxy's: Core's 503 (queue full) shows in upstream_responses_total, a
// rejection by the proxy's bucket does not.
func TestUpstreamResponsesCounted(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"err":"Server is too busy. Try again later."}`)
	})
	front, reg := newTestProxy(t, up, func(o *Options) {
		o.Limits = limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}}, newFakeClock())
	})
	for _, path := range []string{"/file/a", "/file/b"} { // the second is the proxy's rejection
		resp, err := http.Get(front + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("GET %s = %d, want 503", path, resp.StatusCode)
		}
	}
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "503"}, 2)
	if got := metricValue(t, reg, "mdproxy_upstream_responses_total", map[string]string{"route": "file_result", "code": "503"}); got != 1 {
		t.Errorf(`upstream_responses_total{route="file_result",code="503"} = %v, want 1 (Core's, not the proxy's)`, got)
	}
}
