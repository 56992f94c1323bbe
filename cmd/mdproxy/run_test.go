package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// safety bounds a wait that only a broken program would reach; a test never passes or
// fails because of how long it took.
const safety = 30 * time.Second

// logBuffer collects run's log output. It is safe for concurrent use, and tells when a
// line containing some text was written (slog writes each record in one Write).
type logBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	waits []logWait
}

type logWait struct {
	text string
	ch   chan struct{}
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	kept := b.waits[:0]
	for _, w := range b.waits {
		if bytes.Contains(p, []byte(w.text)) {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	b.waits = kept
	return len(p), nil
}

// written returns a channel closed once a line containing text has been written.
func (b *logBuffer) written(text string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	if bytes.Contains(b.buf.Bytes(), []byte(text)) {
		close(ch)
	} else {
		b.waits = append(b.waits, logWait{text, ch})
	}
	return ch
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// upload is what the upstream received of one POST /file.
type upload struct {
	N      int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	Err    string `json:"err,omitempty"`
}

// upstream stands for Core: it records every request it sees, answers /readyz and
// other paths with a body naming them, and hashes the body of POST /file.
type upstream struct {
	*httptest.Server
	mu        sync.Mutex
	seen      []string // "METHOD /path"
	received  atomic.Int64
	firstByte chan struct{} // closed when the first upload byte arrives
	firstOnce sync.Once
	uploads   chan upload
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{firstByte: make(chan struct{}), uploads: make(chan upload, 8)}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Method+" "+r.URL.RequestURI())
	u.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/file":
		h := sha256.New()
		n, err := io.Copy(h, &signalReader{r: r.Body, u: u})
		up := upload{N: n, SHA256: hex.EncodeToString(h.Sum(nil))}
		if err != nil {
			up.Err = err.Error()
		}
		u.uploads <- up
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(up)
	case r.URL.Path == "/readyz":
		_, _ = io.WriteString(w, "upstream readyz\n")
	default:
		_, _ = io.WriteString(w, "upstream "+r.URL.Path+"\n")
	}
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func (u *upstream) saw(req string) bool {
	for _, s := range u.requests() {
		if s == req {
			return true
		}
	}
	return false
}

// signalReader counts the upload's bytes at the upstream and signals the first.
type signalReader struct {
	r io.Reader
	u *upstream
}

func (s *signalReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.u.received.Add(int64(n))
		s.u.firstOnce.Do(func() { close(s.u.firstByte) })
	}
	return n, err
}

// instance is one run of run() in a goroutine.
type instance struct {
	proxyURL, adminURL string
	proxyAddr          string
	logs               *logBuffer
	cancel             context.CancelFunc
	done               chan error // receives run's result once

	once sync.Once
	err  error
}

// startRun starts run with env plus loopback listen addresses, no shutdown delay
// (unless env sets MDPROXY_SHUTDOWN_DELAY: only the tests of the delay want it) and,
// when upstreamURL is not empty, MDPROXY_UPSTREAM_URL; it returns once both listeners
// serve. Cleanup stops it.
func startRun(t *testing.T, upstreamURL string, env map[string]string) *instance {
	t.Helper()
	environ := map[string]string{
		"MDPROXY_LISTEN_ADDR":    "127.0.0.1:0",
		"MDPROXY_ADMIN_ADDR":     "127.0.0.1:0",
		"MDPROXY_SHUTDOWN_DELAY": "0s",
	}
	if upstreamURL != "" {
		environ["MDPROXY_UPSTREAM_URL"] = upstreamURL
	}
	for k, v := range env {
		environ[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{logs: &logBuffer{}, cancel: cancel, done: make(chan error, 1)}
	type addrs struct{ proxy, admin net.Addr }
	started := make(chan addrs, 1)
	go func() {
		in.done <- run(ctx, environ, in.logs, func(p, a net.Addr) { started <- addrs{p, a} })
	}()
	select {
	case a := <-started:
		in.proxyAddr = a.proxy.String()
		in.proxyURL = "http://" + a.proxy.String()
		in.adminURL = "http://" + a.admin.String()
	case err := <-in.done:
		cancel()
		t.Fatalf("run(%v) = %v before it served, want it serving", environ, err)
	case <-time.After(safety):
		cancel()
		t.Fatalf("run(%v) did not call started within %v", environ, safety)
	}
	t.Cleanup(func() { in.stop(t) })
	return in
}

// stop cancels run's context and returns run's result.
func (in *instance) stop(t *testing.T) error {
	t.Helper()
	in.cancel()
	return in.wait(t)
}

// wait returns run's result, once it returned.
func (in *instance) wait(t *testing.T) error {
	t.Helper()
	in.once.Do(func() {
		select {
		case in.err = <-in.done:
		case <-time.After(safety):
			in.err = fmt.Errorf("run did not return within %v of its context's end", safety)
			t.Errorf("%v", in.err)
		}
	})
	return in.err
}

// newClient returns a client of its own, whose connections are closed by cleanup, and
// which never goes through an HTTP proxy of the environment.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// get returns the status and body of GET url.
func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// short returns s cut to 200 bytes, for messages.
func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// metricValue returns the value of the series (name with its labels, as the text
// format writes them, e.g. `x_total{code="200",route="a"}`) in a /metrics body.
func metricValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// checkJSONLogs checks that logs is a non-empty run of JSON lines and returns them.
func checkJSONLogs(t *testing.T, logs string) []map[string]any {
	t.Helper()
	if logs == "" {
		t.Fatal("run logged nothing, want JSON lines")
	}
	if !strings.HasSuffix(logs, "\n") {
		t.Errorf("logs end with %q, want a newline", logs[max(0, len(logs)-40):])
	}
	var lines []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(logs, "\n"), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %d = %q, want valid JSON", i+1, line)
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("log line %d = %q, want a JSON object: %v", i+1, line, err)
			continue
		}
		for _, key := range []string{"time", "level", "msg"} {
			if _, ok := m[key]; !ok {
				t.Errorf("log line %d = %q, want a %q key", i+1, line, key)
			}
		}
		lines = append(lines, m)
	}
	return lines
}

func findLog(lines []map[string]any, msg string) map[string]any {
	for _, l := range lines {
		if l["msg"] == msg {
			return l
		}
	}
	return nil
}

func TestRunServes(t *testing.T) {
	t.Parallel()
	up := newUpstream(t)
	in := startRun(t, up.URL, nil)
	c := newClient(t)

	// The proxy port forwards Core's API, /readyz included, and everything else.
	for _, tc := range []struct{ path, wantBody string }{
		{"/file/x", "upstream /file/x\n"},
		{"/readyz", "upstream readyz\n"},
		{"/metrics", "upstream /metrics\n"},
		{"/healthz", "upstream /healthz\n"},
	} {
		code, body := get(t, c, in.proxyURL+tc.path)
		if code != http.StatusOK || body != tc.wantBody {
			t.Errorf("GET proxy %s = %d %q, want 200 %q (the upstream's answer)", tc.path, code, short(body), tc.wantBody)
		}
		if !up.saw("GET " + tc.path) {
			t.Errorf("upstream saw %q, want GET %s among them: the proxy port must forward it", up.requests(), tc.path)
		}
	}

	// The admin port answers for the proxy itself and forwards nothing.
	before := len(up.requests())
	if code, body := get(t, c, in.adminURL+"/healthz"); code != http.StatusOK {
		t.Errorf("GET admin /healthz = %d %q, want 200", code, body)
	}
	if code, body := get(t, c, in.adminURL+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("GET admin /readyz = %d %q, want 200 %q", code, body, "ready\n")
	}
	if code, _ := get(t, c, in.adminURL+"/file/x"); code != http.StatusNotFound {
		t.Errorf("GET admin /file/x = %d, want 404: the admin port is not a proxy", code)
	}
	code, metrics := get(t, c, in.adminURL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET admin /metrics = %d, want 200", code)
	}
	if after := up.requests(); len(after) != before {
		t.Errorf("upstream saw %q after admin requests, want nothing new after %d requests", after, before)
	}
	for _, want := range []string{"mdproxy_requests_total", "mdproxy_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `[{ ]`).MatchString(metrics) {
			t.Errorf("admin /metrics has no series %s", want)
		}
	}
	for series, want := range map[string]float64{
		`mdproxy_requests_total{code="200",method="GET",route="file_result"}`: 1,
		`mdproxy_requests_total{code="200",method="GET",route="readyz"}`:      1,
		`mdproxy_requests_total{code="200",method="GET",route="other"}`:       2, // /metrics and /healthz
		`mdproxy_limit_rate_requests_per_second{route="file_result"}`:         10,
		`mdproxy_limit_burst_requests{route="batch_status"}`:                  4,
		`mdproxy_limit_rate_requests_per_second{route="submit"}`:              0,
	} {
		if got, ok := metricValue(metrics, series); !ok || got != want {
			t.Errorf("admin /metrics %s = %v (found %v), want %v", series, got, ok, want)
		}
	}

	if err := in.stop(t); err != nil {
		t.Errorf("run after its context ended = %v, want nil", err)
	}
	lines := checkJSONLogs(t, in.logs.String())
	if l := findLog(lines, "mdproxy serving"); l == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy serving", in.logs)
	} else if l["listen"] != in.proxyAddr {
		t.Errorf("log %q listen = %v, want %s", "mdproxy serving", l["listen"], in.proxyAddr)
	}
	if findLog(lines, "mdproxy stopped") == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy stopped", in.logs)
	}
}

