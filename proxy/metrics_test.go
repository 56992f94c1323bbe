package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestLimitGauges checks that the limit gauges show each limited route's configured
// limit, Burst filled in when zero; that a route never limited has no series (issue 13:
// series created when a route is limited); and that one whose limit a reload removes
// reads 0.
func TestLimitGauges(t *testing.T) {
	set := limitSet(t, map[string]limiter.Limit{
		"file_result":  {Rate: 2.5, Burst: 7, MaxWait: 250 * time.Millisecond},
		"hash_lookup":  {Rate: 9.2},
		"batch_status": {Rate: 0.5},
		"other":        {Rate: 100, Burst: 200, MaxWait: 2 * time.Second},
	}, newFakeClock())
	var m *metrics.Metrics
	u, err := url.Parse("http://upstream.invalid")
	if err != nil {
		t.Fatal(err)
	}
	m = metrics.New(prometheus.NewRegistry())
	p, err := New(Options{Upstream: u, Metrics: m, Limits: set})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	// One series per limited route, none for the others; counted before the reads
	// below, which create the series they read.
	for name, c := range map[string]prometheus.Collector{
		"mdproxy_limit_rate_requests_per_second": m.LimitRate,
		"mdproxy_limit_burst_requests":           m.LimitBurst,
		"mdproxy_limit_max_wait_seconds":         m.LimitMaxWait,
	} {
		if n := testutil.CollectAndCount(c); n != 4 {
			t.Errorf("%s has %d series, want 4 (one per limited route)", name, n)
		}
	}
	tests := []struct {
		route                string
		rate, burst, maxWait float64
	}{
		{"file_result", 2.5, 7, 0.25},
		{"hash_lookup", 9.2, 10, 0},
		{"batch_status", 0.5, 1, 0},
		{"other", 100, 200, 2},
	}
	for _, tt := range tests {
		if got := testutil.ToFloat64(m.LimitRate.WithLabelValues(tt.route)); got != tt.rate {
			t.Errorf("limit_rate_requests_per_second{%s} = %v, want %v", tt.route, got, tt.rate)
		}
		if got := testutil.ToFloat64(m.LimitBurst.WithLabelValues(tt.route)); got != tt.burst {
			t.Errorf("limit_burst_requests{%s} = %v, want %v", tt.route, got, tt.burst)
		}
		if got := testutil.ToFloat64(m.LimitMaxWait.WithLabelValues(tt.route)); got != tt.maxWait {
			t.Errorf("limit_max_wait_seconds{%s} = %v, want %v", tt.route, got, tt.maxWait)
		}
	}
	// A reload that leaves only hash_lookup limited: the others read 0.
	p.SetLimits(limitSet(t, map[string]limiter.Limit{"hash_lookup": {Rate: 9.2}}, newFakeClock()))
	for _, route := range []string{"file_result", "batch_status", "other"} {
		if got := testutil.ToFloat64(m.LimitRate.WithLabelValues(route)); got != 0 {
			t.Errorf("limit_rate_requests_per_second{%s} = %v after its limit was removed, want 0", route, got)
		}
	}
	if n := testutil.CollectAndCount(m.LimitRate); n != 4 {
		t.Errorf("mdproxy_limit_rate_requests_per_second has %d series after the reload, want 4", n)
	}
}

