package sidecar

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/adaptive"
	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/internal/testkit/coretest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
)

// startAdaptiveCore starts the emulator in real time with one core and a queue of 20 files,
// taking only apikey key.
func startAdaptiveCore(t *testing.T, key string) string {
	t.Helper()
	cfg := coretest.Fast()
	cfg.Speedup, cfg.Cores, cfg.QueueSize, cfg.APIKey = 1, 1, 20, key
	return coretest.Start(t, cfg, coresim.StartOptions{}).URL
}

// waitMetric scrapes adminURL's /metrics until series satisfies ok, for at most 30 s,
// and returns its value; it fails t with the last value then.
func waitMetric(t *testing.T, adminURL, series string, ok func(float64) bool) float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, found := sidecartest.ScrapeMetrics(t, nil, adminURL+"/metrics").Value(series)
		if found && ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v (found %t) after 30 s", series, v, found)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAdaptiveFollowsCoreQueue: with MDPROXY_ADAPTIVE, file_result's rate in force
// falls below its configured 10 a second while Core's scan queue is over the target,
// and returns to 10 once Core has drained it; Core's occupancy is exported.
func TestAdaptiveFollowsCoreQueue(t *testing.T) {
	const key = "monitor-key"
	core := startAdaptiveCore(t, key)
	in := startRun(t, core, map[string]string{
		"MDPROXY_ADAPTIVE": "true", "MDPROXY_ADAPTIVE_INTERVAL": "1s", "MDPROXY_CORE_APIKEY": key,
		"MDPROXY_BRIDGE": "false",
	})
	const rate = `mdproxy_limit_rate_requests_per_second{route="file_result"}`
	waitMetric(t, in.adminURL, rate, func(v float64) bool { return v == 10 })

	stop := fillQueue(core, key) // until the rate has fallen
	low := waitMetric(t, in.adminURL, rate, func(v float64) bool { return v < 10 })
	stop()
	if occ, _ := sidecartest.ScrapeMetrics(t, nil, in.adminURL+"/metrics").Value("mdproxy_adaptive_core_queue_occupancy"); occ <= 0.8 {
		t.Logf("occupancy %v once the rate fell to %v (the queue may have drained since)", occ, low)
	}
	if low < 1 {
		t.Errorf("file_result's rate fell to %v, under its floor of 1 (a tenth of 10)", low)
	}
	waitMetric(t, in.adminURL, rate, func(v float64) bool { return v == 10 })
	waitMetric(t, in.adminURL, `mdproxy_adaptive_adjustments_total{direction="down",route="file_result"}`, func(v float64) bool { return v >= 1 })
	waitMetric(t, in.adminURL, `mdproxy_adaptive_adjustments_total{direction="up",route="file_result"}`, func(v float64) bool { return v >= 1 })
}

// TestAdaptiveWrongAPIKey: with an apikey Core refuses, the rate holds at the configured
// one, the read errors are counted, the failure is logged once, and the key is in no
// log line nor on /config.
func TestAdaptiveWrongAPIKey(t *testing.T) {
	core := startAdaptiveCore(t, "monitor-key")
	in := startRun(t, core, map[string]string{
		"MDPROXY_ADAPTIVE": "true", "MDPROXY_ADAPTIVE_INTERVAL": "1s", "MDPROXY_CORE_APIKEY": "wrong-secret-key",
		"MDPROXY_BRIDGE": "false",
	})
	waitMetric(t, in.adminURL, "mdproxy_adaptive_read_errors_total", func(v float64) bool { return v >= 2 })
	if v, _ := sidecartest.ScrapeMetrics(t, nil, in.adminURL+"/metrics").Value(`mdproxy_limit_rate_requests_per_second{route="file_result"}`); v != 10 {
		t.Errorf("file_result's rate with Core's statistics unreadable = %v, want 10 (held)", v)
	}
	logs := in.logs.String()
	if n := strings.Count(logs, "Core's statistics cannot be read"); n != 1 {
		t.Errorf("the read failure is logged %d times, want once", n)
	}
	_, config := sidecartest.Get(t, sidecartest.NewClient(t), in.adminURL+"/config")
	if strings.Contains(logs, "wrong-secret-key") || strings.Contains(config, "wrong-secret-key") {
		t.Error("MDPROXY_CORE_APIKEY's value is in the logs or on /config")
	}
}

// TestAdaptiveDryRun: a dry run exports the rate it would set and leaves the rate in
// force at the configured one.
func TestAdaptiveDryRun(t *testing.T) {
	const key = "monitor-key"
	core := startAdaptiveCore(t, key)
	stop := fillQueue(core, key)
	defer stop()
	in := startRun(t, core, map[string]string{
		"MDPROXY_ADAPTIVE": "true", "MDPROXY_ADAPTIVE_INTERVAL": "1s", "MDPROXY_CORE_APIKEY": key,
		"MDPROXY_ADAPTIVE_DRY_RUN": "true", "MDPROXY_BRIDGE": "false",
	})
	waitMetric(t, in.adminURL, `mdproxy_adaptive_rate_requests_per_second{route="file_result"}`, func(v float64) bool { return v < 10 })
	if v, _ := sidecartest.ScrapeMetrics(t, nil, in.adminURL+"/metrics").Value(`mdproxy_limit_rate_requests_per_second{route="file_result"}`); v != 10 {
		t.Errorf("file_result's rate in force in a dry run = %v, want 10", v)
	}
}

