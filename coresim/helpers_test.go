package coresim

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// The test helpers of package coresim, all of them: the emulators under test and the
// requests sent to them, virtual time, callback receivers, metric reads, bodies and
// comparisons. Test files hold their tests, their tables and the drivers of one
// experiment (runSeedWorkload, modelReplaySeed, rig.flood); contract_test.go holds the
// OpenAPI contract that apiHarness checks every answer against.
//
// Two emulators under test serve the tests, both on an httptest server with virtual
// time that the test advances by hand: a rig sends requests that cost no core time by
// default (rigConfig) and leaves virtual time to the test; an apiHarness advances
// virtual time itself while a request waits on the model, and checks every exchange
// against the contract.

// rig is an emulator under test: its API served through Start, its callback workers
// running, its model advanced by hand (StartOptions.ManualTime).
type rig struct {
	t   *testing.T
	sim *Sim
	reg *prometheus.Registry
	srv *Server
	c   *http.Client
	// ctx ends when the test does: requests still waiting for core time give up, so
	// that the server can close.
	ctx context.Context
}

// startManual starts an emulator for cfg on a free loopback port, without an admin
// listener, its virtual time moved by hand, with its metrics on reg (nil: a registry
// of its own); cleanup stops it.
func startManual(t *testing.T, cfg Config, reg *prometheus.Registry) *Server {
	t.Helper()
	cfg.ListenAddr, cfg.AdminAddr = "127.0.0.1:0", ""
	srv, err := Start(cfg, StartOptions{Registry: reg, ManualTime: true})
	if err != nil {
		t.Fatalf("Start(cfg) = %v, want no error", err)
	}
	t.Cleanup(srv.Close) // last: once the requests in flight gave up
	return srv
}

// newRig starts an emulator for cfg and stops it when the test ends.
func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv := startManual(t, cfg, reg)
	ctx, cancel := context.WithCancel(context.Background())
	// Keep the connections of concurrent pollers for their next round.
	tr := &http.Transport{MaxIdleConnsPerHost: 512}
	t.Cleanup(func() {
		cancel()
		tr.CloseIdleConnections()
	})
	return &rig{t: t, sim: srv.Sim, reg: reg, srv: srv, c: &http.Client{Transport: tr}, ctx: ctx}
}

// rigConfig is the default configuration with answers that cost no core time and no
// latency, so that requests are answered without advancing the model, and uploads spooled in a
// directory of the test.
func rigConfig(t *testing.T) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.PollCostBase, cfg.PollCostEntry, cfg.BatchCostFile, cfg.RejectCost = 0, 0, 0, 0
	cfg.RequestLatency = 0
	// Fetches over Core's limit are refused at once: the rig's requests are
	// synchronous, and TestFetchWait checks the wait.
	cfg.FetchWait = 0
	cfg.TempDir = t.TempDir()
	return cfg
}

// rigResponse is an answer of the emulator.
type rigResponse struct {
	code int
	body []byte
	err  error // the request failed
}

