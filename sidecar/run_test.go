package sidecar

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/metrics"
)

func TestRunServes(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, nil)
	c := sidecartest.NewClient(t)

	// The proxy port forwards Core's API, /readyz included, and everything else.
	for _, tc := range []struct{ path, wantBody string }{
		{"/file/x", "upstream /file/x\n"},
		{"/readyz", "upstream readyz\n"},
		{"/metrics", "upstream /metrics\n"},
		{"/healthz", "upstream /healthz\n"},
	} {
		code, body := sidecartest.Get(t, c, in.proxyURL+tc.path)
		if code != http.StatusOK || body != tc.wantBody {
			t.Errorf("GET proxy %s = %d %q, want 200 %q (the upstream's answer)", tc.path, code, sidecartest.Short(body), tc.wantBody)
		}
		if !up.Saw("GET " + tc.path) {
			t.Errorf("upstream saw %q, want GET %s among them: the proxy port must forward it", up.Requests(), tc.path)
		}
	}

	// The admin port answers for the proxy itself and forwards nothing.
	before := len(up.Requests())
	if code, body := sidecartest.Get(t, c, in.adminURL+"/healthz"); code != http.StatusOK {
		t.Errorf("GET admin /healthz = %d %q, want 200", code, body)
	}
	if code, body := sidecartest.Get(t, c, in.adminURL+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("GET admin /readyz = %d %q, want 200 %q", code, body, "ready\n")
	}
	if code, _ := sidecartest.Get(t, c, in.adminURL+"/file/x"); code != http.StatusNotFound {
		t.Errorf("GET admin /file/x = %d, want 404: the admin port is not a proxy", code)
	}
	code, page := sidecartest.Get(t, c, in.adminURL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET admin /metrics = %d, want 200", code)
	}
	if after := up.Requests(); len(after) != before {
		t.Errorf("upstream saw %q after admin requests, want nothing new after %d requests", after, before)
	}
	for _, want := range []string{"mdproxy_requests_total", "mdproxy_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `[{ ]`).MatchString(page) {
			t.Errorf("admin /metrics has no series %s", want)
		}
	}
	for series, want := range map[string]float64{
		`mdproxy_requests_total{code="200",method="GET",route="file_result"}`: 1,
		`mdproxy_requests_total{code="200",method="GET",route="readyz"}`:      1,
		`mdproxy_requests_total{code="200",method="GET",route="other"}`:       2, // /metrics and /healthz
		`mdproxy_limit_rate_requests_per_second{route="file_result"}`:         10,
		`mdproxy_limit_burst_requests{route="batch_status"}`:                  4,
	} {
		if got, ok := sidecartest.ParseMetrics(t, page).Value(series); !ok || got != want {
			t.Errorf("admin /metrics %s = %v (found %v), want %v", series, got, ok, want)
		}
	}
	// Series appear when a route is used or limited (issue 13): none for an unlimited
	// route's limit, none for a route never asked.
	for _, series := range []string{
		`mdproxy_limit_rate_requests_per_second{route="submit"}`,
		`mdproxy_requests_total{code="200",method="GET",route="version"}`,
	} {
		if got, ok := sidecartest.ParseMetrics(t, page).Value(series); ok {
			t.Errorf("admin /metrics has %s = %v, want no such series", series, got)
		}
	}

	if err := in.stop(t); err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
	lines := sidecartest.CheckJSONLogs(t, in.logs.String())
	if l := findLog(lines, "mdproxy serving"); l == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy serving", in.logs)
	} else {
		if l["listen"] != in.proxyAddr {
			t.Errorf("log %q listen = %v, want %s", "mdproxy serving", l["listen"], in.proxyAddr)
		}
		version, revision, _ := metrics.BuildVersion()
		if l["version"] != version || l["revision"] != revision {
			t.Errorf("log %q version, revision = %v, %v; want %s, %s (as mdproxy_build_info)", "mdproxy serving",
				l["version"], l["revision"], version, revision)
		}
	}
	if findLog(lines, "mdproxy stopped") == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy stopped", in.logs)
	}
}