// TestMetricsCardinality sends many distinct data_ids (10,000; 1,000 with -short),
// unknown paths, apikeys and odd methods, then checks that every mdproxy_* family keeps a bounded number of series and
// that every label value comes from a fixed set: no data_id, path or apikey ever
// becomes a label.
func TestMetricsCardinality(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{
		"file_result":  {Rate: 1e6, Burst: 1e6},
		"hash_lookup":  {Rate: 0.001, Burst: 1},
		"batch_status": {ClientLimit: 1, ClientWindow: time.Minute},
	}, newFakeClock())
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 8)

	type job struct {
		method, path, apikey string
	}
	var jobs []job
	var secrets []string // every data_id, path segment and apikey sent
	ids := 10000
	if testing.Short() {
		ids = 1000
	}
	for range ids {
		id := randomID(t)
		secrets = append(secrets, id)
		jobs = append(jobs, job{http.MethodGet, "/file/" + id, ""})
	}
	for i := range 1000 {
		id := randomID(t)
		secrets = append(secrets, id)
		jobs = append(jobs, job{http.MethodGet, fmt.Sprintf("/unknown/%s/%d", id, i), ""})
	}
	for range 200 {
		id := randomID(t)
		secrets = append(secrets, id)
		jobs = append(jobs, job{http.MethodGet, "/hash/" + id, ""})
	}
	for range 100 {
		key := randomID(t)
		secrets = append(secrets, key)
		jobs = append(jobs, job{http.MethodGet, "/file/batch/b1", key}, job{http.MethodGet, "/file/batch/b1", key})
	}
	for _, m := range []string{"PROPFIND", "BREW", "get", "Post", "MKCOL", "PURGE", "X-" + strings.ToUpper(randomID(t)[:8]), http.MethodTrace, http.MethodPatch, http.MethodOptions} {
		for range 10 {
			id := randomID(t)
			secrets = append(secrets, id)
			jobs = append(jobs, job{m, "/file/" + id, ""}, job{m, "/" + id, ""})
		}
	}
	for range 50 {
		id := randomID(t)
		secrets = append(secrets, id)
		jobs = append(jobs, job{http.MethodGet, "/file/" + id + "%2Fx", ""})
	}

	work := make(chan job)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				req, err := http.NewRequest(j.method, base+j.path, nil)
				if err != nil {
					failed.Add(1)
					continue
				}
				if j.apikey != "" {
					req.Header.Set("apikey", j.apikey)
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d requests failed", n)
	}
	waitMetric(t, reg, "mdproxy_requests_total", nil, float64(len(jobs)))
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "method": "GET", "code": "200"}, float64(ids))
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "hash_lookup", "code": "503"}, 199)
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "batch_status", "decision": "rejected_client"}, 100)
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": RouteOther, "method": "OTHER"}, 160)

	routes := setOf(RouteNames()...)
	methods := setOf(append(append([]string(nil), metrics.Methods...), "OTHER")...)
	allowed := map[string]map[string]bool{
		"route":    routes,
		"method":   methods,
		"decision": setOf("allowed", "delayed", "rejected", "rejected_client", "canceled", "would_reject"),
		"kind":     setOf(metrics.KindRefused, metrics.KindReset, metrics.KindTimeout, metrics.KindCanceled, metrics.KindOther),
		"result":   setOf(metrics.ReloadSuccess, metrics.ReloadError),
	}
	code := regexp.MustCompile(`^[1-5][0-9][0-9]$`)
	secretSet := setOf(secrets...)
	maxSeries := map[string]int{
		"mdproxy_requests_total":            len(routes) * len(methods) * 4,
		"mdproxy_limiter_decisions_total":   len(routes) * 6,
		"mdproxy_upstream_errors_total":     len(routes) * 5,
		"mdproxy_request_duration_seconds":  len(routes),
		"mdproxy_upstream_duration_seconds": len(routes),
		"mdproxy_in_flight_requests":        len(routes),
		"mdproxy_request_body_bytes_total":  len(routes),
		"mdproxy_response_body_bytes_total": len(routes),
		"mdproxy_build_info":                1,
		"mdproxy_config_reloads_total":      2,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]bool{}
	families := 0
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, metrics.Namespace+"_") {
			continue
		}
		families++
		limit, ok := maxSeries[name]
		if !ok {
			limit = len(routes) // the limit gauges and any new per-route family
		}
		if n := len(mf.GetMetric()); n > limit {
			t.Errorf("%s has %d series, want at most %d", name, n, limit)
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				k, v := lp.GetName(), lp.GetValue()
				if strings.Contains(v, "/") || secretSet[v] || containsAny(v, secrets) {
					t.Errorf("%s: label %s=%q holds a path, data_id or apikey", name, k, v)
					continue
				}
				switch {
				case allowed[k] != nil:
					if !allowed[k][v] {
						t.Errorf("%s: label %s=%q, want one of a fixed set", name, k, v)
					}
				case k == "code":
					if !code.MatchString(v) {
						t.Errorf("%s: label code=%q, want a status code", name, k)
					}
					codes[v] = true
				case name == "mdproxy_build_info" && (k == "version" || k == "revision" || k == "goversion"):
				default:
					t.Errorf("%s: unexpected label %s=%q", name, k, v)
				}
			}
		}
	}
	if families < len(maxSeries) {
		t.Errorf("found %d mdproxy_* families, want at least %d", families, len(maxSeries))
	}
	for c := range codes {
		if c != "200" && c != "400" && c != "501" && c != "503" {
			t.Errorf("requests_total has code %s, want only 200, 400, 501 and 503", c)
		}
	}
	t.Logf("%d requests, %d requests_total series", len(jobs), seriesCount(t, reg, "mdproxy_requests_total"))
}

