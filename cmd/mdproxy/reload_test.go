package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// gatedReader reads r, and holds the read that follows the first before bytes until
// gate is closed (or fails with ctx's error once ctx ends): an upload stopped in its
// middle.
type gatedReader struct {
	ctx    context.Context
	r      io.Reader
	before int64
	gate   <-chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.before == 0 {
		select {
		case <-g.gate:
			g.before = -1
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		}
	}
	if g.before > 0 && int64(len(p)) > g.before {
		p = p[:g.before]
	}
	n, err := g.r.Read(p)
	if g.before > 0 {
		g.before -= int64(n)
	}
	return n, err
}

// waitLog waits until the process logged a line containing text.
func waitLog(t *testing.T, p *proc, text string) {
	t.Helper()
	select {
	case <-p.logs.Written(text):
	case <-p.exited:
		t.Fatalf("mdproxy exited (%v) before logging %q; stderr:\n%s", p.Err(), text, p.logs)
	case <-time.After(safety):
		t.Fatalf("mdproxy did not log %q within %v; stderr:\n%s", text, safety, p.logs)
	}
}

// checkAlive checks that the process still runs and answers its /healthz.
func checkAlive(t *testing.T, p *proc) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("mdproxy exited: %v; stderr:\n%s", p.Err(), p.logs)
	default:
	}
	if code, _ := sidecartest.Get(t, sidecartest.NewClient(t), p.adminURL+"/healthz"); code != http.StatusOK {
		t.Errorf("GET admin /healthz = %d, want 200", code)
	}
}

// TestSIGHUPDuringUpload sends SIGHUP to mdproxy while a 100 MB upload is half-way
// through it, with a limits file (reloaded) and without one (nothing to reload): the
// upload completes byte for byte and the process lives on.
func TestSIGHUPDuringUpload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		file   bool
		logged string
	}{
		{"limits file", true, `"trigger":"signal hangup"`},
		{"no limits file", false, "limits not reloaded: MDPROXY_LIMITS_FILE is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := sidecartest.NewUpstream(t)
			env := map[string]string{}
			if tc.file {
				path := filepath.Join(t.TempDir(), "limits.env")
				if err := os.WriteFile(path, []byte("MDPROXY_FILE_RESULT_RATE=5\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				env["MDPROXY_LIMITS_FILE"] = path
			}
			p := startBinary(t, up.URL, env)

			const size, half = 100 << 20, 50 << 20
			src, sum := sidecartest.Payload(3, size)
			ctx, cancel := context.WithTimeout(context.Background(), safety)
			defer cancel()
			gate := make(chan struct{})
			release := sync.OnceFunc(func() { close(gate) })
			defer release()
			result := make(chan sidecartest.UploadResult, 1)
			client := sidecartest.NewClient(t)
			go func() {
				body := &gatedReader{ctx: ctx, r: src, before: half, gate: gate}
				result <- sidecartest.PostFile(ctx, client, p.proxyURL, body, size)
			}()
			// Half the upload has reached the upstream: it is in the middle of mdproxy.
			deadline := time.Now().Add(safety)
			for up.Received.Load() < half {
				if time.Now().After(deadline) {
					t.Fatalf("upstream received %d bytes within %v, want %d", up.Received.Load(), safety, half)
				}
				time.Sleep(5 * time.Millisecond)
			}

			p.signal(t, syscall.SIGHUP)
			waitLog(t, p, tc.logged)
			checkAlive(t, p)
			release()
			select {
			case res := <-result:
				sidecartest.CheckUpload(t, up, res, size, sum)
			case <-time.After(safety):
				t.Fatalf("upload did not end within %v of its release", safety)
			}
			checkAlive(t, p)

			// A second SIGHUP, at rest, is as harmless; then SIGTERM stops it cleanly.
			p.signal(t, syscall.SIGHUP)
			checkAlive(t, p)
			p.signal(t, syscall.SIGTERM)
			if code := p.wait(t); code != 0 {
				t.Errorf("mdproxy after SIGHUPs and SIGTERM exit code = %d, want 0; stderr:\n%s", code, p.logs)
			}
		})
	}
}

