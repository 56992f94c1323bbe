package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/sidecar/sidecartest"
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
		t.Fatalf("mdproxy exited (%v) before logging %q; stderr:\n%s", p.exitErr, text, p.logs)
	case <-time.After(safety):
		t.Fatalf("mdproxy did not log %q within %v; stderr:\n%s", text, safety, p.logs)
	}
}

// checkAlive checks that the process still runs and answers its /healthz.
func checkAlive(t *testing.T, p *proc) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("mdproxy exited: %v; stderr:\n%s", p.exitErr, p.logs)
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
