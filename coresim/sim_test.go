package coresim

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// rig is an emulator under test: its API served by an httptest server, its callback
// workers running (Run without driving), its model advanced by hand.
type rig struct {
	t   *testing.T
	sim *Sim
	reg *prometheus.Registry
	srv *httptest.Server
	c   *http.Client
	// ctx ends when the test does: requests still waiting for core time give up, so
	// that the server can close.
	ctx context.Context
}

// newRig starts an emulator for cfg and stops it when the test ends.
func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	reg := prometheus.NewRegistry()
	sim, err := New(cfg, reg)
	if err != nil {
		t.Fatalf("New(cfg) = %v, want no error", err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close) // last: once the requests in flight gave up
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		sim.Run(ctx, false)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	c := srv.Client()
	// Keep the connections of concurrent pollers for their next round.
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = 512
	return &rig{t: t, sim: sim, reg: reg, srv: srv, c: c, ctx: ctx}
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

// metric returns the value of the counter or gauge name with the given label pairs,
// read from the registry; it fails the test when there is no such series.
func (r *rig) metric(name string, labels ...string) float64 {
	r.t.Helper()
	v, ok := rigGather(r.t, r.reg, name, labels...)
	if !ok {
		r.t.Fatalf("metric %s%v not exported", name, labels)
	}
	return v
}

func rigGather(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

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

// TestBoundedGoroutines submits thousands of files while the model stands still: the
// emulator holds them in its queue, not in goroutines, and keeps no spooled upload.
func TestBoundedGoroutines(t *testing.T) {
	cfg := rigConfig(t)
	r := newRig(t, cfg)
	const files = 3000
	r.mustSubmit([]byte("warm-up: opens the client's connection"), nil)
	for i := range 20 {
		r.mustSubmit(rigZip(t, 3, 10+i), map[string]string{"filename": "x.docx"})
	}
	before := runtime.NumGoroutine()
	for i := range files {
		r.mustSubmit([]byte(fmt.Sprintf("file %d", i)), nil)
	}
	after := runtime.NumGoroutine()
	if after > before+3 {
		t.Errorf("goroutines after %d more queued files = %d, want at most %d + 3 (none a file)", files, after, before)
	}
	if got, want := r.sim.model.QueueLen(), files+21; got != want {
		t.Errorf("QueueLen() = %d, want %d", got, want)
	}
	if got := r.metric("coresim_queue_files"); got != files+21 {
		t.Errorf("coresim_queue_files = %v, want %d", got, files+21)
	}
	if left, err := os.ReadDir(cfg.TempDir); err != nil || len(left) != 0 {
		t.Errorf("files left in CORESIM_TEMP_DIR after 20 zip uploads = %d (%v), want 0", len(left), err)
	}
}

// TestQueueSize checks that POST /file answers 503 "Server is too busy" beyond
// CORESIM_QUEUE_SIZE waiting files, and accepts again once scans leave the queue.
func TestQueueSize(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Cores = 2
	cfg.QueueSize = 5
	r := newRig(t, cfg)
	for i := range cfg.QueueSize {
		r.mustSubmit([]byte(fmt.Sprintf("file %d", i)), nil)
	}
	code, msg := r.submit([]byte("one too many"), nil)
	if code != http.StatusServiceUnavailable || msg != "Server is too busy. Try again later." {
		t.Errorf("POST /file with %d queued = %d %q, want 503 %q", cfg.QueueSize, code, msg, "Server is too busy. Try again later.")
	}
	if got := r.metric("coresim_submissions_total", "result", "busy"); got != 1 {
		t.Errorf(`coresim_submissions_total{result="busy"} = %v, want 1`, got)
	}
	// One step moves two files to the cores: room for two more, not three.
	r.sim.advance(10 * time.Millisecond)
	for i := range 2 {
		if code, msg := r.submit([]byte(fmt.Sprintf("again %d", i)), nil); code != http.StatusOK {
			t.Errorf("POST /file %d after 2 files left the queue = %d %q, want 200", i, code, msg)
		}
	}
	if code, _ := r.submit([]byte("again, too many"), nil); code != http.StatusServiceUnavailable {
		t.Errorf("POST /file with a full queue again = %d, want 503", code)
	}
	if got := r.metric("coresim_submissions_total", "result", "accepted"); got != 7 {
		t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want 7`, got)
	}
}

// TestQueueSizeConcurrent sends many submissions at once: the queue still never holds
// more than CORESIM_QUEUE_SIZE files (the seed's clients send ten at a time).
func TestQueueSizeConcurrent(t *testing.T) {
	cfg := rigConfig(t)
	cfg.QueueSize = 10
	r := newRig(t, cfg)
	const senders = 40
	body := rigZip(t, 20, 1000) // long enough to read that the senders overlap
	var wg sync.WaitGroup
	codes := make([]int, senders)
	start := make(chan struct{})
	for i := range senders {
		wg.Go(func() {
			<-start
			codes[i] = r.do(http.MethodPost, "/file", body, map[string]string{"filename": "a.docx"}).code
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for _, c := range codes {
		switch c {
		case http.StatusOK:
			ok++
		case http.StatusServiceUnavailable:
		default:
			t.Errorf("POST /file = %d, want 200 or 503", c)
		}
	}
	if ok != cfg.QueueSize || r.sim.model.QueueLen() != cfg.QueueSize {
		t.Errorf("%d concurrent POST /file with CORESIM_QUEUE_SIZE=%d: %d accepted, %d queued, want %d and %d",
			senders, cfg.QueueSize, ok, r.sim.model.QueueLen(), cfg.QueueSize, cfg.QueueSize)
	}
}

// TestRetention checks that a completed result is dropped once older than
// CORESIM_RETENTION (virtual), from GET /file/{data_id} and from the hash look-up.
func TestRetention(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Retention = time.Minute
	r := newRig(t, cfg)
	body := []byte("kept for a minute")
	id := r.mustSubmit(body, nil)
	var res analysisResult
	r.get("/file/"+id, &res)
	md5 := res.FileInfo.MD5

	step := 100 * time.Millisecond
	for r.get("/file/"+id, &res); res.ProcessInfo.ProgressPercent != 100; r.get("/file/"+id, &res) {
		if r.sim.model.Now() > time.Minute {
			t.Fatalf("GET /file/%s progress after 1 min = %d, want 100", id, res.ProcessInfo.ProgressPercent)
		}
		r.sim.advance(step)
	}
	finished := r.sim.model.Now()
	r.sim.advance(10 * time.Second)
	other := r.mustSubmit([]byte("submitted 10 s later"), nil)
	for r.sim.model.Now() < finished+cfg.Retention-step {
		r.sim.advance(step)
	}
	if code := r.get("/file/"+id, nil); code != http.StatusOK {
		t.Errorf("GET /file/{id} at age %v < retention %v = %d, want 200", r.sim.model.Now()-finished, cfg.Retention, code)
	}
	var hit map[string]any
	if r.get("/hash/"+md5, &hit); hit["data_id"] != id {
		t.Errorf("GET /hash/{md5} at age < retention = %v, want the result of %s", hit, id)
	}

	r.sim.advance(2 * step)
	var notFound map[string]string
	if code := r.get("/file/"+id, &notFound); code != http.StatusNotFound || notFound["err"] != "Not found" {
		t.Errorf("GET /file/{id} at age %v > retention %v = %d %v, want 404 {\"err\":\"Not found\"}",
			r.sim.model.Now()-finished, cfg.Retention, code, notFound)
	}
	var miss map[string]string
	if code := r.get("/hash/"+md5, &miss); code != http.StatusOK || miss[md5] != "Not Found" {
		t.Errorf("GET /hash/{md5} after retention = %d %v, want 200 {%q: \"Not Found\"}", code, miss, md5)
	}
	// The file completed 10 s later is still there.
	if code := r.get("/file/"+other, nil); code != http.StatusOK {
		t.Errorf("GET /file/{id} of a younger result = %d, want 200", code)
	}
}

// TestMetrics follows three files through the cores and reads every gauge and counter
// of the emulator from the registry.
func TestMetrics(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Cores = 2
	cfg.ScanCostObject, cfg.ScanCostMiB = time.Second, 0
	cfg.PollCostBase, cfg.PollCostEntry = 10*time.Millisecond, time.Millisecond
	cfg.BatchCostFile, cfg.RejectCost = 5*time.Millisecond, 2*time.Millisecond
	cfg.FetchLimit, cfg.FetchBurst = 0.0001, 3 // three fetches, then every one rejected
	r := newRig(t, cfg)

	type want struct {
		queue, scanning, busy, completed, objects, scan float64
	}
	check := func(when string, w want) {
		t.Helper()
		for _, m := range []struct {
			name string
			want float64
		}{
			{"coresim_queue_files", w.queue},
			{"coresim_scanning_files", w.scanning},
			{"coresim_busy_cores", w.busy},
			{"coresim_files_completed_total", w.completed},
			{"coresim_objects_scanned_total", w.objects},
		} {
			if got := r.metric(m.name); !modelNear(got, m.want) {
				t.Errorf("%s: %s = %v, want %v", when, m.name, got, m.want)
			}
		}
		if got := r.metric("coresim_core_seconds_total", "work", "scan"); !modelNear(got, w.scan) {
			t.Errorf(`%s: coresim_core_seconds_total{work="scan"} = %v, want %v`, when, got, w.scan)
		}
		if got, want := r.metric("coresim_virtual_seconds"), r.sim.model.Now().Seconds(); got != want {
			t.Errorf("%s: coresim_virtual_seconds = %v, want %v", when, got, want)
		}
	}

	var b struct {
		BatchID string `json:"batch_id"`
	}
	if resp := r.do(http.MethodPost, "/file/batch", nil, nil); resp.code != http.StatusOK || json.Unmarshal(resp.body, &b) != nil {
		t.Fatalf("POST /file/batch = %d %q, want 200 and a batch_id", resp.code, resp.body)
	}
	a := r.mustSubmit(rigZip(t, 4, 100), map[string]string{"filename": "a.docx"}) // 5 objects, 5 s
	r.mustSubmit([]byte("b"), nil)                                                // 1 object, 1 s
	r.mustSubmit([]byte("c"), map[string]string{"batch": b.BatchID})              // 1 object, 1 s
	check("queued", want{queue: 3})
	if got := r.metric("coresim_cores"); got != 2 {
		t.Errorf("coresim_cores = %v, want 2", got)
	}
	if got := r.metric("coresim_speedup"); got != 1 {
		t.Errorf("coresim_speedup = %v, want 1", got)
	}
	if got := r.metric("coresim_submissions_total", "result", "accepted"); got != 3 {
		t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want 3`, got)
	}

	r.sim.advance(500 * time.Millisecond) // a and b scan, c waits
	check("at 0.5 s", want{queue: 1, scanning: 2, busy: 2, scan: 1})
	r.sim.advance(500 * time.Millisecond) // b done
	check("at 1 s", want{queue: 1, scanning: 1, busy: 2, completed: 1, objects: 1, scan: 2})
	r.sim.advance(time.Second) // c starts and ends, a at 2 of 5
	check("at 2 s", want{scanning: 1, busy: 2, completed: 2, objects: 2, scan: 4})
	r.sim.advance(3 * time.Second) // a ends: 3 core-s in 3 s
	check("at 5 s", want{busy: 1, completed: 3, objects: 7, scan: 7})
	r.sim.advance(time.Second)
	check("idle", want{completed: 3, objects: 7, scan: 7})

	step := 10 * time.Millisecond
	// A poll of a's complete result: 10 ms + 5 objects × 7 engines × 1 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/"+a), 0, step); resp.code != http.StatusOK {
		t.Errorf("GET /file/{a} = %d, want 200", resp.code)
	}
	// An unknown data_id: 10 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/0123456789abcdef0123456789abcdef"), 0, step); resp.code != http.StatusNotFound {
		t.Errorf("GET /file/{unknown} = %d, want 404", resp.code)
	}
	// The batch status page of one file: 10 ms + 5 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/batch/"+b.BatchID), 0, step); resp.code != http.StatusOK {
		t.Errorf("GET /file/batch/{id} = %d, want 200", resp.code)
	}
	// The burst is spent: two polls and a batch status rejected, 2 ms each.
	for _, path := range []string{"/file/" + a, "/file/" + a, "/file/batch/" + b.BatchID} {
		resp := r.awaitAnswer(r.async(http.MethodGet, path), 0, step)
		if resp.code != http.StatusServiceUnavailable {
			t.Errorf("GET %s over Core's limit = %d, want 503", path, resp.code)
		}
	}
	for _, m := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"kind", "result", "result", "served"}, 1},
		{[]string{"kind", "result", "result", "not_found"}, 1},
		{[]string{"kind", "result", "result", "rejected"}, 2},
		{[]string{"kind", "batch_status", "result", "served"}, 1},
		{[]string{"kind", "batch_status", "result", "rejected"}, 1},
	} {
		if got := r.metric("coresim_fetches_total", m.labels...); got != m.want {
			t.Errorf("coresim_fetches_total%v = %v, want %v", m.labels, got, m.want)
		}
	}
	// Rejections book core time that nobody waits for: it is spent at the next step.
	r.sim.advance(10 * time.Millisecond)
	for _, m := range []struct {
		work string
		want float64
	}{
		{"scan", 7},
		{"poll", 0.045 + 0.010 + 2*0.002}, // and each receiving by a worker (RejectCost)
		{"batch_status", 0.015 + 0.002},
		{"reject", 3 * 0.002},
	} {
		if got := r.metric("coresim_core_seconds_total", "work", m.work); !modelNear(got, m.want) {
			t.Errorf(`coresim_core_seconds_total{work=%q} = %v, want %v`, m.work, got, m.want)
		}
	}
}