// TestSIGHUPChangesLimit changes the limits file where mdproxy does not see it change
// (the file is a symlink into a directory it does not watch), then sends SIGHUP: the
// new limit is in force, read because of the signal.
func TestSIGHUPChangesLimit(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	target := filepath.Join(t.TempDir(), "real.env")
	if err := os.WriteFile(target, []byte("MDPROXY_FILE_RESULT_RATE=0.001\nMDPROXY_FILE_RESULT_BURST=1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "limits.env")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})
	const rate = `mdproxy_limit_rate_requests_per_second{route="file_result"}`
	const reloads = `mdproxy_config_reloads_total{result="success"}`
	c := sidecartest.NewClient(t)
	poll := func() int {
		code, _ := sidecartest.Get(t, c, p.proxyURL+"/file/x")
		return code
	}
	if first, second := poll(), poll(); first != http.StatusOK || second != http.StatusServiceUnavailable {
		t.Fatalf("2 polls at rate 0.001, burst 1 = %d, %d; want 200, 503", first, second)
	}
	if got := p.metric(t, rate); got != 0.001 {
		t.Fatalf("%s = %v at start, want 0.001", rate, got)
	}

	if err := os.WriteFile(target, []byte("MDPROXY_FILE_RESULT_RATE=1000\nMDPROXY_FILE_RESULT_BURST=1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGHUP)
	waitLog(t, p, `"msg":"limits reloaded"`)
	if got := p.metric(t, rate); got != 1000 {
		t.Errorf("%s after SIGHUP = %v, want 1000", rate, got)
	}
	if got := p.metric(t, reloads); got != 1 {
		t.Errorf("%s after SIGHUP = %v, want 1 (the signal's)", reloads, got)
	}
	for i := range 5 {
		if code := poll(); code != http.StatusOK {
			t.Errorf("poll #%d after SIGHUP raised the rate = %d, want 200", i+1, code)
		}
	}
	if l := findLine(t, p, "limits reloaded"); l == nil || l["trigger"] != "signal hangup" {
		t.Errorf("%q line = %v, want trigger %q", "limits reloaded", l, "signal hangup")
	}
	checkAlive(t, p)
}

// findLine returns the first of the process's log lines whose msg is msg, or nil.
func findLine(t *testing.T, p *proc, msg string) map[string]any {
	t.Helper()
	for _, l := range sidecartest.CheckJSONLogs(t, p.logs.String()) {
		if l["msg"] == msg {
			return l
		}
	}
	return nil
}

// configWatch polls the admin /config of p, as fast as it answers, and records each
// limit of file_result it shows that differs from the one before, until stop.
type configWatch struct {
	mu   sync.Mutex
	seen []string // "rate/burst", each a change from the one before
	errs []error

	stopOnce sync.Once
	done     chan struct{}
	finished chan struct{}
}

func watchConfig(t *testing.T, p *proc) *configWatch {
	t.Helper()
	w := &configWatch{done: make(chan struct{}), finished: make(chan struct{})}
	c := sidecartest.NewClient(t)
	go func() {
		defer close(w.finished)
		for {
			select {
			case <-w.done:
				return
			default:
				w.poll(c, p)
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// poll reads /config once and records what it shows.
func (w *configWatch) poll(c *http.Client, p *proc) {
	var cfg struct {
		Routes map[string]struct {
			Rate  float64 `json:"rate_per_s"`
			Burst int     `json:"burst"`
		} `json:"routes"`
	}
	resp, err := c.Get(p.adminURL + "/config")
	if err == nil {
		err = json.NewDecoder(resp.Body).Decode(&cfg)
		resp.Body.Close()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errs = append(w.errs, err)
		return
	}
	l := fmt.Sprintf("%g/%d", cfg.Routes["file_result"].Rate, cfg.Routes["file_result"].Burst)
	if len(w.seen) == 0 || w.seen[len(w.seen)-1] != l {
		w.seen = append(w.seen, l)
	}
}

// stop ends the polling and waits for it.
func (w *configWatch) stop() {
	w.stopOnce.Do(func() { close(w.done) })
	<-w.finished
}

// check stops the polling, reads /config once more (what is in force now: the last
// poll may have begun before it), and checks that the limits /config showed were want,
// in order, and that it answered every time.
func (w *configWatch) check(t *testing.T, p *proc, when string, want ...string) {
	t.Helper()
	w.stop()
	w.poll(sidecartest.NewClient(t), p)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) > 0 {
		t.Errorf("%s: GET /config failed %d times, first: %v", when, len(w.errs), w.errs[0])
	}
	if !slices.Equal(w.seen, want) {
		t.Errorf("%s: file_result's limits in /config went %v, want %v", when, w.seen, want)
	}
}

// writeInPlace rewrites the file at path in place as issue 29's trial did: truncated,
// then first written after pause, then the rest after another pause.
func writeInPlace(t *testing.T, path, first, rest string, pause time.Duration) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, part := range []string{first, rest} {
		time.Sleep(pause) // the writer's own pause, the trial's input: nothing waits on it
		if _, err := f.WriteString(part); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestLimitsFileWrittenInPlace replays issue 29's trial against the binary at its
// default settle time (MDPROXY_LIMITS_FILE_SETTLE, 1s): the limits file rewritten in
// place (truncated, part of a line written after a pause, the rest after another) with pauses
// of 0.15 s and 0.4 s. /config never shows the empty file's defaults (10/20) nor the
// torn file's limits (1/20): rewritten with the same content, nothing changes and no
// reload is counted; rewritten with a new content, it changes once, to the whole file.
// A rewrite with the same content leaves the route's bucket as it was (empty here).
func TestLimitsFileWrittenInPlace(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	const (
		// The trial's parts: the first a line cut short (RATE=1), the rest its end.
		trialFirst = "MDPROXY_FILE_RESULT_RATE=1"
		trialRest  = "00\nMDPROXY_FILE_RESULT_BURST=100\n"
		rateSlow   = "MDPROXY_FILE_RESULT_RATE=0.001\n"
		burst5     = "MDPROXY_FILE_RESULT_BURST=5\n"
		reloaded   = `"msg":"limits reloaded"`
		// on the line of each reading of the file once settled, a reload or not
		settled = `"trigger":"file changed"`
	)
	path := filepath.Join(t.TempDir(), "limits.env")
	if err := os.WriteFile(path, []byte(trialFirst+trialRest), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startBinary(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path, "MDPROXY_LOG_LEVEL": "debug"})
	const (
		success = `mdproxy_config_reloads_total{result="success"}`
		failed  = `mdproxy_config_reloads_total{result="error"}`
	)
	// waitLines waits for the n-th log line holding text.
	waitLines := func(text string, n int) {
		t.Helper()
		select {
		case <-p.logs.WrittenN(text, n):
		case <-p.exited:
			t.Fatalf("mdproxy exited (%v) before logging %q %d times; stderr:\n%s", p.Err(), text, n, p.logs)
		case <-time.After(safety):
			t.Fatalf("mdproxy did not log %q %d times within %v; stderr:\n%s", text, n, safety, p.logs)
		}
	}

	readings := 0
	for _, pause := range []time.Duration{150 * time.Millisecond, 400 * time.Millisecond} {
		w := watchConfig(t, p)
		writeInPlace(t, path, trialFirst, trialRest, pause)
		readings++
		waitLines(settled, readings)
		w.check(t, p, fmt.Sprintf("the same file rewritten in place, pauses of %v", pause), "100/100")
		for series, want := range map[string]float64{success: 0, failed: 0} {
			if got := p.metric(t, series); got != want {
				t.Errorf("pauses of %v: %s = %v, want %v", pause, series, got, want)
			}
		}
	}

	// A new content, written in place in parts: one change, to the whole file.
	w := watchConfig(t, p)
	writeInPlace(t, path, rateSlow, burst5, 400*time.Millisecond)
	readings++
	waitLines(settled, readings)
	w.check(t, p, "a new file written in place, pauses of 400ms", "100/100", "0.001/5")
	if got := p.metric(t, success); got != 1 {
		t.Errorf("after a new file: %s = %v, want 1", success, got)
	}

	// Its bucket emptied, then the same content written in place again: the bucket
	// stays empty, as it would be after no write at all.
	c := sidecartest.NewClient(t)
	codes := make([]int, 6)
	for i := range codes {
		codes[i], _ = sidecartest.Get(t, c, p.proxyURL+"/file/x")
	}
	if codes[5] != http.StatusServiceUnavailable {
		t.Fatalf("6 polls at rate 0.001, burst 5 = %v, want the 6th refused", codes)
	}
	w = watchConfig(t, p)
	writeInPlace(t, path, rateSlow, burst5, 400*time.Millisecond)
	readings++
	waitLines(settled, readings)
	w.check(t, p, "the same file written in place again", "0.001/5")
	// A new, full bucket would let the next poll through.
	if code, _ := sidecartest.Get(t, c, p.proxyURL+"/file/x"); code != http.StatusServiceUnavailable {
		t.Errorf("poll after the same file was written again = %d, want 503: the bucket kept, still empty", code)
	}
	if got := p.metric(t, success); got != 1 {
		t.Errorf("after the same file again: %s = %v, want 1", success, got)
	}
	if n, u := strings.Count(p.logs.String(), reloaded), strings.Count(p.logs.String(), `"msg":"limits file unchanged`); n != 1 || u != 3 {
		t.Errorf("%d %q lines and %d of the file unchanged, want 1 and 3", n, reloaded, u)
	}
}