func TestRunConfigError(t *testing.T) {
	t.Parallel()
	var logs sidecartest.LogBuffer
	called := false
	err := Run(context.Background(), map[string]string{"MDPROXY_LIMIT_STATUS": "abc"}, &logs,
		func(net.Addr, net.Addr) { called = true })
	var ce *ConfigError
	if !errors.As(err, &ce) || !sidecartest.NamesVar(err.Error(), "MDPROXY_LIMIT_STATUS") {
		t.Errorf("Run(MDPROXY_LIMIT_STATUS=abc) = %v, want a *ConfigError naming MDPROXY_LIMIT_STATUS", err)
	}
	if called {
		t.Error("Run(MDPROXY_LIMIT_STATUS=abc) called started, want no listener")
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
			"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
			name: busy.Addr().String(),
		}
		err := Run(context.Background(), environ, io.Discard, nil)
		if err == nil || !sidecartest.NamesVar(err.Error(), name) {
			t.Errorf("Run(%s=<address in use>) = %v, want an error naming %s", name, err, name)
		}
		if errors.As(err, new(*ConfigError)) {
			t.Errorf("Run(%s=<address in use>) = %v, a *ConfigError; want another error (exit 1, not 2)", name, err)
		}
	}
}

func TestRunGracefulShutdown(t *testing.T) {
	t.Parallel()
	const size = 4 << 20 // over about 1.5 s
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, nil)
	c := sidecartest.NewClient(t)
	adminClient := sidecartest.NewClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, sum := sidecartest.Payload(1, size)
	body := newPacedReader(ctx, src, size/1.5, 64<<10)
	results := make(chan sidecartest.UploadResult, 1)
	go func() { results <- sidecartest.PostFile(ctx, c, in.proxyURL, body, size) }()

	select {
	case <-up.FirstByte:
	case res := <-results:
		t.Fatalf("upload ended before it reached the upstream: %d %q %v", res.Status, res.Raw, res.Err)
	case <-time.After(safety):
		t.Fatal("no upload byte reached the upstream")
	}
	shuttingDown := in.logs.Written("mdproxy shutting down")
	in.cancel()
	select {
	case <-shuttingDown:
	case <-time.After(safety):
		t.Fatalf("Run logged no shutdown after its context ended; logs:\n%s", in.logs)
	}
	if got := up.Received.Load(); got >= size {
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

	sidecartest.CheckUpload(t, up, <-results, size, sum)
	if err := in.wait(t); err != nil {
		t.Errorf("Run after a graceful shutdown = %v, want nil", err)
	}
	// Both ports are closed once Run returned.
	for _, u := range []string{in.proxyURL + "/file/x", in.adminURL + "/readyz"} {
		if resp, err := sidecartest.NewClient(t).Get(u); err == nil {
			resp.Body.Close()
			t.Errorf("GET %s after Run returned = %d, want a connection error", u, resp.StatusCode)
		}
	}
	lines := sidecartest.CheckJSONLogs(t, in.logs.String())
	if findLog(lines, "mdproxy stopped") == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy stopped", in.logs)
	}
}

func TestRunShutdownTimeout(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_SHUTDOWN_TIMEOUT": "100ms"})
	c := sidecartest.NewClient(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, _ := sidecartest.Payload(2, size)
	release := make(chan struct{})
	body := newPacedReader(ctx, src, 1<<30, 64<<10)
	body.stallAfter = 256 << 10 // then nothing until release: it cannot finish in time
	body.release = release
	results := make(chan sidecartest.UploadResult, 1)
	go func() { results <- sidecartest.PostFile(ctx, c, in.proxyURL, body, size) }()

	select {
	case <-up.FirstByte:
	case res := <-results:
		t.Fatalf("upload ended before it reached the upstream: %d %q %v", res.Status, res.Raw, res.Err)
	case <-time.After(safety):
		t.Fatal("no upload byte reached the upstream")
	}
	err := in.stop(t)
	close(release)
	if err == nil || !strings.Contains(err.Error(), "MDPROXY_SHUTDOWN_TIMEOUT") {
		t.Errorf("Run with an upload longer than MDPROXY_SHUTDOWN_TIMEOUT = %v, want an error naming MDPROXY_SHUTDOWN_TIMEOUT", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run with an upload longer than MDPROXY_SHUTDOWN_TIMEOUT = %v, want it to wrap context.DeadlineExceeded", err)
	}
	if errors.As(err, new(*ConfigError)) {
		t.Errorf("Run = %v, a *ConfigError; want another error (exit 1, not 2)", err)
	}

	res := <-results
	if res.Err == nil && res.Status == http.StatusOK {
		t.Errorf("cut upload = 200 %q, want a failure", res.Raw)
	}
	select {
	case got := <-up.Uploads:
		if got.Err == "" || got.N >= size {
			t.Errorf("upstream received %+v of a cut upload, want fewer than %d bytes and an error", got, size)
		}
	case <-time.After(safety):
		t.Error("upstream handler did not end after the upload was cut")
	}
	sidecartest.CheckJSONLogs(t, in.logs.String())
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
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_READ_HEADER_TIMEOUT": "500ms",
		"MDPROXY_IDLE_TIMEOUT":        "500ms",
		"MDPROXY_UPSTREAM_TIMEOUT":    "500ms",
	})
	c := sidecartest.NewClient(t)

	src, sum := sidecartest.Payload(3, size)
	body := newPacedReader(context.Background(), src, 1<<20, 32<<10) // 1 MiB/s
	body.stallAfter = size / 2
	body.stall = time.Second
	start := time.Now()
	res := sidecartest.PostFile(context.Background(), c, in.proxyURL, body, size)
	elapsed := time.Since(start)
	sidecartest.CheckUpload(t, up, res, size, sum)
	t.Logf("%d bytes uploaded in %v", size, elapsed)
	if elapsed < 1500*time.Millisecond {
		t.Fatalf("upload took %v, want longer than the 500 ms timeouts it must outlast (the pacing failed)", elapsed)
	}

	_, page := sidecartest.Get(t, c, in.adminURL+"/metrics")
	series := `mdproxy_request_body_bytes_total{route="submit"}`
	if got, ok := sidecartest.ParseMetrics(t, page).Value(series); !ok || got != size {
		t.Errorf("admin /metrics %s = %v (found %v), want %d", series, got, ok, size)
	}
	if err := in.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	sidecartest.CheckJSONLogs(t, in.logs.String())
}