// rigFlood offers far more fetches than Core's own limit allows, n at each step of
// 100 ms over span, and returns how many were accepted and rejected; every rejection
// must be a 503 with a Core-style body. post, when true, submits a file at each step as
// well: submissions are not limited.
func (r *rig) flood(paths []string, n int, span time.Duration, post bool) (accepted, rejected int) {
	r.t.Helper()
	const step = 100 * time.Millisecond
	for at := time.Duration(0); ; at += step {
		for i := range n {
			path := paths[i%len(paths)]
			resp := r.do(http.MethodGet, path, nil, nil)
			switch resp.code {
			case http.StatusOK:
				accepted++
			case http.StatusServiceUnavailable:
				rejected++
				var e map[string]string
				if err := json.Unmarshal(resp.body, &e); err != nil || e["err"] == "" {
					r.t.Errorf("GET %s over Core's limit = 503 %q, want a body {\"err\": ...}", path, resp.body)
				}
			default:
				r.t.Fatalf("GET %s = %d %q (%v), want 200 or 503", path, resp.code, resp.body, resp.err)
			}
		}
		if post {
			if code, msg := r.submit([]byte(fmt.Sprintf("submitted at %v", at)), nil); code != http.StatusOK {
				r.t.Errorf("POST /file while fetches are over Core's limit = %d %q, want 200", code, msg)
			}
		}
		if at >= span {
			return accepted, rejected
		}
		r.sim.advance(step)
	}
}