// TestSetLimits swaps the limits of a serving proxy, as a reload does: a request
// waiting for a token of the old bucket finishes there, requests that start afterwards
// use the new bucket, a route whose bucket is kept keeps its state, and the limit
// gauges follow.
func TestSetLimits(t *testing.T) {
	clock := newFakeClock()
	up := &countingUpstream{}
	u, err := url.Parse("http://upstream.invalid")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	old := limitSet(t, map[string]limiter.Limit{
		// A second poll waits half a second for its token: a wait the swap happens in.
		"file_result": {Rate: 2, Burst: 1, MaxWait: 10 * time.Second},
		"hash_lookup": {Rate: 0.001, Burst: 1},
	}, clock)
	p, err := New(Options{
		Upstream: u, Metrics: metrics.New(reg), Limits: old,
		Transport: inMemoryUpstream(func(r *http.Request) (*http.Response, error) {
			rec := httptest.NewRecorder()
			up.ServeHTTP(rec, r)
			return rec.Result(), nil
		}),
	})
	if err != nil {
		t.Fatalf("New() = %v", err)
	}
	serve := func(path string) int {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	gauge := func(name, route string) float64 {
		return metricValue(t, reg, name, map[string]string{"route": route})
	}
	if code := serve("/hash/" + strings.Repeat("a", 32)); code != http.StatusOK {
		t.Fatalf("first hash look-up = %d, want 200", code)
	}
	if code := serve("/file/a"); code != http.StatusOK {
		t.Fatalf("first poll = %d, want 200", code)
	}
	waiter := make(chan int, 1)
	go func() { waiter <- serve("/file/b") }()
	blockUntilWaiting(t, clock, 1) // it waits on the old bucket, half a second from its token

	next, changed, err := old.Update(map[string]limiter.Limit{
		"file_result":  {Rate: 0.001, Burst: 3},
		"hash_lookup":  {Rate: 0.001, Burst: 1}, // unchanged: its empty bucket is kept
		"batch_status": {Rate: 4, MaxWait: 2 * time.Second},
	})
	if err != nil {
		t.Fatalf("Update() = %v", err)
	}
	if want := []string{"batch_status", "file_result"}; !slices.Equal(changed, want) {
		t.Fatalf("Update() changed = %v, want %v", changed, want)
	}
	p.SetLimits(next)

	// The new file_result bucket starts full: 3 polls pass, the 4th is refused.
	for i := range 3 {
		if code := serve(fmt.Sprintf("/file/n%d", i)); code != http.StatusOK {
			t.Errorf("poll #%d after SetLimits = %d, want 200 from the new, full bucket", i+1, code)
		}
	}
	if code := serve("/file/n3"); code != http.StatusServiceUnavailable {
		t.Errorf("poll #4 after SetLimits = %d, want 503: the new bucket holds 3", code)
	}
	if code := serve("/hash/" + strings.Repeat("b", 32)); code != http.StatusServiceUnavailable {
		t.Errorf("hash look-up after SetLimits = %d, want 503: its unchanged bucket is kept, empty", code)
	}
	// The poll that waited on the old bucket is still waiting there, and gets its token
	// when the clock reaches it.
	select {
	case code := <-waiter:
		t.Fatalf("poll waiting across SetLimits = %d before its turn came", code)
	default:
	}
	clock.Advance(500 * time.Millisecond)
	select {
	case code := <-waiter:
		if code != http.StatusOK {
			t.Errorf("poll waiting across SetLimits = %d, want 200", code)
		}
	case <-time.After(longWait):
		t.Fatal("poll waiting across SetLimits did not finish")
	}
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "delayed"}, 1)

	for _, tc := range []struct {
		name, route string
		want        float64
	}{
		{"mdproxy_limit_rate_requests_per_second", "file_result", 0.001},
		{"mdproxy_limit_burst_requests", "file_result", 3},
		{"mdproxy_limit_max_wait_seconds", "file_result", 0},
		{"mdproxy_limit_rate_requests_per_second", "batch_status", 4},
		{"mdproxy_limit_burst_requests", "batch_status", 4}, // ceil(rate)
		{"mdproxy_limit_max_wait_seconds", "batch_status", 2},
		{"mdproxy_limit_rate_requests_per_second", "hash_lookup", 0.001},
	} {
		if got := gauge(tc.name, tc.route); got != tc.want {
			t.Errorf("%s{route=%q} after SetLimits = %v, want %v", tc.name, tc.route, got, tc.want)
		}
	}

	// No limits at all: every route unlimited, every gauge 0.
	p.SetLimits(nil)
	for i := range 5 {
		if code := serve(fmt.Sprintf("/file/u%d", i)); code != http.StatusOK {
			t.Errorf("poll #%d after SetLimits(nil) = %d, want 200", i+1, code)
		}
	}
	for _, route := range []string{"file_result", "batch_status", "hash_lookup"} {
		if got := gauge("mdproxy_limit_rate_requests_per_second", route); got != 0 {
			t.Errorf("limit rate of %s after SetLimits(nil) = %v, want 0", route, got)
		}
	}
}