// fillQueue submits files to core with key back to back, keeping its scan queue full,
// until stop is called; stop waits for the last submission.
func fillQueue(core, key string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, core+"/file", bytes.NewReader([]byte(fmt.Sprintf("file %d", i))))
			req.Header.Set("apikey", key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// TestAdaptiveSettings: a bad setting of the adaptive limit stops start-up naming its
// variable.
func TestAdaptiveSettings(t *testing.T) {
	for _, tc := range []struct{ name, value, variable string }{
		{"MDPROXY_ADAPTIVE_INTERVAL", "50ms", "MDPROXY_ADAPTIVE_INTERVAL"},
		{"MDPROXY_ADAPTIVE_INTERVAL", "11m", "MDPROXY_ADAPTIVE_INTERVAL"},
		{"MDPROXY_ADAPTIVE_TARGET", "0", "MDPROXY_ADAPTIVE_TARGET"},
		{"MDPROXY_ADAPTIVE_TARGET", "1.2", "MDPROXY_ADAPTIVE_TARGET"},
		{"MDPROXY_ADAPTIVE_TARGET", "NaN", "MDPROXY_ADAPTIVE_TARGET"},
		{"MDPROXY_FILE_RESULT_RATE_MIN", "11", "MDPROXY_FILE_RESULT_RATE_MIN"}, // over the rate, 10
		{"MDPROXY_FILE_RESULT_RATE_MIN", "-1", "MDPROXY_FILE_RESULT_RATE_MIN"},
	} {
		_, err := LoadConfig(map[string]string{"MDPROXY_UPSTREAM_URL": "http://127.0.0.1:8008",
			"MDPROXY_ADAPTIVE": "true", tc.name: tc.value})
		if err == nil || !strings.Contains(err.Error(), tc.variable+"=") {
			t.Errorf("LoadConfig(MDPROXY_ADAPTIVE=true, %s=%s) = %v, want an error naming %s", tc.name, tc.value, err, tc.variable)
		}
	}
	if _, err := LoadConfig(map[string]string{"MDPROXY_UPSTREAM_URL": "http://127.0.0.1:8008", "MDPROXY_ADAPTIVE": "true",
		"MDPROXY_FILE_RESULT_RATE_MIN": "0.5", "MDPROXY_ADAPTIVE_TARGET": "1", "MDPROXY_REDIS_URL": "redis://127.0.0.1:1/0"}); err != nil {
		t.Errorf("LoadConfig(good adaptive settings, on Redis) = %v", err)
	}
}

// TestAdaptiveReplicasOneRate: two replicas on one Redis in front of one Core hold one
// rate: one leads (reads Core), the other follows, and file_result's rate in force falls
// below its configured 10 on both while Core's queue is over the target, then returns to
// 10 on both once it drained.
func TestAdaptiveReplicasOneRate(t *testing.T) {
	const key = "monitor-key"
	core := startAdaptiveCore(t, key)
	srv := redistest.Start(t)
	environ := map[string]string{
		"MDPROXY_ADAPTIVE": "true", "MDPROXY_ADAPTIVE_INTERVAL": "1s", "MDPROXY_CORE_APIKEY": key,
		"MDPROXY_BRIDGE": "false", "MDPROXY_REDIS_URL": srv.URL(), "MDPROXY_REPLICAS": "2", "MDPROXY_REDIS_TIMEOUT": "1s",
	}
	reps := []*instance{startRun(t, core, environ), startRun(t, core, environ)}
	const rate, leader = `mdproxy_limit_rate_requests_per_second{route="file_result"}`, "mdproxy_adaptive_leader"
	leaders := func() float64 {
		n := 0.0
		for _, r := range reps {
			v, _ := sidecartest.ScrapeMetrics(t, nil, r.adminURL+"/metrics").Value(leader)
			n += v
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); leaders() != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replicas leading = %v 30 s after start, want 1", leaders())
		}
	}
	stop := fillQueue(core, key)
	for _, r := range reps { // the follower too: it reads no Core, it puts the leader's rate in force
		waitMetric(t, r.adminURL, rate, func(v float64) bool { return v < 10 && v >= 1 })
	}
	stop()
	if n := leaders(); n != 1 {
		t.Errorf("replicas leading = %v, want 1", n)
	}
	for _, r := range reps {
		waitMetric(t, r.adminURL, rate, func(v float64) bool { return v == 10 })
	}
}

// TestAdaptiveLimitsInForce: the routes the adaptive limit sees carry the rate their
// bucket runs at: the one it set, then, once a reload changed the route's limit and built
// its bucket anew, the configured rate again.
func TestAdaptiveLimitsInForce(t *testing.T) {
	set, err := limiter.NewSet(map[string]limiter.Limit{"file_result": {Rate: 10}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var live liveLimits
	live.Store(set)
	l := adaptiveLimits{live: &live}
	if err := set.SetRate("file_result", 4); err != nil {
		t.Fatal(err)
	}
	if r := l.Routes(); len(r) != 1 || r[0] != (adaptive.Route{Name: "file_result", Floor: 1, Ceiling: 10, InForce: 4}) {
		t.Errorf("routes after SetRate(4) = %+v, want file_result 1 to 10, 4 in force", r)
	}
	next, _, err := set.Update(map[string]limiter.Limit{"file_result": {Rate: 20}})
	if err != nil {
		t.Fatal(err)
	}
	live.Store(next)
	if r := l.Routes(); len(r) != 1 || r[0] != (adaptive.Route{Name: "file_result", Floor: 2, Ceiling: 20, InForce: 20}) {
		t.Errorf("routes after a reload to 20 = %+v, want file_result 2 to 20, 20 in force", r)
	}
}