// do sends a request; it is safe to call from any goroutine.
func (r *rig) do(method, path string, body []byte, hdr map[string]string) rigResponse {
	req, err := http.NewRequestWithContext(r.ctx, method, r.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		return rigResponse{err: err}
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := r.c.Do(req)
	if err != nil {
		return rigResponse{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return rigResponse{code: resp.StatusCode, body: b, err: err}
}

// submit POSTs body to /file and returns the status and the data_id (or the error
// message).
func (r *rig) submit(body []byte, hdr map[string]string) (code int, idOrErr string) {
	r.t.Helper()
	resp := r.do(http.MethodPost, "/file", body, hdr)
	if resp.err != nil {
		r.t.Fatalf("POST /file: %v", resp.err)
	}
	var out struct {
		DataID string `json:"data_id"`
		Err    string `json:"err"`
	}
	if err := json.Unmarshal(resp.body, &out); err != nil {
		r.t.Fatalf("POST /file = %d %q: not JSON: %v", resp.code, resp.body, err)
	}
	if resp.code == http.StatusOK {
		return resp.code, out.DataID
	}
	return resp.code, out.Err
}

// mustSubmit POSTs body to /file and returns its data_id.
func (r *rig) mustSubmit(body []byte, hdr map[string]string) string {
	r.t.Helper()
	code, id := r.submit(body, hdr)
	if code != http.StatusOK || id == "" {
		r.t.Fatalf("POST /file = %d %q, want 200 and a data_id", code, id)
	}
	return id
}

// get sends GET path and decodes a JSON answer into v (when not nil).
func (r *rig) get(path string, v any) int {
	r.t.Helper()
	resp := r.do(http.MethodGet, path, nil, nil)
	if resp.err != nil {
		r.t.Fatalf("GET %s: %v", path, resp.err)
	}
	if v != nil {
		if err := json.Unmarshal(resp.body, v); err != nil {
			r.t.Fatalf("GET %s = %d %q: not JSON: %v", path, resp.code, resp.body, err)
		}
	}
	return resp.code
}

// async sends a request in a goroutine; its answer arrives on the channel. Requests
// that cost core time are answered only once the model has served it.
func (r *rig) async(method, path string) <-chan rigResponse {
	ch := make(chan rigResponse, 1)
	go func() { ch <- r.do(method, path, nil, nil) }()
	return ch
}

// awaitAnswer waits for the request behind ch to book its core time (pending charges
// beyond booked), so that it is served at the virtual time it was sent, then advances
// the model by step until that time is paid, and returns the answer.
func (r *rig) awaitAnswer(ch <-chan rigResponse, booked int, step time.Duration) rigResponse {
	r.t.Helper()
	var resp rigResponse
	answered := false
	// A fetch books core time in two stages (a worker receives it, then answers it):
	// advance while a charge is pending, else wait for the next charge or the answer.
	for i := 0; !answered; i++ {
		if i == 10000 {
			r.t.Fatalf("request not paid after 10000 steps of %v", step)
		}
		rigWaitFor(r.t, "the request to book its core time or answer", func() bool {
			select {
			case resp = <-ch:
				answered = true
				return true
			default:
				return rigPending(r.sim.model) > booked
			}
		})
		if !answered {
			r.sim.advance(step)
		}
	}
	if resp.err != nil {
		r.t.Fatalf("request: %v", resp.err)
	}
	return resp
}

// apiHarness is an emulator served through Start whose virtual time the test drives
// by hand (Sim.advance): Run delivers callbacks only. Every answer goes through the
// contract check.
type apiHarness struct {
	sim *Sim
	srv *Server
	c   *http.Client
	// step is the virtual time advanced at a time while a request waits for its core
	// time (result polls, hash look-ups, batch status).
	step time.Duration
	// offContract, when set, skips the contract check (for deliberately odd requests).
	offContract bool
}

// newAPIHarness starts an emulator with the default configuration changed by tune (may
// be nil); its TempDir is a fresh t.TempDir(). Everything stops when the test ends.
func newAPIHarness(t *testing.T, tune func(*Config)) *apiHarness {
	t.Helper()
	coreContractFor(t)
	cfg := DefaultConfig()
	cfg.TempDir = t.TempDir()
	cfg.CallbackWorkers = 2
	if tune != nil {
		tune(&cfg)
	}
	// Closing the server ends a poll still waiting for core time.
	srv := startManual(t, cfg, nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &apiHarness{sim: srv.Sim, srv: srv, c: &http.Client{Transport: tr}, step: time.Millisecond}
}

// apiCall is one request to the emulator.
type apiCall struct {
	method, path string // path with its query
	header       http.Header
	body         []byte // nil: no body (a POST still sends Content-Length: 0)
	chunked      bool   // send body without Content-Length (Transfer-Encoding: chunked)
}

// apiResp is the emulator's answer.
type apiResp struct {
	status int
	header http.Header
	body   []byte
}

// apiHeader builds a header from name, value pairs.
func apiHeader(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// exactTime makes requests free and instant in virtual time (no poll or batch cost,
// no request latency), so that polling leaves the model where it was: for tests that
// check a state reached by advance.
func exactTime(c *Config) {
	c.PollCostBase, c.PollCostEntry, c.BatchCostFile, c.RequestLatency, c.RejectCost = 0, 0, 0, 0, 0
}

// do sends c and returns the answer. While the request waits on the model (core time
// or a virtual delay), it advances virtual time by step at a time; only then, so that
// a request that costs nothing leaves the model where it was. The exchange is checked
// against the spec.
func (h *apiHarness) do(t *testing.T, c apiCall) apiResp {
	t.Helper()
	var body io.Reader
	if c.body != nil {
		body = bytes.NewReader(c.body)
	}
	if c.chunked {
		body = io.MultiReader(bytes.NewReader(c.body)) // of unknown length
	}
	req, err := http.NewRequestWithContext(t.Context(), c.method, h.srv.URL+c.path, body)
	if err != nil {
		t.Fatalf("http.NewRequest(%s %s) error = %v, want nil", c.method, c.path, err)
	}
	if c.chunked {
		req.ContentLength = -1
	}
	for k, vs := range c.header {
		req.Header[k] = vs
	}
	type result struct {
		resp apiResp
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := h.c.Do(req)
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{apiResp{resp.StatusCode, resp.Header, b}, err}
	}()
	guard := time.NewTimer(30 * time.Second) // real time: a hung request fails the test
	defer guard.Stop()
	var r result
wait:
	for {
		select {
		case r = <-got:
			break wait
		case <-guard.C:
			t.Fatalf("%s %s: no answer after 30s of real time (virtual time %v)", c.method, c.path, h.sim.model.Now())
		default:
		}
		if modelWaiting(h.sim.model) > 0 {
			h.sim.advance(h.step)
		} else {
			runtime.Gosched()
		}
	}
	if r.err != nil {
		t.Fatalf("%s %s error = %v, want nil", c.method, c.path, r.err)
	}
	if !h.offContract {
		ex := exchange{
			method: c.method, path: c.path, reqHeader: req.Header, reqBody: c.body,
			status: r.resp.status, respHeader: r.resp.header, respBody: r.resp.body,
		}
		if err := coreContractFor(t).check(t.Context(), ex); err != nil {
			t.Errorf("contract: %s %s -> %d %s:\n%v", c.method, c.path, r.resp.status, bodyExcerpt(r.resp.body, 300), err)
		}
	}
	return r.resp
}

// bodyExcerpt returns b, cut to n bytes, for messages.
func bodyExcerpt(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func (h *apiHarness) get(t *testing.T, path string, kv ...string) apiResp {
	t.Helper()
	return h.do(t, apiCall{method: http.MethodGet, path: path, header: apiHeader(kv...)})
}

func (h *apiHarness) post(t *testing.T, path string, body []byte, kv ...string) apiResp {
	t.Helper()
	return h.do(t, apiCall{method: http.MethodPost, path: path, header: apiHeader(kv...), body: body})
}

// submit POSTs body to /file as application/octet-stream, wants 200 and returns the
// data_id.
func (h *apiHarness) submit(t *testing.T, body []byte, kv ...string) string {
	t.Helper()
	resp := h.post(t, "/file", body, append([]string{"Content-Type", "application/octet-stream"}, kv...)...)
	var out struct {
		DataID string `json:"data_id"`
	}
	resp.decode(t, &out)
	if resp.status != http.StatusOK || len(out.DataID) != 32 {
		t.Fatalf("POST /file = %d %s, want 200 with a data_id of 32 hex digits", resp.status, resp.body)
	}
	return out.DataID
}

// result GETs /file/{id}, wants 200 and returns the result.
func (h *apiHarness) result(t *testing.T, id string) analysisResult {
	t.Helper()
	resp := h.get(t, "/file/"+id)
	if resp.status != http.StatusOK {
		t.Fatalf("GET /file/%s = %d %s, want 200", id, resp.status, resp.body)
	}
	var res analysisResult
	resp.decode(t, &res)
	return res
}

// settle advances virtual time until no scan is queued or running.
func (h *apiHarness) settle(t *testing.T) {
	t.Helper()
	for i := 0; ; i++ {
		running, _, _ := h.sim.model.Load()
		if running == 0 && h.sim.model.QueueLen() == 0 {
			return
		}
		if i == 100000 {
			t.Fatalf("scans still pending after %v of virtual time", h.sim.model.Now())
		}
		h.sim.advance(100 * time.Millisecond)
	}
}

// decode unmarshals the body into v.
func (r apiResp) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("json.Unmarshal(%s) error = %v, want nil", bodyExcerpt(r.body, 300), err)
	}
}

// errMsg returns the err of a {"err": ...} body, or "" when it is not one.
func (r apiResp) errMsg() string {
	var e struct {
		Err string `json:"err"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Err
}

// rawExchange writes raw to the emulator over TCP, reads the answer, and checks it
// against the spec like apiHarness.do does.
func rawExchange(t *testing.T, h *apiHarness, method, path, raw string) apiResp {
	t.Helper()
	conn, err := net.Dial("tcp", h.srv.API.String())
	if err != nil {
		t.Fatalf("net.Dial(%s) error = %v, want nil", h.srv.API, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // real time: a hung server fails the test
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatalf("writing %q error = %v, want nil", raw, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("http.ReadResponse(answer to %q) error = %v, want nil", raw, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer to %q error = %v, want nil", raw, err)
	}
	ex := exchange{method: method, path: path, reqHeader: http.Header{}, status: resp.StatusCode, respHeader: resp.Header, respBody: body}
	if err := coreContractFor(t).check(t.Context(), ex); err != nil {
		t.Errorf("contract: %s %s -> %d %s:\n%v", method, path, resp.StatusCode, body, err)
	}
	return apiResp{status: resp.StatusCode, header: resp.Header, body: body}
}

// wantErrBody fails unless resp is status with exactly Core's body {"err": msg}.
func wantErrBody(t *testing.T, what string, resp apiResp, status int, msg string) {
	t.Helper()
	want := `{"err":` + strconv.Quote(msg) + `}`
	if resp.status != status || string(resp.body) != want {
		t.Errorf("%s = %d %s, want %d %s", what, resp.status, resp.body, status, want)
	}
	if ct := resp.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("%s Content-Type = %q, want application/json", what, ct)
	}
}

// safety bounds, in real time, every wait of the tests of Run (startRun, newClient).
const safety = 10 * time.Second

// started is what Run reports once it listens.
type started struct{ api, admin net.Addr }

// startRun runs Run with environ until the test ends, and returns the addresses it
// listens on and a function that stops it and returns its error.
func startRun(t *testing.T, environ map[string]string) (addrs started, stop func() (logs string, err error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var logbuf bytes.Buffer
	up := make(chan started, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, environ, &logbuf, func(api, admin net.Addr) { up <- started{api, admin} })
	}()
	var stopped bool
	var runErr error
	stop = func() (string, error) {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(safety):
				t.Fatalf("Run did not return %v after its context ended", safety)
			}
		}
		return logbuf.String(), runErr
	}
	t.Cleanup(func() { stop() })
	select {
	case addrs = <-up:
	case err := <-done:
		stopped = true
		cancel()
		t.Fatalf("Run(%v) = %v before listening, want it to serve", environ, err)
	case <-time.After(safety):
		t.Fatalf("Run(%v) did not listen within %v", environ, safety)
	}
	return addrs, stop
}

// newClient returns a client of its own, whose connections are closed when the test
// ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: safety}
}

func call(t *testing.T, c *http.Client, method, url string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, b
}

// Virtual time: what waits on the model, and steps that wait for the goroutines a step
// sets off.

// rigPending returns the number of foreground charges not yet paid.
func rigPending(m *model) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fg.Len()
}

// rigWaitFor waits, in real time, up to 10 s for cond, which another goroutine makes
// true (a handler booking core time, a callback worker finishing an attempt). It
// synchronizes; it asserts nothing about time.
func rigWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// modelWaiting returns the number of requests waiting on the model: for their core
// time, or for a virtual delay (model.After, e.g. RequestLatency).
func modelWaiting(m *model) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fg.Len() + m.timers.Len()
}

// modelPaid reports whether a charge's channel is closed, without waiting.
func modelPaid(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// callbacksPending returns the deliveries waiting in the heap and the due time of the
// first one.
func callbacksPending(s *Sim) (n int, next time.Duration) {
	s.cb.mu.Lock()
	defer s.cb.mu.Unlock()
	if len(s.cb.pending) == 0 {
		return 0, 0
	}
	return len(s.cb.pending), s.cb.pending[0].due
}

// callbackCounts returns the callback attempts made and the outcomes counted so far.
func callbackCounts(s *Sim) (attempts, outcomes float64) {
	attempts = testutil.ToFloat64(s.m.callbackAttempts.WithLabelValues("ok")) + testutil.ToFloat64(s.m.callbackAttempts.WithLabelValues("error"))
	outcomes = testutil.ToFloat64(s.m.callbacks.WithLabelValues("delivered")) + testutil.ToFloat64(s.m.callbacks.WithLabelValues("failed"))
	return attempts, outcomes
}

// callbackStep advances the emulator by d. When that hands a delivery to the callback
// workers (a scan with a callbackurl completed, or a retry fell due), it waits until
// the attempt is over and either its outcome counted or its retry booked, so that the
// next step starts from a settled state. It reports whether an attempt was made.
func (r *rig) callbackStep(d time.Duration) bool {
	r.t.Helper()
	n, next := callbacksPending(r.sim)
	due := n > 0 && next <= r.sim.model.Now()+d
	completed := testutil.ToFloat64(r.sim.m.filesCompleted)
	attempts, outcomes := callbackCounts(r.sim)
	r.sim.advance(d)
	if !due && testutil.ToFloat64(r.sim.m.filesCompleted) == completed {
		return false
	}
	rigWaitFor(r.t, "the callback attempt", func() bool {
		a, _ := callbackCounts(r.sim)
		return a == attempts+1
	})
	rigWaitFor(r.t, "the callback's outcome or its retry", func() bool {
		n, _ := callbacksPending(r.sim)
		_, o := callbackCounts(r.sim)
		return n > 0 || o > outcomes
	})
	return true
}

// Callback receivers.

// hookAttempt is one delivery a callback receiver got.
type hookAttempt struct {
	at          time.Duration // virtual time of the emulator when it arrived
	method      string
	contentType string
	body        []byte
}

// hookReceiver is a callback receiver that answers the status codes of a script, one
// an attempt (the last one again once the script is used up), and records every
// attempt with the emulator's virtual time.
type hookReceiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	attempts []hookAttempt
}

func newHookReceiver(t *testing.T, sim *Sim, codes ...int) *hookReceiver {
	t.Helper()
	h := &hookReceiver{}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.attempts = append(h.attempts, hookAttempt{at: sim.model.Now(), method: r.Method, contentType: r.Header.Get("Content-Type"), body: body})
		code := codes[min(len(h.attempts), len(codes))-1]
		h.mu.Unlock()
		w.WriteHeader(code)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) got() []hookAttempt {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.attempts)
}

// webhookStatus is the answer of GET /file/webhook/{data_id}.
type webhookStatus struct {
	DataID      string `json:"data_id"`
	URL         string `json:"url"`
	StatusCode  int    `json:"status_code"`
	RequestTime string `json:"request_time"`
	Attempts    int    `json:"attempts"`
	Delivered   bool   `json:"delivered"`
}

// Metric reads.

// metric returns the value of the one series of name with the given label pairs as
// the registry exports it, as a scrape sees it; it fails the test unless exactly one
// series has them. Where a test holds the collector, a counter of Sim.m, it reads it
// with testutil.ToFloat64 instead; the emulator's gauges and
// coresim_core_seconds_total are GaugeFunc and CounterFunc collectors that
// newSimMetrics registers without keeping, and a read through WithLabelValues would
// create the very series whose export TestMetrics checks.
func (r *rig) metric(name string, labels ...string) float64 {
	r.t.Helper()
	v, n := sidecartest.Gather(r.t, r.reg).Sum(name, labels...)
	if n != 1 {
		r.t.Fatalf("metric %s%v: %d series, want 1", name, labels, n)
	}
	return v
}

// Bodies.

// rigZip returns a zip archive (an Office Open XML file is one) of parts parts of
// size bytes each: Core scans it as 1 + parts objects.
func rigZip(t testing.TB, parts, size int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for i := range parts {
		w, err := zw.Create(fmt.Sprintf("word/part%03d.xml", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(bytes.Repeat([]byte{'a' + byte(i%26)}, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ooxmlPart is one entry of a built Office Open XML package; a name ending in "/" is a
// directory entry (no data), which inspect must skip.
type ooxmlPart struct {
	name   string
	data   []byte
	stored bool // zip.Store instead of zip.Deflate
}

// ooxmlKind describes a package type: its extension, main part and main content type,
// the parts it has besides the common ones, and the Type inspect reports for it.
type ooxmlKind struct {
	ext, typ           string
	mainPart, mainType string
	extra              []ooxmlPart
}

// ooxmlFile is a built package: its bytes and its non-directory parts in archive order.
type ooxmlFile struct {
	data  []byte
	parts []ooxmlPart
	dirs  int
}

// ooxmlMedia returns n deterministic, incompressible bytes behind a file signature.
func ooxmlMedia(seed uint64, sig string, n int) []byte {
	var s [32]byte
	s[0] = byte(seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(s).Read(b)
	copy(b, sig)
	return b
}

const (
	ooxmlPNG  = "\x89PNG\r\n\x1a\n"
	ooxmlJPEG = "\xff\xd8\xff\xe0"
	xmlHead   = `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>` + "\n"
)

var (
	ooxmlDOCX = ooxmlKind{
		ext: "docx", typ: "DOCX", mainPart: "word/document.xml",
		mainType: "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
		extra: []ooxmlPart{
			{name: "word/document.xml", data: []byte(xmlHead + `<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>Quarterly report</w:t></w:r></w:p></w:body></w:document>`)},
			{name: "word/styles.xml", data: []byte(xmlHead + `<w:styles xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"/>`)},
			{name: "word/_rels/document.xml.rels", data: []byte(xmlHead + `<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" Target="media/image1.png"/><Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/image" Target="media/image2.jpeg"/></Relationships>`)},
			{name: "word/media/"},
			{name: "word/media/image1.png", data: ooxmlMedia(1, ooxmlPNG, 40000), stored: true},
			{name: "word/media/image2.jpeg", data: ooxmlMedia(2, ooxmlJPEG, 70000)},
		},
	}
	ooxmlXLSX = ooxmlKind{
		ext: "xlsx", typ: "XLSX", mainPart: "xl/workbook.xml",
		mainType: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
		extra: []ooxmlPart{
			{name: "xl/workbook.xml", data: []byte(xmlHead + `<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>`)},
			{name: "xl/_rels/workbook.xml.rels", data: []byte(xmlHead + `<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/></Relationships>`)},
			{name: "xl/worksheets/"},
			{name: "xl/worksheets/sheet1.xml", data: []byte(xmlHead + `<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData><row r="1"><c r="A1" t="inlineStr"><is><t>42</t></is></c></row></sheetData></worksheet>`)},
			{name: "xl/media/image1.png", data: ooxmlMedia(3, ooxmlPNG, 90000)},
		},
	}
	ooxmlPPTX = ooxmlKind{
		ext: "pptx", typ: "PPTX", mainPart: "ppt/presentation.xml",
		mainType: "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml",
		extra: []ooxmlPart{
			{name: "ppt/presentation.xml", data: []byte(xmlHead + `<p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><p:sldIdLst><p:sldId id="256" r:id="rId1"/></p:sldIdLst></p:presentation>`)},
			{name: "ppt/_rels/presentation.xml.rels", data: []byte(xmlHead + `<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/slide" Target="slides/slide1.xml"/></Relationships>`)},
			{name: "ppt/slides/slide1.xml", data: []byte(xmlHead + `<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"><p:cSld><p:spTree/></p:cSld></p:sld>`)},
			{name: "ppt/media/"},
			{name: "ppt/media/image1.png", data: ooxmlMedia(4, ooxmlPNG, 30000), stored: true},
			{name: "ppt/media/image2.png", data: []byte{}}, // an empty part
		},
	}
	ooxmlXLTX = ooxmlKind{
		ext: "xltx", typ: "XLTX", mainPart: "xl/workbook.xml",
		mainType: "application/vnd.openxmlformats-officedocument.spreadsheetml.template.main+xml",
		extra: []ooxmlPart{
			{name: "xl/workbook.xml", data: []byte(xmlHead + `<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheets/></workbook>`)},
			{name: "xl/media/image1.jpeg", data: ooxmlMedia(6, ooxmlJPEG, 120000)},
		},
	}
)

// ooxmlBuild builds a package of kind k: [Content_Types].xml, _rels/.rels,
// docProps/core.xml, docProps/app.xml, then k's parts.
func ooxmlBuild(t *testing.T, k ooxmlKind, more ...ooxmlPart) ooxmlFile {
	t.Helper()
	var overrides strings.Builder
	fmt.Fprintf(&overrides, `<Override PartName="/%s" ContentType="%s"/>`, k.mainPart, k.mainType)
	for _, p := range append(append([]ooxmlPart{}, k.extra...), more...) {
		switch {
		case strings.HasPrefix(p.name, "xl/worksheets/sheet"):
			fmt.Fprintf(&overrides, `<Override PartName="/%s" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>`, p.name)
		case strings.HasPrefix(p.name, "ppt/slides/slide"):
			fmt.Fprintf(&overrides, `<Override PartName="/%s" ContentType="application/vnd.openxmlformats-officedocument.presentationml.slide+xml"/>`, p.name)
		}
	}
	parts := []ooxmlPart{
		{name: "[Content_Types].xml", data: []byte(xmlHead + `<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">` +
			`<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>` +
			`<Default Extension="xml" ContentType="application/xml"/><Default Extension="png" ContentType="image/png"/>` +
			`<Default Extension="jpeg" ContentType="image/jpeg"/><Default Extension="txt" ContentType="text/plain"/>` +
			overrides.String() +
			`<Override PartName="/docProps/core.xml" ContentType="application/vnd.openxmlformats-package.core-properties+xml"/>` +
			`<Override PartName="/docProps/app.xml" ContentType="application/vnd.openxmlformats-officedocument.extended-properties+xml"/></Types>`)},
		{name: "_rels/"},
		{name: "_rels/.rels", data: []byte(xmlHead + `<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">` +
			`<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="` + k.mainPart + `"/>` +
			`<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/metadata/core-properties" Target="docProps/core.xml"/>` +
			`<Relationship Id="rId3" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/extended-properties" Target="docProps/app.xml"/></Relationships>`)},
		{name: "docProps/core.xml", data: []byte(xmlHead + `<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>coresim test</dc:title><dc:creator>coresim</dc:creator></cp:coreProperties>`)},
		{name: "docProps/app.xml", data: []byte(xmlHead + `<Properties xmlns="http://schemas.openxmlformats.org/officeDocument/2006/extended-properties"><Application>coresim</Application></Properties>`)},
	}
	parts = append(parts, k.extra...)
	parts = append(parts, more...)

	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	f := ooxmlFile{}
	for _, p := range parts {
		if strings.HasSuffix(p.name, "/") {
			if _, err := zw.Create(p.name); err != nil {
				t.Fatalf("zip Create(%q) error = %v, want nil", p.name, err)
			}
			f.dirs++
			continue
		}
		method := zip.Deflate
		if p.stored {
			method = zip.Store
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: p.name, Method: method})
		if err != nil {
			t.Fatalf("zip CreateHeader(%q) error = %v, want nil", p.name, err)
		}
		if _, err := w.Write(p.data); err != nil {
			t.Fatalf("zip Write(%q) error = %v, want nil", p.name, err)
		}
		f.parts = append(f.parts, p)
	}
	if err := zw.Close(); err != nil {
		t.Fatalf("zip Close() error = %v, want nil", err)
	}
	f.data = buf.Bytes()
	return f
}

// hashesOf returns the md5, sha1 and sha256 of b in hex.
func hashesOf(b []byte) (md, s1, s256 string) {
	m, a, c := md5.Sum(b), sha1.Sum(b), sha256.Sum256(b)
	return hex.EncodeToString(m[:]), hex.EncodeToString(a[:]), hex.EncodeToString(c[:])
}

// eicarChunkReader returns its data n bytes a read at most.
type eicarChunkReader struct {
	data []byte
	n    int
}

func (r *eicarChunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.data))
	copy(p, r.data[:k])
	r.data = r.data[k:]
	return k, nil
}

// withEICAR returns size bytes of filler with the EICAR string at offset at.
func withEICAR(size, at int) []byte {
	b := bytes.Repeat([]byte{'.'}, size)
	copy(b[at:], eicar)
	return b
}

// cutReader returns its data, then err.
type cutReader struct {
	data []byte
	err  error
}

func (r *cutReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// Comparisons.

// modelNear reports whether two amounts of core-seconds are equal but for rounding.
func modelNear(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*max(1, math.Abs(want))
}

// modelSpentTotal sums the core-seconds spent by every kind of work.
func modelSpentTotal(spent [numWork]float64) float64 {
	total := 0.0
	for _, s := range spent {
		total += s
	}
	return total
}

// assertDirEmpty fails unless dir holds nothing (the spool file was removed).
func assertDirEmpty(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("os.ReadDir(%s) error = %v, want nil", dir, err)
	}
	if len(entries) != 0 {
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("temporary dir %s holds %v, want nothing", dir, names)
	}
}
