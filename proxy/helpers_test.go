package proxy

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// newTestProxy starts upstream on a loopback httptest.Server and, in front of it, the
// proxy built by New on a loopback httptest.Server. Options start with Upstream set to
// the upstream's URL, Metrics from metrics.New on a fresh prometheus.NewRegistry (the
// returned reg), and a Transport from NewTransport; opts, when not nil, may change any
// of them (Limits, LimitStatus, TrustedProxies, Transport...) before New is called.
//
// It returns the proxy's base URL ("http://127.0.0.1:port") and the registry. Both
// servers and the transport's idle connections are closed by t.Cleanup (the proxy
// first, then the upstream). It fails t if New returns an error.
func newTestProxy(t testing.TB, upstream http.Handler, opts func(*Options)) (proxyURL string, reg *prometheus.Registry) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatalf("parsing upstream URL %q: %v", up.URL, err)
	}
	reg = prometheus.NewRegistry()
	tr := NewTransport(TransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	o := Options{Upstream: u, Metrics: metrics.New(reg), Transport: tr}
	if opts != nil {
		opts(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v) = %v, want no error", o, err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return front.URL, reg
}

// routeProbe is the proxy built by New in front of an upstream that answers 200 in
// memory, served in process: serve tells the route a request was counted under. Not
// newTestProxy: a fuzzer sends thousands of requests a second, which over loopback
// would spend its time in sockets and run out of ports in TIME_WAIT.
type routeProbe struct {
	p         *Proxy
	m         *metrics.Metrics
	forwarded atomic.Int64
}

func newRouteProbe(t testing.TB) *routeProbe {
	t.Helper()
	h := &routeProbe{m: metrics.New(prometheus.NewRegistry())}
	up, err := url.Parse("http://core.test:8008")
	if err != nil {
		t.Fatal(err)
	}
	h.p, err = New(Options{Upstream: up, Metrics: h.m, Transport: inMemoryUpstream(func(r *http.Request) (*http.Response, error) {
		h.forwarded.Add(1)
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), ContentLength: 2, Request: r}, nil
	})})
	if err != nil {
		t.Fatalf("New() = %v, want no error", err)
	}
	return h
}

// serve serves r and returns the route it was counted under, the status, and whether
// it reached the upstream. It fails t unless exactly one request was counted.
func (h *routeProbe) serve(t *testing.T, r *http.Request) (route string, code int, forwarded bool) {
	t.Helper()
	before := h.counts(t)
	n := h.forwarded.Load()
	w := httptest.NewRecorder()
	h.p.ServeHTTP(w, r)
	after := h.counts(t)
	for name, c := range after {
		if c != before[name] {
			if route != "" {
				t.Fatalf("%s %s counted under %q and %q, want one route", r.Method, r.RequestURI, route, name)
			}
			route = name
		}
	}
	if route == "" {
		t.Fatalf("%s %s counted under no route, want one", r.Method, r.RequestURI)
	}
	return route, w.Code, h.forwarded.Load() != n
}

// counts returns mdproxy_requests_total summed by route. It collects that counter
// only: a Gather of the whole registry would take most of the fuzzing time.
func (h *routeProbe) counts(t *testing.T) map[string]float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() {
		h.m.Requests.Collect(ch)
		close(ch)
	}()
	out := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatalf("writing %v: %v", m.Desc(), err)
		}
		for _, lp := range pb.GetLabel() {
			if lp.GetName() == "route" {
				out[lp.GetValue()] += pb.GetCounter().GetValue()
			}
		}
	}
	return out
}

// inMemoryUpstream is a Transport that answers without a connection.
type inMemoryUpstream func(*http.Request) (*http.Response, error)

func (f inMemoryUpstream) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// benchHandler returns the whole proxy handler in front of a tiny loopback upstream
// that answers 200 "{}", with limits (nil: unlimited). Servers close with b.Cleanup.
func benchHandler(b *testing.B, limits map[string]limiter.Limit) http.Handler {
	b.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "{}")
	}))
	b.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	tr := NewTransport(TransportOptions{})
	b.Cleanup(tr.CloseIdleConnections)
	set, err := limiter.NewSet(limits, nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), Transport: tr, Limits: set})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// rejectHandler is the proxy with file_result's bucket empty for good: every poll is
// rejected.
func rejectHandler(b *testing.B) (http.Handler, *http.Request) {
	h := benchHandler(b, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}})
	req := httptest.NewRequest(http.MethodGet, "/file/61dffeaa728844adbf49eb090e4ece0e", nil)
	h.ServeHTTP(httptest.NewRecorder(), req) // takes the only token
	return h, req
}