// TestLongUpload300MiB is the "300 MiB at 5 MB/s must succeed", with the default
// timeouts. It lasts about 63 s: run it with MDPROXY_LONG_TESTS=1.
func TestLongUpload300MiB(t *testing.T) {
	if os.Getenv("MDPROXY_LONG_TESTS") != "1" {
		t.Skip("set MDPROXY_LONG_TESTS=1 to send 300 MiB at 5 MB/s (about 63 s)")
	}
	const size = 300 << 20
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, nil)
	c := sidecartest.NewClient(t)

	src, sum := sidecartest.Payload(4, size)
	body := newPacedReader(context.Background(), src, 5e6, 256<<10)
	start := time.Now()
	res := sidecartest.PostFile(context.Background(), c, in.proxyURL, body, size)
	elapsed := time.Since(start)
	sidecartest.CheckUpload(t, up, res, size, sum)
	t.Logf("%d bytes (300 MiB) uploaded in %v: %.2f MB/s, sha256 %s", int64(size), elapsed.Round(time.Millisecond),
		float64(size)/elapsed.Seconds()/1e6, sum)

	_, page := sidecartest.Get(t, c, in.adminURL+"/metrics")
	series := `mdproxy_request_body_bytes_total{route="submit"}`
	if got, ok := sidecartest.ParseMetrics(t, page).Value(series); !ok || got != size {
		t.Errorf("admin /metrics %s = %v (found %v), want %d", series, got, ok, size)
	}
	if err := in.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	sidecartest.CheckJSONLogs(t, in.logs.String())
}

func TestStart(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	var logs sidecartest.LogBuffer
	url, stop, err := Start(context.Background(), map[string]string{
		"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		"MDPROXY_UPSTREAM_URL": up.URL, "MDPROXY_SHUTDOWN_DELAY": "0s",
	}, &logs)
	if err != nil {
		t.Fatalf("Start = %v, want mdproxy serving", err)
	}
	if code, body := sidecartest.Get(t, sidecartest.NewClient(t), url+"/file/x"); code != http.StatusOK || body != "upstream /file/x\n" {
		t.Errorf("GET %s/file/x = %d %q, want 200 from the upstream", url, code, sidecartest.Short(body))
	}
	if err := stop(); err != nil {
		t.Errorf("stop() = %v, want nil", err)
	}
	if err := stop(); err != nil {
		t.Errorf("stop() again = %v, want nil again", err)
	}
	if findLog(sidecartest.CheckJSONLogs(t, logs.String()), "mdproxy stopped") == nil {
		t.Errorf("logs have no %q line:\n%s", "mdproxy stopped", logs.String())
	}

	// A bad setting: the error at once, nothing to stop.
	url, stop, err = Start(context.Background(), map[string]string{"MDPROXY_LIMIT_STATUS": "abc"}, io.Discard)
	if !errors.As(err, new(*ConfigError)) || url != "" || stop != nil {
		t.Errorf("Start(MDPROXY_LIMIT_STATUS=abc) = %q, stop non-nil %v, %v; want \"\", a nil stop and a *ConfigError", url, stop != nil, err)
	}
}
