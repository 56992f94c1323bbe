package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/child"
	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// freeAddr returns a loopback address with a port free at the time of the call.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// promQuery runs an instant query and returns the number of series or samples.
func promQuery(t *testing.T, base, q string) (int, error) {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("query %q: %s", q, r.Error)
	}
	return len(r.Data.Result), nil
}

// TestAgainstPrometheus starts the Core emulator, mdproxy in front of it and a real
// Prometheus (Debian's package) scraping both with deploy/'s rules, runs
// `mdbench --quick` through the proxy, with the bridge on, then evaluates every
// dashboard panel query and every recording rule through Prometheus's HTTP API: each
// must return data. It also checks that the bridge stored callbacks and answered polls,
// that every rule loaded is healthy, and that the dashboard uses only metrics that
// mdproxy exports.
func TestAgainstPrometheus(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("prometheus not installed: .ci/run must install Debian's prometheus package")
		}
		t.Skip("prometheus not installed (apt-get install prometheus)")
	}
	if testing.Short() {
		t.Skip("runs Prometheus and the benchmark for about a minute")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	coresimBin := bintest.Build(t, bintest.Module+"/cmd/coresim")
	mdproxyBin := bintest.Build(t, bintest.Module+"/cmd/mdproxy")
	mdbenchBin := bintest.Build(t, bintest.Module+"/cmd/mdbench")

	// The emulator at 60× with a small scan queue, so that Core's own 503 (queue full)
	// shows; mdproxy with limits scaled by 60 and a maximum wait, and with the bridge on
	// (its default) and its callback listener on a free port, where the emulator delivers
	// the results of the submissions that bring no callbackurl (the callback URL follows
	// the listener). The bridge answers the polls of those submissions without the
	// limiter, so that their fetch error rate is 0.
	const speedup = "60"
	core := bintest.Start(t, coresimBin, map[string]string{
		"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": "127.0.0.1:0",
		"CORESIM_SPEEDUP": speedup, "CORESIM_TICK": "1ms", "CORESIM_QUEUE_SIZE": "60",
	}, child.Options{Ready: "coresim serving"})
	// mdproxy shares its limits and results on a real Redis, so that the dashboard's
	// Redis panels and rules have data too.
	redis := redistest.Start(t)
	proxy := bintest.Start(t, mdproxyBin, map[string]string{
		"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		"MDPROXY_UPSTREAM_URL":     "http://" + core.Field("listen"),
		"MDPROXY_REDIS_URL":        redis.URL(),
		"MDPROXY_FILE_RESULT_RATE": "300", "MDPROXY_FILE_RESULT_BURST": "50", "MDPROXY_FILE_RESULT_MAX_WAIT": "20ms",
	}, child.Options{Ready: "mdproxy serving"})
	proxyURL, proxyAdmin := "http://"+proxy.Field("listen"), proxy.Field("admin")
	// A second mdproxy, on its own (no Redis), with the adaptive limit on, so that the
	// dashboard's adaptive panels have data too.
	adaptive := bintest.Start(t, mdproxyBin, map[string]string{
		"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
		"MDPROXY_UPSTREAM_URL": "http://" + core.Field("listen"),
		"MDPROXY_ADAPTIVE":     "true", "MDPROXY_ADAPTIVE_INTERVAL": "1s",
	}, child.Options{Ready: "mdproxy serving"})
	// Issue 13: series are created when a route is first used or is limited, so a
	// fresh mdproxy exports at most a third of the 1087 it exported when every route's
	// series were made at start.
	atStart := len(sidecartest.ScrapeMetrics(t, nil, "http://"+proxyAdmin+"/metrics"))
	if atStart > 1087/3 {
		t.Errorf("mdproxy exports %d series at start, want at most %d (a third of 1087)", atStart, 1087/3)
	}

	promAddr := freeAddr(t)
	rules, _ := filepath.Abs(filepath.Join("prometheus", "rules"))
	cfg := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q, %q]
scrape_configs:
  - job_name: mdproxy
    static_configs: [{targets: [%q, %q]}]
  - job_name: coresim
    static_configs: [{targets: [%q]}]