// storeHitHandler is the proxy with the bridge on, its store holding the final result of
// the poll it returns, and file_result's bucket empty for good: the poll is answered
// from the store, the way rejections are answered, without Core or a token.
func storeHitHandler(b *testing.B) (http.Handler, *http.Request) {
	b.Helper()
	const id = "61dffeaa728844adbf49eb090e4ece0e"
	store, err := bridge.NewMemoryStore(64<<20, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(store.Close)
	br, err := bridge.New(bridge.Options{CallbackURL: "http://127.0.0.1:9010", Store: store})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"data_id":"` + id + `","scan_results":{"scan_all_result_i":0,"scan_all_result_a":"No Threat Detected","progress_percentage":100},"process_info":{"progress_percentage":100,"result":"Allowed"}}`)
	store.Put(id, bridge.Result{Body: body, ContentType: "application/json", Owner: bridge.OwnerOf("client-key")})
	up := httptest.NewServer(http.NotFoundHandler())
	b.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	set, err := limiter.NewSet(map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), Limits: set, Bridge: br})
	if err != nil {
		b.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/file/"+id, nil)
	req.Header.Set("apikey", "client-key")
	return p, req
}

// discardWriter is an http.ResponseWriter for benchmarks of answers the handler gives
// itself: it keeps the status and discards the body, reusing its header map, so that a
// benchmark measures the handler and not httptest.ResponseRecorder's header clone and
// growing buffer. Call reset between requests.
type discardWriter struct {
	header http.Header
	code   int
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(code int)        { w.code = code }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) reset()                      { clear(w.header); w.code = 0 }

// countingUpstream answers 200 "ok" and counts the requests it receives.
type countingUpstream struct{ n atomic.Int64 }

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.n.Add(1)
	_, _ = io.WriteString(w, "ok")
}

// recordingUpstream is an upstream that answers 200 "ok" and records the method and
// request target (as sent on the wire) of every request it receives.
type recordingUpstream struct {
	mu   sync.Mutex
	seen []string // "METHOD request-target"
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Method+" "+r.RequestURI)
	u.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

func (u *recordingUpstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.seen...)
}

func (u *recordingUpstream) count() int { return len(u.requests()) }

// upstreamTransport returns the proxy's transport to Core as NewTransport builds it
// from o, its idle connections closed by t.Cleanup.
func upstreamTransport(t testing.TB, o TransportOptions) *http.Transport {
	t.Helper()
	tr := NewTransport(o)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// rawCore starts a stand-in for Core on a loopback port that writes its answers
// itself, byte by byte as answer writes them on c, to each request it reads (the
// connection is closed when answer returns), and returns its URL. It stops, its
// connections' answer calls returned, by t.Cleanup.
func rawCore(t testing.TB, answer func(c net.Conn, req *http.Request)) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				answer(c, req)
			})
		}
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

// closedAddr returns the URL of a loopback port where nothing listens any more.
func closedAddr(t testing.TB) *url.URL {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return &url.URL{Scheme: "http", Host: addr}
}

// testEpoch is where the tests' fake clocks start: a whole minute, so that every
// per-client window of a second or a minute starts with the test.
var testEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// newFakeClock returns a fake clock at testEpoch, for limiter.NewSet (and the bridge's
// Now): time moves only when the test calls Advance, and a request waiting for a token
// waits on one of its timers, which BlockUntilContext sees.
func newFakeClock() *clockwork.FakeClock { return clockwork.NewFakeClockAt(testEpoch) }

// limitSet builds a limiter.Set for limits on clock (nil: the real clock), failing t
// on an error.
func limitSet(t testing.TB, limits map[string]limiter.Limit, clock clockwork.Clock) *limiter.Set {
	t.Helper()
	s, err := limiter.NewSet(limits, clock)
	if err != nil {
		t.Fatalf("limiter.NewSet(%v) = %v", limits, err)
	}
	return s
}

// blockUntilWaiting returns once clock has n timers pending (requests waiting for a
// token, per-client sweeps), failing t when that takes longWait: what a test waits for
// before it advances the clock past a wait.
func blockUntilWaiting(t testing.TB, clock *clockwork.FakeClock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), longWait)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("waiting for %d timers of the fake clock: %v", n, err)
	}
}

// newClient returns an http.Client with its own transport (not http.DefaultTransport,
// whose idle connections would outlive the test), closed by t.Cleanup.
func newClient(t testing.TB) *http.Client {
	t.Helper()
	tr := &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Minute}
}

// keepAliveClient returns a client that keeps up to conns connections to one host,
// closed by t.Cleanup.
func keepAliveClient(t testing.TB, conns int) *http.Client {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// do sends method to url with header through client (nil: http.DefaultClient) and
// returns the response, its body read and closed.
func do(t testing.TB, client *http.Client, method, url string, header http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatalf("NewRequest(%q, %q): %v", method, url, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return resp, string(b)
}

// rawRequest sends head (a request line and headers, each line ending in "\r\n",
// without the blank line that ends them) as is on a new TCP connection to proxyURL's
// host, then the blank line, and returns the response, body read. Unlike http.Client it
// keeps the request target exactly as written ("//file/x", "/file\x"). It adds "Host"
// and "Connection: close" unless head has them. Not for HEAD: the body is read as a GET's.
func rawRequest(t testing.TB, proxyURL, head string) (*http.Response, string) {
	t.Helper()
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatalf("parsing %q: %v", proxyURL, err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", u.Host, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	lower := strings.ToLower(head)
	if !strings.Contains(lower, "\r\nhost:") {
		head += "Host: " + u.Host + "\r\n"
	}
	if !strings.Contains(lower, "\r\nconnection:") {
		head += "Connection: close\r\n"
	}
	if _, err := fmt.Fprintf(conn, "%s\r\n", head); err != nil {
		t.Fatalf("writing request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading response to %q: %v", head, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatalf("reading response body to %q: %v", head, err)
	}
	return resp, b.String()
}

// readTarget returns the request that net/http's server reads from the request line
// "method target HTTP/1.1" (url.ParseRequestURI on the target), or nil when it refuses
// the line.
func readTarget(method, target string) *http.Request {
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + target + " HTTP/1.1\r\nHost: mdproxy.test\r\n\r\n")))
	if err != nil || r.RequestURI != target {
		return nil
	}
	r.RemoteAddr = "192.0.2.1:1234"
	return r
}

// coreError decodes a Core-style error body {"err": "..."} and fails t unless it is
// one, with a non-empty message, served as JSON.
func coreError(t testing.TB, resp *http.Response, body []byte) string {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q is not JSON: %v", body, err)
	}
	msg, ok := e["err"].(string)
	if !ok || msg == "" || len(e) != 1 {
		t.Fatalf("body = %s, want {\"err\": \"<message>\"}", body)
	}
	return msg
}

// patternParam matches a chi URL parameter of a pattern, e.g. {data_id}.
var patternParam = regexp.MustCompile(`\{[^}]+\}`)

// samplePath turns a route pattern into a path it matches.
func samplePath(pattern string) string {
	p := patternParam.ReplaceAllString(pattern, "abc123")
	return strings.ReplaceAll(p, "*", "sub/x")
}

// pathVariants are spellings of /file/x that Core resolves to the same data_id: each
// must land in file_result's bucket.
var pathVariants = []string{
	"//file/x", "/file//x", "/file/x/", "/FILE/X", "/File/x", "/file/%78", "/%66ile/x",
	"/file/.x",
}

// dotPaths are paths with a "." or ".." segment, as written or percent-encoded, which
// the proxy refuses (canonicalPath).
var dotPaths = []string{
	"/file/.", "/file/..", "/file/%2e", "/file/%2E%2e", "/hash/.", "/hash/..", "/hash/%2e",
	"/file/batch/.", "/file/./x", "/file/batch/../x", "/file/x/.", "/file/%2e/x", "/./file/x",
	"/file/x/..//x", "/x/../file/x", "/file/.%2e/version",
}

// randomID returns 32 random hex digits, like a Core data_id.
func randomID(t testing.TB) string {
	var b [16]byte
	if _, err := crand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// bodyBlockLen is the length of the block bodyBlock repeats: a prime, so that no
// power-of-two buffer size of the proxy lines up with it, and a lost, repeated or
// reordered buffer changes the SHA-256 of the stream.
const bodyBlockLen = 65521

// bodyBlock is bodyBlockLen bytes drawn from a fixed ChaCha8 seed.
var bodyBlock = func() []byte {
	b := make([]byte, bodyBlockLen)
	r := rand.NewChaCha8([32]byte{'m', 'd', 'p', 'r', 'o', 'x', 'y'})
	_, _ = r.Read(b)
	return b
}()

// bodyBlockReader reads bodyBlock over and over, forever; wrap it in io.LimitReader.
// It never holds more than the block in memory, whatever the stream's length.
type bodyBlockReader struct{ off int }

func (r *bodyBlockReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], bodyBlock[r.off:])
		n += c
		r.off = (r.off + c) % bodyBlockLen
	}
	return n, nil
}

// bodyStream returns a deterministic reader of exactly n bytes.
func bodyStream(n int64) io.Reader { return io.LimitReader(&bodyBlockReader{}, n) }

// unknownLength hides the length of its reader, so that net/http's client sends it
// chunked.
type unknownLength struct{ io.Reader }

// countWriter counts the bytes written to it in n, and drops them.
type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(len(p)))
	return len(p), nil
}

// sha256Hex returns the hex SHA-256 of r's bytes and their number.
func sha256Hex(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// hexSum returns h's sum in hex.
func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// heapWatch samples the heap in use every few milliseconds until stop is called,
// which returns the largest sample minus the baseline taken, after a GC, when
// heapWatch was called.
func heapWatch() (stop func() (growth int64)) {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := int64(ms.HeapInuse)
	done := make(chan struct{})
	result := make(chan int64)
	go func() {
		var ms runtime.MemStats
		peak := base
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, int64(ms.HeapInuse))
			select {
			case <-done:
				result <- peak - base
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-result
	}
}

// longWait bounds a test's wait for something that must happen: generous, since it is
// only reached when the behaviour under test is broken (or the machine is very slow,
// e.g. under -race).
const longWait = 30 * time.Second

// noLeak registers, first, a cleanup that fails t if a goroutine started during the
// test outlives it. Registered before the servers, it runs after they are closed.
func noLeak(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// containsAny reports whether s contains one of subs (only for long enough s).
func containsAny(s string, subs []string) bool {
	if len(s) < 32 {
		return false
	}
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// setOf returns the set of vs.
func setOf(vs ...string) map[string]bool {
	m := make(map[string]bool, len(vs))
	for _, v := range vs {
		m[v] = true
	}
	return m
}

// metricValue returns the sum of the counter or gauge series name (e.g.
// "mdproxy_requests_total") whose labels include every pair of labels; 0 when none
// does. It reads reg through sidecartest's metric reader, which does not create a
// series by reading it (WithLabelValues would).
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	pairs := make([]string, 0, 2*len(labels))
	for k, v := range labels {
		pairs = append(pairs, k, v)
	}
	sum, _ := sidecartest.Gather(t, reg).Sum(name, pairs...)
	return sum
}

// waitMetric waits until metricValue(t, reg, name, labels) equals want, for at most
// longWait, then fails t with the last value. A forwarded request is counted when its
// handler returns, which may be just after the client has read the whole answer (the
// reverse proxy flushes as it copies); tests that count forwarded requests wait here.
func waitMetric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	for {
		got := metricValue(t, reg, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s%s = %v after %v, want %v", name, formatLabels(labels), got, longWait, want)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// mustWaitMetric waits up to longWait for metricValue(t, reg, name, labels) to reach
// want, then fails t at once with the value it has. The proxy counts a request once its
// handler has returned, which may be a moment after the client or the upstream saw the
// end of the exchange.
func mustWaitMetric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	for {
		got := metricValue(t, reg, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", name, labels, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkMetric fails t unless metricValue(t, reg, name, labels) is want now.
func checkMetric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	if got := metricValue(t, reg, name, labels); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// seriesCount is the number of series of family name in reg, failing t when reg
// cannot be gathered.
func seriesCount(t testing.TB, reg prometheus.Gatherer, name string) int {
	t.Helper()
	n, err := testutil.GatherAndCount(reg, name)
	if err != nil {
		t.Fatalf("GatherAndCount(%s) = %v, want no error", name, err)
	}
	return n
}

// formatLabels writes labels as Prometheus does, {k="v",...}, sorted by name.
func formatLabels(labels map[string]string) string {
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}

// waitJoined waits until at least n polls share a question another poll put to Core:
// goroutines parked in singleflight's Do on the WaitGroup of a call in progress (a
// call that ended has readied its waiters, which are then runnable, no longer parked).
// It fails t after longWait.
func waitJoined(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(longWait)
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		joined := 0
		for _, g := range strings.Split(string(buf[:k]), "\n\n") {
			// A goroutine's header, then each frame's function and file lines.
			lines := strings.Split(g, "\n")
			if !strings.Contains(lines[0], "[sync.WaitGroup.Wait") {
				continue
			}
			for i := 1; i+2 < len(lines); i += 2 {
				if strings.HasPrefix(lines[i], "sync.(*WaitGroup).Wait(") &&
					strings.HasPrefix(lines[i+2], "golang.org/x/sync/singleflight.(*Group).Do(") {
					joined++
					break
				}
			}
		}
		if joined >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d polls share another's question to Core after %v, want %d", joined, longWait, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// pollsAtOnce starts n GETs of url through c at once; wait returns each one's status
// and body (0 and "" for one that failed, which fails t).
func pollsAtOnce(t *testing.T, c *http.Client, url string, n int) (wait func() (codes []int, bodies []string)) {
	var wg sync.WaitGroup
	codes, bodies := make([]int, n), make([]string, n)
	for i := range n {
		wg.Go(func() {
			resp, err := c.Get(url)
			if err != nil {
				t.Errorf("poll %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Errorf("poll %d: reading: %v", i, err)
			}
			bodies[i], codes[i] = string(b), resp.StatusCode
		})
	}
	return func() ([]int, []string) {
		wg.Wait()
		return codes, bodies
	}
}
