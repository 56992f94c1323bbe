package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/sidecar/sidecartest"
)

// The black-box tests run the built mdproxy binary, as an operator would, against
// upstreams on loopback. The binary is built once per test binary run.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
	out  []byte
}

// sharedBinary returns the path of mdproxy built once for the whole package run; the
// directory is removed by TestMain. It skips t in -short mode.
func sharedBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	built.once.Do(func() {
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			if goBin, err = exec.LookPath("go"); err != nil {
				built.err = err
				return
			}
		}
		if built.dir, built.err = os.MkdirTemp("", "mdproxy-bin-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "mdproxy")
		built.out, built.err = exec.Command(goBin, "build", "-o", built.path, ".").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.path
}

// removeSharedBinary removes what sharedBinary built; TestMain calls it.
func removeSharedBinary() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// proc is one mdproxy process started by startBinary.
type proc struct {
	cmd                *exec.Cmd
	proxyAddr          string // host:port of the proxy listener
	proxyURL, adminURL string
	logs               *sidecartest.LogBuffer // every line the process wrote on stderr
	exited             chan struct{}
	exitErr            error // Wait's result, once exited is closed
}

// startBinary starts the mdproxy binary with env (plus loopback listen addresses on
// free ports unless env sets them, and MDPROXY_UPSTREAM_URL=upstreamURL when not empty),
// and returns once its "mdproxy serving" line was logged. Cleanup sends SIGKILL if the
// process still runs and waits for it.
func startBinary(t *testing.T, upstreamURL string, env map[string]string) *proc {
	t.Helper()
	bin := sharedBinary(t)
	environ := map[string]string{
		"MDPROXY_LISTEN_ADDR":        "127.0.0.1:0",
		"MDPROXY_ADMIN_ADDR":         "127.0.0.1:0",
		"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
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
	cmd := exec.Command(bin)
	for k, v := range environ {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mdproxy: %v", err)
	}
	p := &proc{cmd: cmd, logs: &sidecartest.LogBuffer{}, exited: make(chan struct{})}
	serving := make(chan struct{ Listen, Admin string }, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var rec struct{ Msg, Listen, Admin string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "mdproxy serving" {
				serving <- struct{ Listen, Admin string }{rec.Listen, rec.Admin}
			}
			_, _ = p.logs.Write(append(append([]byte(nil), line...), '\n'))
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.exitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case a := <-serving:
		p.proxyAddr = a.Listen
		p.proxyURL = "http://" + a.Listen
		p.adminURL = "http://" + a.Admin
	case <-p.exited:
		t.Fatalf("mdproxy exited before serving: %v; stderr:\n%s", p.exitErr, p.logs.String())
	case <-time.After(safety):
		t.Fatalf("mdproxy did not log %q within %v; stderr:\n%s", "mdproxy serving", safety, p.logs.String())
	}
	return p
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait returns the process's exit code once it exited, failing t after the safety
// bound.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return exitCode(t, p.exitErr)
	case <-time.After(safety):
		t.Fatalf("mdproxy did not exit within %v", safety)
		return -1
	}
}

// metrics returns the body of the process's /metrics.
func (p *proc) metrics(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.adminURL+"/metrics", nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	return string(b)
}

// metric returns the value of series (e.g. `mdproxy_requests_total{code="200",method="GET",route="file_result"}`)
// in the process's /metrics, 0 when absent.
func (p *proc) metric(t *testing.T, series string) float64 {
	t.Helper()
	v, _ := sidecartest.MetricValue(p.metrics(t), series)
	return v
}