`, filepath.Join(rules, "recording.yml"), filepath.Join(rules, "alerts.yml"), proxyAdmin, adaptive.Field("admin"), core.Field("admin"))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("promtool", "check", "config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	prom := exec.CommandContext(ctx, promBin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	promLog, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	prom.Stdout, prom.Stderr = promLog, promLog
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prom.Process.Signal(os.Interrupt); _ = prom.Wait(); promLog.Close() })
	promURL := "http://" + promAddr
	waitFor(t, "Prometheus ready", func() bool {
		resp, err := http.Get(promURL + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// The benchmark's quick run through the proxy: polling (No-limit, the proxy's
	// limits apply; bridged, so Core's callbacks reach mdproxy and polls are answered
	// from its store) and callbacks of the client's own (Webhook, not bridged); plus a
	// few clients that go away (499).
	var out bytes.Buffer
	bench, err := child.Start(ctx, mdbenchBin, child.Options{
		Args: []string{"--quick", "--core-url", proxyURL, "--speedup", speedup, "--scenarios", "No-limit,Webhook",
			"--callback-addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data")},
		Env: os.Environ(),
		Log: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bench.Stop(sidecartest.Safety) })
	<-bench.Done()
	if err := bench.Err(); err != nil {
		t.Fatalf("mdbench: %v\n%s", err, out.String())
	}
	t.Logf("mdbench:\n%s", out.String())
	// Clients that go away while Core answers (499, kind canceled). Whether a client with
	// a short timeout leaves while Core answers, or before its request reached mdproxy,
	// or after the answer, is timing: clients with timeouts of 1 to 8 ms come until
	// mdproxy has counted one.
	waitFor(t, "a client gone while Core answered (mdproxy_upstream_errors_total)", func() bool {
		for i := 1; i <= 8; i++ {
			c := &http.Client{Timeout: time.Duration(i) * time.Millisecond}
			if resp, err := c.Get(proxyURL + "/file/gone"); err == nil {
				resp.Body.Close()
			}
		}
		_, n := sidecartest.ScrapeMetrics(t, nil, "http://"+proxyAdmin+"/metrics").Sum("mdproxy_upstream_errors_total")
		return n > 0
	})

	// Core's own 503 (its scan queue full): the data set's Office files (.docx, .xlsx,
	// .pptx, .xltx; not its manifest) come twice at once, more than the emulator's queue
	// of 60 holds, until mdproxy has relayed one.
	files, err := filepath.Glob(filepath.Join(dir, "data", "*", "*.*x"))
	if err != nil || len(files) == 0 {
		t.Fatalf("the data set's files: %v, %v", files, err)
	}
	waitFor(t, "Core's own 503 relayed (mdproxy_upstream_responses_total, code 503)", func() bool {
		var wg sync.WaitGroup
		for _, f := range append(files, files...) {
			wg.Go(func() {
				body, err := os.ReadFile(f)
				if err != nil {
					return
				}
				if resp, err := http.Post(proxyURL+"/file", "application/octet-stream", bytes.NewReader(body)); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		_, n := sidecartest.ScrapeMetrics(t, nil, "http://"+proxyAdmin+"/metrics").Sum("mdproxy_upstream_responses_total", "code", "503")
		return n > 0
	})

	// Every panel, the bridge's use and every recording rule have data once Prometheus
	// has scraped twice (a rate needs two samples) and evaluated the rules after that:
	// each query is asked again until it has data.
	d := loadDashboard(t)
	queries := panelQueries(d)
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range queries {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		if n, err := promQueryData(t, promURL, queries[name]); err != nil || n == 0 {
			t.Errorf("panel %q: query %s returned %d series, %v; want data", name, queries[name], n, err)
		}
	}
	// The bridge did its work: callbacks stored, polls answered without Core.
	for _, q := range []string{
		`sum(mdproxy_bridge_callbacks_total{outcome="stored"}) > 0`,
		`sum(mdproxy_bridge_polls_total{source=~"store|pending"}) > 0`,
	} {
		if n, err := promQueryData(t, promURL, q); err != nil || n == 0 {
			t.Errorf("%s: %d series, %v; want the bridge on and used", q, n, err)
		}
	}
	for _, rule := range recordingRules(t) {
		if n, err := promQueryData(t, promURL, rule); err != nil || n == 0 {
			t.Errorf("recording rule %s returned %d series, %v; want data", rule, n, err)
		}
	}
	// The alert rules are loaded and healthy.
	resp, err := http.Get(promURL + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	var rr struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&rr)
	resp.Body.Close()
	loaded := 0
	for _, g := range rr.Data.Groups {
		for _, r := range g.Rules {
			loaded++
			if r.Health != "ok" {
				t.Errorf("rule %s: health %q, %s; want ok", r.Name, r.Health, r.LastError)
			}
		}
	}
	if want := len(recordingRules(t)) + len(alertRules(t)); loaded != want {
		t.Errorf("Prometheus loaded %d rules, want %d", loaded, want)
	}

	// The dashboard uses only metrics mdproxy exports (and recording rules, and up).
	t.Logf("mdproxy's series: %d at start, %d after the run", atStart, len(sidecartest.ScrapeMetrics(t, nil, "http://"+proxyAdmin+"/metrics")))
	exported := map[string]bool{}
	var pages []string // both instances' /metrics: the adaptive metrics are the second's
	for _, admin := range []string{proxyAdmin, adaptive.Field("admin")} {
		_, page := sidecartest.Get(t, sidecartest.NewClient(t), "http://"+admin+"/metrics")
		pages = append(pages, page)
	}
	for _, line := range strings.Split(strings.Join(pages, "\n"), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(name)
			exported[f[0]] = true
			if f[1] == "histogram" {
				exported[f[0]+"_bucket"] = true
			}
		}
	}
	records := map[string]bool{"up": true}
	for _, r := range recordingRules(t) {
		records[r] = true
	}
	quoted := regexp.MustCompile(`"[^"]*"`) // label values such as job="mdproxy"
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	for _, name := range names {
		for _, m := range ident.FindAllString(quoted.ReplaceAllString(queries[name], `""`), -1) {
			if !strings.Contains(m, "mdproxy") {
				continue
			}
			if !exported[m] && !records[m] {
				t.Errorf("panel %q uses %s, which mdproxy does not export and no rule records", name, m)
			}
		}
	}
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 60 s for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promQueryData asks Prometheus q until it returns at least one series, for up to 60 s
// (scrapes and rule evaluations come every second, later on a loaded machine), and
// returns the last answer.
func promQueryData(t *testing.T, base, q string) (n int, err error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n, err = promQuery(t, base, q); (err == nil && n > 0) || time.Now().After(deadline) {
			return n, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