func TestRunConfigError(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	called := false
	err := run(context.Background(), map[string]string{"MDPROXY_LIMIT_STATUS": "abc"}, &logs,
		func(net.Addr, net.Addr) { called = true })
	var ce *configError
	if !errors.As(err, &ce) || !namesVar(err.Error(), "MDPROXY_LIMIT_STATUS") {
		t.Errorf("run(MDPROXY_LIMIT_STATUS=abc) = %v, want a *configError naming MDPROXY_LIMIT_STATUS", err)
	}
	if called {
		t.Error("run(MDPROXY_LIMIT_STATUS=abc) called started, want no listener")
	}
}

func TestRunListenError(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, name := range []string{"MDPROXY_LISTEN_ADDR", "MDPROXY_ADMIN_ADDR"} {
		environ := map[string]string{
			"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0",
			name: busy.Addr().String(),
		}
		err := run(context.Background(), environ, io.Discard, nil)
		if err == nil || !namesVar(err.Error(), name) {
			t.Errorf("run(%s=<address in use>) = %v, want an error naming %s", name, err, name)
		}
		if errors.As(err, new(*configError)) {
			t.Errorf("run(%s=<address in use>) = %v, a *configError; want another error (exit 1, not 2)", name, err)
		}
	}
}

// payload returns size deterministic pseudo-random bytes, a stream (a 300 MiB upload
// is never held in memory), and their SHA-256.
func payload(seed byte, size int64) (io.Reader, string) {
	newStream := func() io.Reader {
		return io.LimitReader(rand.NewChaCha8([32]byte{seed}), size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, newStream()); err != nil {
		panic(err)
	}
	return newStream(), hex.EncodeToString(h.Sum(nil))
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

type uploadResult struct {
	status int
	body   upload // the upstream's answer, forwarded by the proxy
	raw    string
	err    error
}

// postFile uploads size bytes from body to url + /file with a Content-Length, as Core's
// clients do.
func postFile(ctx context.Context, c *http.Client, url string, body io.Reader, size int64) uploadResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/file", body)
	if err != nil {
		return uploadResult{err: err}
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.Do(req)
	if err != nil {
		return uploadResult{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	res := uploadResult{status: resp.StatusCode, raw: string(raw), err: err}
	if err == nil && resp.StatusCode == http.StatusOK {
		res.err = json.Unmarshal(raw, &res.body)
	}
	return res
}

// checkUpload checks that an upload of size bytes hashing to sum succeeded byte for
// byte: the client got 200 with the upstream's count and hash, and the upstream
// received exactly that.
func checkUpload(t *testing.T, up *upstream, res uploadResult, size int64, sum string) {
	t.Helper()
	if res.err != nil || res.status != http.StatusOK {
		t.Fatalf("POST /file of %d bytes = %d %q, %v; want 200", size, res.status, res.raw, res.err)
	}
	want := upload{N: size, SHA256: sum}
	if res.body != want {
		t.Errorf("POST /file answer = %+v, want %+v", res.body, want)
	}
	select {
	case got := <-up.uploads:
		if got != want {
			t.Errorf("upstream received %+v, want %+v", got, want)
		}
	case <-time.After(safety):
		t.Errorf("upstream recorded no upload")
	}
}

func TestRunGracefulShutdown(t *testing.T) {
	t.Parallel()
	const size = 4 << 20 // over about 1.5 s
	up := newUpstream(t)
	in := startRun(t, up.URL, nil)
	c := newClient(t)
	adminClient := newClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, sum := payload(1, size)
	body := newPacedReader(ctx, src, size/1.5, 64<<10)
	results := make(chan uploadResult, 1)
	go func() { results <- postFile(ctx, c, in.proxyURL, body, size) }()

	select {
	case <-up.firstByte:
	case res := <-results:
		t.Fatalf("upload ended before it reached the upstream: %d %q %v", res.status, res.raw, res.err)
	case <-time.After(safety):
		t.Fatal("no upload byte reached the upstream")
	}
	shuttingDown := in.logs.written("mdproxy shutting down")
	in.cancel()
	select {
	case <-shuttingDown:
	case <-time.After(safety):
		t.Fatalf("run logged no shutdown after its context ended; logs:\n%s", in.logs)
	}
	if got := up.received.Load(); got >= size {
		t.Fatalf("upstream had all %d bytes when the shutdown began, want the upload in flight", got)
	}

	// The load balancer is told to stop sending: /readyz is 503, or the admin port closed.
	resp, err := adminClient.Get(in.adminURL + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("GET admin /readyz during shutdown = %d, want 503", resp.StatusCode)
		}
	} else {
		t.Logf("GET admin /readyz during shutdown: %v (admin port closed)", err)
	}

	checkUpload(t, up, <-results, size, sum)
	if err := in.wait(t); err != nil {
		t.Errorf("run after a graceful shutdown = %v, want nil", err)
	}
	// Both ports are closed once run returned.
	for _, u := range []string{in.proxyURL + "/file/x", in.adminURL + "/readyz"} {
		if resp, err := newClient(t).Get(u); err == nil {
			resp.Body.Close()
			t.Errorf("GET %s after run returned = %d, want a connection error", u, resp.StatusCode)
		}
	}
	lines := checkJSONLogs(t, in.logs.String())
	if findLog(lines, "mdproxy stopped") == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy stopped", in.logs)
	}
}

func TestRunShutdownTimeout(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	up := newUpstream(t)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_SHUTDOWN_TIMEOUT": "100ms"})
	c := newClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, _ := payload(2, size)
	release := make(chan struct{})
	body := newPacedReader(ctx, src, 1<<30, 64<<10)
	body.stallAfter = 256 << 10 // then nothing until release: it cannot finish in time
	body.release = release
	results := make(chan uploadResult, 1)
	go func() { results <- postFile(ctx, c, in.proxyURL, body, size) }()

	select {
	case <-up.firstByte:
	case res := <-results:
		t.Fatalf("upload ended before it reached the upstream: %d %q %v", res.status, res.raw, res.err)
	case <-time.After(safety):
		t.Fatal("no upload byte reached the upstream")
	}
	err := in.stop(t)
	close(release)
	if err == nil || !strings.Contains(err.Error(), "MDPROXY_SHUTDOWN_TIMEOUT") {
		t.Errorf("run with an upload longer than MDPROXY_SHUTDOWN_TIMEOUT = %v, want an error naming MDPROXY_SHUTDOWN_TIMEOUT", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("run with an upload longer than MDPROXY_SHUTDOWN_TIMEOUT = %v, want it to wrap context.DeadlineExceeded", err)
	}
	if errors.As(err, new(*configError)) {
		t.Errorf("run = %v, a *configError; want another error (exit 1, not 2)", err)
	}

	res := <-results
	if res.err == nil && res.status == http.StatusOK {
		t.Errorf("cut upload = 200 %q, want a failure", res.raw)
	}
	select {
	case got := <-up.uploads:
		if got.Err == "" || got.N >= size {
			t.Errorf("upstream received %+v of a cut upload, want fewer than %d bytes and an error", got, size)
		}
	case <-time.After(safety):
		t.Error("upstream handler did not end after the upload was cut")
	}
	checkJSONLogs(t, in.logs.String())
}

// TestRunSlowUploadNotCut sends an upload slower than every timeout of the proxy: each
// of the read header, idle and upstream timeouts is 500 ms, the upload lasts about 3 s
// and stops sending for 1 s in its middle.
func TestRunSlowUploadNotCut(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: about 3 s")
	}
	t.Parallel()
	const size = 2 << 20
	up := newUpstream(t)
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_READ_HEADER_TIMEOUT": "500ms",
		"MDPROXY_IDLE_TIMEOUT":        "500ms",
		"MDPROXY_UPSTREAM_TIMEOUT":    "500ms",
	})
	c := newClient(t)

	src, sum := payload(3, size)
	body := newPacedReader(context.Background(), src, 1<<20, 32<<10) // 1 MiB/s
	body.stallAfter = size / 2
	body.stall = time.Second
	start := time.Now()
	res := postFile(context.Background(), c, in.proxyURL, body, size)
	elapsed := time.Since(start)
	checkUpload(t, up, res, size, sum)
	t.Logf("%d bytes uploaded in %v", size, elapsed)
	if elapsed < 1500*time.Millisecond {
		t.Fatalf("upload took %v, want longer than the 500 ms timeouts it must outlast (the pacing failed)", elapsed)
	}

	_, metrics := get(t, c, in.adminURL+"/metrics")
	series := `mdproxy_request_body_bytes_total{route="submit"}`
	if got, ok := metricValue(metrics, series); !ok || got != size {
		t.Errorf("admin /metrics %s = %v (found %v), want %d", series, got, ok, size)
	}
	if err := in.stop(t); err != nil {
		t.Errorf("run = %v, want nil", err)
	}
	checkJSONLogs(t, in.logs.String())
}

