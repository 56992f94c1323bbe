package main

import (
	"context"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/mdproxy/mdproxy/internal/child"
	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// The black-box tests run the built mdproxy binary, as an operator would, against
// upstreams on loopback. The binary is built once per test binary run (bintest).

// proc is one mdproxy process started by startBinary.
type proc struct {
	*bintest.Proc
	proxyAddr          string // host:port of the proxy listener
	proxyURL, adminURL string
	logs               *sidecartest.LogBuffer // every line the process wrote
	exited             <-chan struct{}        // closed once the process exited
}

// startBinary starts the mdproxy binary with env (plus loopback listen addresses on
// free ports and MDPROXY_SHUTDOWN_DELAY=0s unless env sets them, and
// MDPROXY_UPSTREAM_URL=upstreamURL when not empty), and returns once its "mdproxy
// serving" line was logged. Cleanup stops the process (SIGTERM) and waits for it. It
// skips t in -short mode.
func startBinary(t *testing.T, upstreamURL string, env map[string]string) *proc {
	t.Helper()
	bin := bintest.Build(t, bintest.Module+"/cmd/mdproxy")
	environ := map[string]string{
		"MDPROXY_LISTEN_ADDR":        "127.0.0.1:0",
		"MDPROXY_ADMIN_ADDR":         "127.0.0.1:0",
		"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		"MDPROXY_SHUTDOWN_DELAY":     "0s", // no load balancer to warn at cleanup
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
	bp := bintest.Start(t, bin, environ, child.Options{Ready: "mdproxy serving"})
	listen := bp.Field("listen")
	return &proc{Proc: bp, proxyAddr: listen, proxyURL: "http://" + listen,
		adminURL: "http://" + bp.Field("admin"), logs: bp.Logs, exited: bp.Done()}
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) { t.Helper(); p.Send(t, sig) }

// wait returns the process's exit code once it exited, failing t after the safety
// bound.
func (p *proc) wait(t *testing.T) int { t.Helper(); return p.Wait(t) }

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
	v, _ := sidecartest.ParseMetrics(t, p.metrics(t)).Value(series)
	return v
}