// TestFetchWait checks Core's limit with a wait (FetchWait): a fetch over the limit
// whose turn comes within the wait is held, then served at the limit's pace; one whose
// turn is further away is answered 503 at once.
func TestFetchWait(t *testing.T) {
	cfg := rigConfig(t)
	cfg.FetchLimit, cfg.FetchBurst, cfg.FetchWait = 2, 1, time.Second
	r := newRig(t, cfg)
	id := r.mustSubmit([]byte("waited for"), nil)

	type answer struct {
		code int
		at   time.Duration // virtual time of the answer
	}
	answers := make(chan answer, 5)
	for range 5 {
		go func() {
			resp := r.do(http.MethodGet, "/file/"+id, nil, nil)
			answers <- answer{resp.code, r.sim.model.Now()}
		}()
	}
	// receive waits for n answers; quiet checks that no other one comes meanwhile.
	receive := func(n int) (ok, refused int) {
		t.Helper()
		for range n {
			select {
			case a := <-answers:
				switch a.code {
				case http.StatusOK:
					ok++
				case http.StatusServiceUnavailable:
					refused++
				default:
					t.Fatalf("GET /file/{id} = %d, want 200 or 503", a.code)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d answers still missing after 10 s", n, n)
			}
		}
		return ok, refused
	}
	quiet := func(when string) {
		t.Helper()
		select {
		case a := <-answers:
			t.Errorf("%s: an answer %d at %v, want none yet", when, a.code, a.at)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// At 2/s with a burst of 1 and a wait of 1 s: the first fetch passes, the next two
	// are given turns at 0.5 s and 1 s, the last two would wait 1.5 s: refused.
	if ok, refused := receive(3); ok != 1 || refused != 2 {
		t.Fatalf("answers at once = %d × 200, %d × 503, want 1 and 2", ok, refused)
	}
	quiet("before 0.5 s")
	for i, at := range []time.Duration{500 * time.Millisecond, time.Second} {
		r.sim.advance(400 * time.Millisecond)
		quiet(fmt.Sprintf("%v before the turn at %v", r.sim.model.Now(), at))
		r.sim.advance(100 * time.Millisecond)
		if ok, _ := receive(1); ok != 1 {
			t.Fatalf("waiting fetch %d at %v: not served, want 200", i+1, at)
		}
	}
	if got := r.metric("coresim_fetches_total", "kind", "result", "result", "rejected"); got != 2 {
		t.Errorf("coresim_fetches_total{result=rejected} = %v, want 2", got)
	}
}

// TestFetchLimit floods GET /file/{data_id} and GET /file/batch/{batch_id} and checks
// that Core's own limit lets exactly burst + rate × virtual elapsed through, within
// one, and never limits POST /file.
func TestFetchLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     float64
		burst     int
		kinds     []string // "result", "batch_status"
		perStep   int
		span      time.Duration
		wantBurst int
	}{
		{"results, 10/s", 10, 0, []string{"result"}, 5, 10 * time.Second, 10},
		{"results, 2/s, burst 5", 2, 5, []string{"result"}, 3, 20 * time.Second, 5},
		{"results, 0.5/s", 0.5, 0, []string{"result"}, 2, 30 * time.Second, 1},
		{"batch status, 4/s", 4, 0, []string{"batch_status"}, 2, 10 * time.Second, 4},
		{"results and batch status share the limit, 20/s", 20, 0, []string{"result", "batch_status"}, 8, 5 * time.Second, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rigConfig(t)
			cfg.FetchLimit, cfg.FetchBurst = tc.limit, max(tc.burst, tc.wantBurst)
			r := newRig(t, cfg)
			var b struct {
				BatchID string `json:"batch_id"`
			}
			if resp := r.do(http.MethodPost, "/file/batch", nil, nil); json.Unmarshal(resp.body, &b) != nil {
				t.Fatalf("POST /file/batch = %d %q, want a batch_id", resp.code, resp.body)
			}
			id := r.mustSubmit([]byte("polled"), map[string]string{"batch": b.BatchID})
			var paths []string
			for _, k := range tc.kinds {
				paths = append(paths, map[string]string{"result": "/file/" + id, "batch_status": "/file/batch/" + b.BatchID}[k])
			}

			accepted, rejected := r.flood(paths, tc.perStep, tc.span, true)
			want := float64(tc.wantBurst) + tc.limit*tc.span.Seconds()
			if math.Abs(float64(accepted)-want) > 1 {
				t.Errorf("fetches accepted over %v at %d a step = %d, want burst %d + %v/s × %v = %v (±1)",
					tc.span, tc.perStep, accepted, tc.wantBurst, tc.limit, tc.span, want)
			}
			offered := tc.perStep * (int(tc.span/(100*time.Millisecond)) + 1)
			if accepted+rejected != offered {
				t.Errorf("fetches answered = %d + %d, want %d offered", accepted, rejected, offered)
			}
			served, rej := 0.0, 0.0
			for _, k := range tc.kinds {
				served += r.metric("coresim_fetches_total", "kind", k, "result", "served")
				rej += r.metric("coresim_fetches_total", "kind", k, "result", "rejected")
			}
			if int(served) != accepted || int(rej) != rejected {
				t.Errorf("coresim_fetches_total served, rejected = %v, %v, want %d, %d", served, rej, accepted, rejected)
			}
			if got, want := r.metric("coresim_submissions_total", "result", "accepted"), float64(int(tc.span/(100*time.Millisecond))+2); got != want {
				t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want %v: POST /file is never limited`, got, want)
			}
		})
	}
}

// TestFetchLimitOff checks that without CORESIM_FETCH_LIMIT (Core's default) no fetch
// is refused.
func TestFetchLimitOff(t *testing.T) {
	r := newRig(t, rigConfig(t))
	id := r.mustSubmit([]byte("polled"), nil)
	accepted, rejected := r.flood([]string{"/file/" + id}, 20, time.Second, false)
	if accepted != 220 || rejected != 0 {
		t.Errorf("fetches without a limit: %d accepted, %d rejected, want 220, 0", accepted, rejected)
	}
}

// mechanism is what one run of the seed's workload measured.
type mechanism struct {
	duration                    time.Duration // virtual, from the first submission to the last completion
	served, rejected            int           // poll answers: 200, 503
	learned                     int           // files whose complete result a poller got
	rejectSpent, pollSpent, all float64       // core-seconds
}

// runSeedWorkload replays the seed's test steps at a small scale through the HTTP API,
// advancing virtual time by hand in steps of 100 ms: turns of 10 submissions a virtual
// second until files are submitted, and, when poll is true, every 5 virtual seconds a
// GET /file/{data_id} of every data_id whose result the pollers do not have yet. It
// returns when the last scan completed and every poll was answered.
func runSeedWorkload(t *testing.T, cfg Config, files int, body []byte, poll bool) mechanism {
	t.Helper()
	r := newRig(t, cfg)
	const step = 100 * time.Millisecond
	var (
		mu       sync.Mutex
		ids      []string
		learned  = map[string]bool{}
		inflight = map[string]bool{}
		out      mechanism
		wg       sync.WaitGroup
	)
	pollOne := func(id string) {
		defer wg.Done()
		resp := r.do(http.MethodGet, "/file/"+id, nil, nil)
		mu.Lock()
		defer mu.Unlock()
		delete(inflight, id)
		switch {
		case resp.err != nil:
			t.Errorf("GET /file/%s: %v", id, resp.err)
		case resp.code == http.StatusOK:
			out.served++
			var res analysisResult
			if err := json.Unmarshal(resp.body, &res); err != nil {
				t.Errorf("GET /file/%s = 200 %q: %v", id, resp.body, err)
			}
			if res.ProcessInfo.ProgressPercent == 100 {
				learned[id] = true
			}
		case resp.code == http.StatusServiceUnavailable:
			out.rejected++
			var e map[string]string
			if err := json.Unmarshal(resp.body, &e); err != nil || e["err"] == "" {
				t.Errorf("GET /file/%s = 503 %q, want a body {\"err\": ...}", id, resp.body)
			}
		default:
			t.Errorf("GET /file/%s = %d %q, want 200 or 503", id, resp.code, resp.body)
		}
	}
	round := func() {
		// The pollers have read every answer already paid for: whether an id is polled
		// again depends on virtual time only, not on how fast the goroutines ran.
		// (A fetch books core time twice, to be received then answered: in between it is
		// neither booked nor answered, hence the condition, not a count taken once.)
		rigWaitFor(t, "the paid polls to be answered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(inflight) == rigPending(r.sim.model)
		})
		mu.Lock()
		n := 0
		for _, id := range ids {
			if learned[id] || inflight[id] {
				continue
			}
			inflight[id] = true
			n++
			wg.Add(1)
			go pollOne(id)
		}
		mu.Unlock()
		// Each poll in flight books its core time before time moves on; a rejection is
		// answered at once, its core time booked without a wait.
		rigWaitFor(t, fmt.Sprintf("%d polls to book core time or be refused", n), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rigPending(r.sim.model) == len(inflight)
		})
	}

	completed := func() bool {
		running, _, _ := r.sim.model.Load()
		return running == 0 && r.sim.model.QueueLen() == 0
	}
	for i := 0; ; i++ {
		now := time.Duration(i) * step
		if now%time.Second == 0 {
			for range min(10, files-len(ids)) {
				ids = append(ids, r.mustSubmit(body, map[string]string{"filename": "seed.docx"}))
			}
		}
		if poll && now > 0 && now%(5*time.Second) == 0 {
			round()
		}
		r.sim.advance(step)
		if len(ids) == files && completed() {
			out.duration = r.sim.model.Now()
			break
		}
		if i > 100000 {
			t.Fatalf("the workload did not complete in %v virtual", now)
		}
	}
	// Let the last polls be answered.
	for rigPending(r.sim.model) > 0 {
		r.sim.advance(step)
	}
	wg.Wait()
	out.learned = len(learned)
	if got := r.metric("coresim_files_completed_total"); got != float64(files) {
		t.Errorf("coresim_files_completed_total = %v, want %d", got, files)
	}
	_, _, spent := r.sim.model.Load()
	out.rejectSpent, out.pollSpent, out.all = spent[workReject], spent[workPoll], modelSpentTotal(spent)
	if got := r.metric("coresim_core_seconds_total", "work", "reject"); got != out.rejectSpent {
		t.Errorf(`coresim_core_seconds_total{work="reject"} = %v, want Load's %v`, got, out.rejectSpent)
	}
	// A series of a counter vector exists once counted.
	if got, _ := rigGather(t, r.reg, "coresim_fetches_total", "kind", "result", "result", "rejected"); int(got) != out.rejected {
		t.Errorf(`coresim_fetches_total{kind="result",result="rejected"} = %v, want the %d 503 answers`, got, out.rejected)
	}
	return out
}

// TestPollingSlowsScanning reproduces the seed's mechanism on virtual time: answering
// result polls takes core time from scanning, so the same workload lasts longer when
// polls are answered at a high rate, and Core's own limit of 1 fetch a second brings
// the duration back, at the price of rejecting most polls.
func TestPollingSlowsScanning(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 200 submissions three times")
	}
	cfg := DefaultConfig() // 8 cores, as the seed's host
	cfg.TempDir = t.TempDir()
	// The rounds below are synchronized on polls booking core time at once: no
	// request latency, which would hold them on a virtual timer first, and no cost to
	// receive a fetch, which would book it in two stages (TestMetrics checks what a
	// rejection costs).
	cfg.RequestLatency, cfg.RejectCost = 0, 0
	// A fetch over Core's limit is refused at once rather than held for its turn
	// (TestFetchWait checks the wait): the rounds wait for every answer.
	cfg.FetchWait = 0
	// The slowdown grows with files × poll cost / cores, so a small workload needs a
	// dearer poll than the default 50 ms to show it.
	cfg.PollCostBase = 100 * time.Millisecond
	// Each submission costs 1.5 core-s, a quarter of the seed's 6.5: the run, and the
	// number of polls, are four times smaller (TestModelPollingSlowsScanning replays
	// the seed's 65 objects on the model alone).
	cfg.ScanCostObject = 1500 * time.Millisecond
	const files = 200
	body := []byte("one of 200 identical submissions")

	none := runSeedWorkload(t, cfg, files, body, false)
	polled := runSeedWorkload(t, cfg, files, body, true)
	limited := cfg
	limited.FetchLimit = 1
	capped := runSeedWorkload(t, limited, files, body, true)

	t.Logf("no polls: %v; polls every 5 s, no limit: %v (%d served, %.1f core-s); Core's limit 1/s: %v (%d served, %d rejected, %.3f core-s of rejections)",
		none.duration, polled.duration, polled.served, polled.pollSpent, capped.duration, capped.served, capped.rejected, capped.rejectSpent)

	if min := time.Duration(float64(none.duration) * 1.2); polled.duration < min {
		t.Errorf("duration with polls answered at will = %v, want at least +20%% over %v without polls = %v", polled.duration, none.duration, min)
	}
	// Polls queue for Core's 3 API workers, so the last files' results are learned in
	// rounds after the scans end: most, not all, are known when the last scan ends.
	if polled.rejected != 0 || polled.learned < files*8/10 {
		t.Errorf("without a limit: %d polls rejected, %d results learned, want 0 and at least %d", polled.rejected, polled.learned, files*8/10)
	}
	if d := math.Abs(float64(capped.duration-none.duration)) / float64(none.duration); d > 0.10 {
		t.Errorf("duration under Core's limit of 1/s = %v, want within 10%% of %v without polls (off by %.1f%%)", capped.duration, none.duration, 100*d)
	}
	if total := capped.served + capped.rejected; capped.rejected < total*9/10 {
		t.Errorf("polls under Core's limit of 1/s: %d rejected of %d, want most (at least 90%%)", capped.rejected, total)
	}
	if want := float64(capped.rejected) * limited.RejectCost.Seconds(); !modelNear(capped.rejectSpent, want) {
		t.Errorf("core-seconds spent rejecting = %v, want %d rejections × %v = %v", capped.rejectSpent, capped.rejected, limited.RejectCost, want)
	}
	if none.served != 0 || none.pollSpent != 0 {
		t.Errorf("without polls: %d polls served, %v core-s spent on polls, want 0, 0", none.served, none.pollSpent)
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	got, err := LoadConfig(nil)
	if err != nil {
		t.Fatalf("LoadConfig(nil) = %v, want no error", err)
	}
	want := Config{
		ListenAddr: "127.0.0.1:8008", AdminAddr: "127.0.0.1:9008",
		Cores: 8, Speedup: 1, Tick: 5 * time.Millisecond, QueueSize: 4000, ReadyQueue: 3600,
		Engines:        []string{"AhnLab", "Avira", "Bitdefender", "ESET", "K7", "Quick Heal", "Vir.IT Explorer"},
		ScanCostObject: 83 * time.Millisecond, ScanCostMiB: 600 * time.Millisecond,
		PollCostBase: 60 * time.Millisecond, PollCostEntry: 15 * time.Microsecond,
		BatchCostFile: 2 * time.Millisecond, RejectCost: 400 * time.Microsecond,
		APIWorkers: 4, RequestLatency: 200 * time.Millisecond,
		FetchBurst: 5, FetchWait: 2 * time.Second,
		CallbackRetries: 3, CallbackDelay: time.Second, CallbackIncrease: time.Second,
		CallbackTimeout: 10 * time.Second, CallbackWorkers: 16,
		Retention: 24 * time.Hour, User: "admin", Password: "admin",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LoadConfig(nil) = %+v, want %+v", got, want)
	}
	if d := DefaultConfig(); !reflect.DeepEqual(d, want) {
		t.Errorf("DefaultConfig() = %+v, want %+v", d, want)
	}
}

func TestLoadConfigValues(t *testing.T) {
	for _, tc := range []struct {
		environ map[string]string
		check   func(Config) bool
		want    string
	}{
		{map[string]string{"CORESIM_ENGINES": " A , B C"}, func(c Config) bool { return slices.Equal(c.Engines, []string{"A", "B C"}) }, "Engines [A, B C]"},
		{map[string]string{"CORESIM_SPEEDUP": "0.5", "CORESIM_CORES": "2"}, func(c Config) bool { return c.Speedup == 0.5 && c.Cores == 2 }, "Speedup 0.5, Cores 2"},
		{map[string]string{"CORESIM_FETCH_LIMIT": "0.5", "CORESIM_FETCH_BURST": "3", "CORESIM_FETCH_WAIT": "0s"}, func(c Config) bool { return c.FetchLimit == 0.5 && c.FetchBurst == 3 && c.FetchWait == 0 }, "FetchLimit 0.5, FetchBurst 3, FetchWait 0"},
		{map[string]string{"CORESIM_ADMIN_ADDR": ""}, func(c Config) bool { return c.AdminAddr == "" }, `AdminAddr "" (no admin listener)`},
		{map[string]string{"CORESIM_SCAN_COST_MIB": "0s"}, func(c Config) bool { return c.ScanCostMiB == 0 && c.ScanCostObject == 83*time.Millisecond }, "ScanCostMiB 0"},
		{map[string]string{"CORESIM_CALLBACK_RETRIES": "0", "CORESIM_CALLBACK_DELAY": "0s"}, func(c Config) bool { return c.CallbackRetries == 0 && c.CallbackDelay == 0 }, "no retries, no delay"},
		{map[string]string{"CORESIM_QUEUE_SIZE": "1", "CORESIM_READY_QUEUE": "0"}, func(c Config) bool { return c.QueueSize == 1 && c.ReadyQueue == 0 }, "QueueSize 1, ReadyQueue 0"},
		{map[string]string{"CORESIM_RETENTION": "90m", "CORESIM_TICK": "250us"}, func(c Config) bool { return c.Retention == 90*time.Minute && c.Tick == 250*time.Microsecond }, "Retention 90m, Tick 250µs"},
		{map[string]string{"CORESIM_APIKEY": "k", "CORESIM_TEMP_DIR": "/tmp/x"}, func(c Config) bool { return c.APIKey == "k" && c.TempDir == "/tmp/x" }, "APIKey k, TempDir /tmp/x"},
	} {
		got, err := LoadConfig(tc.environ)
		if err != nil || !tc.check(got) {
			t.Errorf("LoadConfig(%v) = %+v, %v, want %s", tc.environ, got, err, tc.want)
		}
	}
}

// TestLoadConfigErrors checks that every bad CORESIM_* value is refused with an
// *envconf.Error naming that very variable.
func TestLoadConfigErrors(t *testing.T) {
	bad := map[string][]string{
		"LISTEN_ADDR":       {""},
		"CORES":             {"0", "-1", "x", "1.5"},
		"SPEEDUP":           {"0", "-1", "x", "NaN", "2e6"},
		"TICK":              {"0s", "-1ms", "5", "x"},
		"QUEUE_SIZE":        {"0", "-5", "x"},
		"READY_QUEUE":       {"-1", "x"},
		"ENGINES":           {",", " , ", "A,,B"},
		"SCAN_COST_OBJECT":  {"-1ms", "90"},
		"SCAN_COST_MIB":     {"-1ms", "600"},
		"POLL_COST_BASE":    {"-1ms", "2"},
		"POLL_COST_ENTRY":   {"-1us", "130"},
		"BATCH_COST_FILE":   {"-1ms", "2"},
		"REJECT_COST":       {"-1ms", "0.4"},
		"FETCH_LIMIT":       {"-1", "x"},
		"FETCH_BURST":       {"0", "-1", "1.5"},
		"FETCH_WAIT":        {"-1s", "1"},
		"CALLBACK_RETRIES":  {"-1", "x"},
		"CALLBACK_DELAY":    {"-1s", "1"},
		"CALLBACK_INCREASE": {"-1s", "1"},
		"CALLBACK_TIMEOUT":  {"0s", "10"},
		"CALLBACK_WORKERS":  {"0", "x"},
		"RETENTION":         {"0s", "-1h", "24"},
	}
	type tcase struct {
		environ map[string]string
		want    string // the variable the error must name
	}
	var cases []tcase
	for name, values := range bad {
		for _, v := range values {
			cases = append(cases, tcase{map[string]string{EnvPrefix + name: v}, EnvPrefix + name})
		}
	}
	cases = append(cases,
		tcase{map[string]string{"CORESIM_SCAN_COST_OBJECT": "0s", "CORESIM_SCAN_COST_MIB": "0s"}, "CORESIM_SCAN_COST_OBJECT"},
		tcase{map[string]string{"CORESIM_CORES": "4", "CORESIM_RETENTION": "0s"}, "CORESIM_RETENTION"},
	)
	for _, tc := range cases {
		_, err := LoadConfig(tc.environ)
		var e *envconf.Error
		if !errors.As(err, &e) {
			t.Errorf("LoadConfig(%q) = %v, want an *envconf.Error naming %s", tc.environ, err, tc.want)
			continue
		}
		if e.Var != tc.want || e.Value != tc.environ[tc.want] || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadConfig(%q) = %v (Var %s, Value %q), want an error naming %s=%q",
				tc.environ, err, e.Var, e.Value, tc.want, tc.environ[tc.want])
		}
	}
}

// TestNewValidates checks that New refuses a configuration built in code that makes no
// sense, naming the variable that would set it.
func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Cores = 0 }, "CORESIM_CORES"},
		{func(c *Config) { c.Speedup = 0 }, "CORESIM_SPEEDUP"},
		{func(c *Config) { c.Engines = nil }, "CORESIM_ENGINES"},
		{func(c *Config) { c.CallbackWorkers = 0 }, "CORESIM_CALLBACK_WORKERS"},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		_, err := New(cfg, nil)
		var e *envconf.Error
		if !errors.As(err, &e) || e.Var != tc.want {
			t.Errorf("New(cfg with a bad %s) = %v, want an *envconf.Error naming it", tc.want, err)
		}
	}
}