// TestLongUpload300MiB is the "300 MiB at 5 MB/s must succeed", with the default
// timeouts. It lasts about 63 s: run it with MDPROXY_LONG_TESTS=1.
func TestLongUpload300MiB(t *testing.T) {
	if os.Getenv("MDPROXY_LONG_TESTS") != "1" {
		t.Skip("set MDPROXY_LONG_TESTS=1 to send 300 MiB at 5 MB/s (about 63 s)")
	}
	const size = 300 << 20
	up := newUpstream(t)
	in := startRun(t, up.URL, nil)
	c := newClient(t)

	src, sum := payload(4, size)
	body := newPacedReader(context.Background(), src, 5e6, 256<<10)
	start := time.Now()
	res := postFile(context.Background(), c, in.proxyURL, body, size)
	elapsed := time.Since(start)
	checkUpload(t, up, res, size, sum)
	t.Logf("%d bytes (300 MiB) uploaded in %v: %.2f MB/s, sha256 %s", int64(size), elapsed.Round(time.Millisecond),
		float64(size)/elapsed.Seconds()/1e6, sum)

	_, metrics := get(t, c, in.adminURL+"/metrics")
	series := `mdproxy_request_body_bytes_total{route="submit"}`
	if got, ok := metricValue(metrics, series); !ok || got != size {
		t.Errorf("admin /metrics %s = %v (found %v), want %d", series, got, ok, size)
	}
	if err := in.stop(t); err != nil {
		t.Errorf("run = %v, want nil", err)
	}
	checkJSONLogs(t, in.logs.String())
}
