package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
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

// TestConcurrentPollsBurst releases 50 polls at once, each on its own connection,
// against file_result with burst 2 and a negligible rate: exactly 2 reach Core, 48 are
// answered 503.
func TestConcurrentPollsBurst(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 2}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })

	const n = 50
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	start := make(chan struct{})
	codes := make(chan int, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/file/id%d", base, i), nil)
			<-start
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	close(errs)
	for err := range errs {
		t.Errorf("poll: %v", err)
	}
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	if count[200] != 2 || count[503] != n-2 || len(count) != 2 {
		t.Errorf("statuses of %d concurrent polls = %v, want 2×200 and %d×503", n, count, n-2)
	}
	if got := up.n.Load(); got != 2 {
		t.Errorf("upstream got %d polls, want 2", got)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}); got != n-2 {
		t.Errorf("limiter_decisions_total{file_result,rejected} = %v, want %d", got, n-2)
	}
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "allowed"}, 2)
}

// TestFloodRealTime floods file_result (20/s, burst 5) from several goroutines for
// about 2 s of real time: the accepted count is burst + rate×elapsed, within 3.
func TestFloodRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time flood of 2 s")
	}
	const rate, burst = 20.0, 5
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: rate, Burst: burst}}, nil)
	base, _ := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 8)

	var accepted, rejected, other atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 2*time.Second {
				resp, err := client.Get(base + "/file/abc")
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					accepted.Add(1)
				case http.StatusServiceUnavailable:
					rejected.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()

	want := burst + rate*elapsed
	got := float64(accepted.Load())
	t.Logf("%.3f s: %v accepted, %d rejected, want %.1f", elapsed, got, rejected.Load(), want)
	if got < want-3 || got > want+3 {
		t.Errorf("accepted %v in %.3f s at %v/s burst %d, want %.1f ± 3", got, elapsed, rate, burst, want)
	}
	if rejected.Load() < 100 {
		t.Errorf("only %d rejected: the flood did not keep the bucket empty", rejected.Load())
	}
	if other.Load() != 0 {
		t.Errorf("%d requests failed or got another status", other.Load())
	}
	if up.n.Load() != accepted.Load() {
		t.Errorf("upstream got %d, want the %d accepted", up.n.Load(), accepted.Load())
	}
}

// TestFloodFakeClock floods file_result (2/s, burst 3) through HTTP over 10 simulated
// seconds in steps of 100 ms, on a limiter built with a fake clock: accepted is
// burst + rate×elapsed = 23, within 1.
func TestFloodFakeClock(t *testing.T) {
	const rate, burst = 2.0, 3
	clock := newFakeClock()
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: rate, Burst: burst}}, clock.now)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 1)

	accepted, rejected := 0, 0
	const step, steps = 100 * time.Millisecond, 100
	for i := 0; i <= steps; i++ {
		if i > 0 {
			clock.advance(step)
		}
		for n := 0; ; n++ {
			if n > 100 {
				t.Fatalf("step %d: more than 100 requests accepted", i)
			}
			resp, _ := do(t, client, http.MethodGet, base+"/file/abc", nil)
			if resp.StatusCode == http.StatusServiceUnavailable {
				rejected++
				break
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d, want 200 or 503", resp.StatusCode)
			}
			accepted++
		}
	}
	elapsed := (steps * step).Seconds()
	want := burst + rate*elapsed
	if math.Abs(float64(accepted)-want) > 1 {
		t.Errorf("accepted %d over %v simulated s at %v/s burst %d, want %v ± 1", accepted, elapsed, rate, burst, want)
	}
	if got := up.n.Load(); got != int64(accepted) {
		t.Errorf("upstream got %d, want the %d accepted", got, accepted)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}); int(got) != rejected {
		t.Errorf("limiter_decisions_total{file_result,rejected} = %v, want %d", got, rejected)
	}
}

// TestClientShareRealTime has two clients (apikeys) poll file_result 4 times a second
// for 10 s with a per-client share of 2 per second and a generous global bucket: each
// keeps getting about 2 a second, whatever the other does.
func TestClientShareRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time per-client share over 10 s")
	}
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 1000, Burst: 1000, ClientLimit: 2, ClientWindow: time.Second}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 2)

	var wg sync.WaitGroup
	results := make([]map[int]int, 2)
	for c := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes := map[int]int{}
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for i := range 40 {
				if i > 0 {
					<-tick.C
				}
				req, _ := http.NewRequest(http.MethodGet, base+"/file/abc", nil)
				req.Header.Set("apikey", fmt.Sprintf("key-%d", c))
				resp, err := client.Do(req)
				if err != nil {
					codes[-1]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes[resp.StatusCode]++
			}
			results[c] = codes
		}()
	}
	wg.Wait()
	for c, codes := range results {
		t.Logf("client %d: %v", c, codes)
		if codes[200] < 17 || codes[200] > 23 {
			t.Errorf("client %d: %d of 40 accepted over 10 s at 2/s, want 17..23 (%v)", c, codes[200], codes)
		}
		if codes[200]+codes[503] != 40 {
			t.Errorf("client %d: statuses %v, want only 200 and 503", c, codes)
		}
	}
	rej := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected_client"})
	if want := float64(results[0][503] + results[1][503]); rej != want {
		t.Errorf("limiter_decisions_total{file_result,rejected_client} = %v, want %v", rej, want)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}); got != 0 {
		t.Errorf("limiter_decisions_total{file_result,rejected} = %v, want 0: the global bucket is generous", got)
	}
}

// TestClientKeys checks the per-client share's key over HTTP: the apikey when present
// (two apikeys have independent shares), else the peer address (a new connection from
// the same address, another port, shares it).
func TestClientKeys(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {ClientLimit: 1, ClientWindow: time.Minute}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })

	// Each request on a new connection, so that the peer port differs.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	steps := []struct {
		apikey string
		want   int
	}{
		{"alpha", 200},
		{"alpha", 503},
		{"beta", 200}, // another apikey: its own share
		{"beta", 503},
		{"", 200}, // no apikey: keyed by 127.0.0.1
		{"", 503}, // same address, another port
		{"gamma", 200},
		{"alpha", 503},
	}
	for i, s := range steps {
		h := http.Header{}
		if s.apikey != "" {
			h.Set("apikey", s.apikey)
		}
		resp, body := do(t, client, http.MethodGet, base+"/file/abc", h)
		if resp.StatusCode != s.want {
			t.Errorf("step %d, apikey %q: status = %d, want %d", i, s.apikey, resp.StatusCode, s.want)
		}
		if s.want == 503 {
			if !strings.Contains(body, "this client") || !strings.Contains(body, "file_result") {
				t.Errorf("step %d: body = %q, want it to name this client and route file_result", i, body)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "60" {
				t.Errorf("step %d: Retry-After = %q, want 60 (the client window)", i, ra)
			}
		}
	}
	if got := up.n.Load(); got != 4 {
		t.Errorf("upstream got %d, want 4", got)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected_client"}); got != 4 {
		t.Errorf("limiter_decisions_total{file_result,rejected_client} = %v, want 4", got)
	}
}

// TestForwardedForFromUntrustedPeer checks over HTTP that an untrusted peer cannot pick
// its client key with X-Forwarded-For, and that a trusted one can.
func TestForwardedForFromUntrustedPeer(t *testing.T) {
	tests := []struct {
		name    string
		trusted []netip.Prefix
		want    []int // statuses of XFF 1.1.1.1, 2.2.2.2, 1.1.1.1
	}{
		{"untrusted peer", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []int{200, 503, 503}},
		{"no trusted proxies", nil, []int{200, 503, 503}},
		{"trusted peer", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}, []int{200, 200, 503}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := &countingUpstream{}
			set := limitSet(t, map[string]limiter.Limit{"file_result": {ClientLimit: 1, ClientWindow: time.Minute}}, nil)
			base, _ := newTestProxy(t, up, func(o *Options) {
				o.Limits = set
				o.TrustedProxies = tt.trusted
			})
			for i, xff := range []string{"1.1.1.1", "2.2.2.2", "1.1.1.1"} {
				resp, _ := do(t, nil, http.MethodGet, base+"/file/abc", http.Header{"X-Forwarded-For": {xff}, "X-Real-Ip": {xff}})
				if resp.StatusCode != tt.want[i] {
					t.Errorf("request %d (X-Forwarded-For %s): status = %d, want %d", i, xff, resp.StatusCode, tt.want[i])
				}
			}
		})
	}
}

// TestLimitResponse checks the answer to a rejected request: 503 by default or 429 as
// configured, Retry-After the rounded-up time to the next token, a Core-style JSON body
// naming the route, and nothing sent to Core.
func TestLimitResponse(t *testing.T) {
	for _, status := range []int{0, http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			want := status
			if want == 0 {
				want = http.StatusServiceUnavailable
			}
			clock := newFakeClock()
			up := &countingUpstream{}
			set := limitSet(t, map[string]limiter.Limit{"batch_status": {Rate: 0.1, Burst: 1}}, clock.now)
			base, reg := newTestProxy(t, up, func(o *Options) {
				o.Limits = set
				o.LimitStatus = status
			})
			if resp, _ := do(t, nil, http.MethodGet, base+"/file/batch/b1", nil); resp.StatusCode != http.StatusOK {
				t.Fatalf("first request: status = %d, want 200", resp.StatusCode)
			}
			for _, tc := range []struct {
				advance    time.Duration
				retryAfter string
			}{
				{0, "10"},
				{2500 * time.Millisecond, "8"},
				{7 * time.Second, "1"},
				{499 * time.Millisecond, "1"},
			} {
				clock.advance(tc.advance)
				resp, body := do(t, nil, http.MethodGet, base+"/file/batch/b1", nil)
				if resp.StatusCode != want {
					t.Fatalf("after %v: status = %d, want %d", tc.advance, resp.StatusCode, want)
				}
				if got := resp.Header.Get("Retry-After"); got != tc.retryAfter {
					t.Errorf("after %v: Retry-After = %q, want %q", tc.advance, got, tc.retryAfter)
				}
				if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
					t.Errorf("Content-Type = %q, want application/json", ct)
				}
				var e map[string]string
				if err := json.Unmarshal([]byte(body), &e); err != nil || len(e) != 1 || !strings.Contains(e["err"], "batch_status") {
					t.Errorf("body = %q, want {\"err\": \"...\"} naming route batch_status", body)
				}
			}
			if got := up.n.Load(); got != 1 {
				t.Errorf("upstream got %d requests, want 1: a rejected request reached it", got)
			}
			if got := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": "batch_status", "code": fmt.Sprint(want)}); got != 4 {
				t.Errorf("requests_total{batch_status,code=%d} = %v, want 4", want, got)
			}
			// The token is back after 10 s in all: the next request passes.
			clock.advance(2 * time.Millisecond)
			if resp, _ := do(t, nil, http.MethodGet, base+"/file/batch/b1", nil); resp.StatusCode != http.StatusOK {
				t.Errorf("after 10 s: status = %d, want 200", resp.StatusCode)
			}
		})
	}
}

// TestNewRejectsLimitStatus checks that New accepts only 0, 503 and 429.
func TestNewRejectsLimitStatus(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	for _, status := range []int{200, 418, 500, 502} {
		_, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), LimitStatus: status})
		if err == nil {
			t.Errorf("New(LimitStatus %d) = nil error, want one", status)
		}
	}
}

// TestExpectContinueRejected checks that an upload rejected by its bucket is answered
// at once, without "100 Continue" first, and that Core sees nothing of it.
func TestExpectContinueRejected(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"submit": {Rate: 0.001, Burst: 1}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })

	resp, err := http.Post(base+"/file", "application/octet-stream", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first upload: status = %d, want 200", resp.StatusCode)
	}

	// Headers only: the body is never sent, so a proxy that waits for it (or forwards
	// the request) times out instead of answering.
	resp, body := rawRequest(t, base, "POST /file HTTP/1.1\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: 1048576\r\nExpect: 100-continue\r\n")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("rejected upload with Expect: 100-continue: first response status = %d, want 503 (no 100 Continue)", resp.StatusCode)
	}
	if !strings.Contains(body, `"err"`) {
		t.Errorf("body = %q, want a Core-style error", body)
	}
	if got := up.n.Load(); got != 1 {
		t.Errorf("upstream got %d requests, want 1 (the first upload only)", got)
	}
	if got := metricValue(t, reg, "mdproxy_request_body_bytes_total", map[string]string{"route": "submit"}); got > 5 {
		t.Errorf("request_body_bytes_total{submit} = %v, want 5 at most: the rejected body was read", got)
	}
}

// TestDelayedWithinMaxWait checks that a request that finds no token waits for one
// when it comes within MaxWait, and passes.
func TestDelayedWithinMaxWait(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"hash_lookup": {Rate: 20, Burst: 1, MaxWait: 5 * time.Second}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	for i := range 3 {
		if resp, _ := do(t, nil, http.MethodGet, base+"/hash/abc", nil); resp.StatusCode != http.StatusOK {
			t.Errorf("request %d: status = %d, want 200", i, resp.StatusCode)
		}
	}
	if up.n.Load() != 3 {
		t.Errorf("upstream got %d, want 3", up.n.Load())
	}
	allowed := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "allowed"})
	delayed := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "delayed"})
	if allowed+delayed != 3 || delayed < 1 {
		t.Errorf("decisions allowed %v, delayed %v, want 3 in all and at least 1 delayed", allowed, delayed)
	}
}

// TestCanceledWhileWaiting checks that a client that leaves while its request waits for
// a token is counted as canceled and 499, and that Core never sees the request.
func TestCanceledWhileWaiting(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"hash_lookup": {Rate: 0.1, Burst: 1, MaxWait: 30 * time.Second}}, nil)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	if resp, _ := do(t, nil, http.MethodGet, base+"/hash/abc", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status = %d, want 200", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/hash/abc", nil)
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("waiting request: status %d, want the client's deadline to end it", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting request: %v, want context deadline exceeded", err)
	}
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "canceled"}, 1)
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "hash_lookup", "code": "499"}, 1)
	waitMetric(t, reg, "mdproxy_in_flight_requests", map[string]string{"route": "hash_lookup"}, 0)
	if up.n.Load() != 1 {
		t.Errorf("upstream got %d, want 1", up.n.Load())
	}
}

// TestLimitGauges checks that the limit gauges show each route's configured limit,
// Burst filled in when zero, and 0 for unlimited routes.
func TestLimitGauges(t *testing.T) {
	set := limitSet(t, map[string]limiter.Limit{
		"file_result":  {Rate: 2.5, Burst: 7, MaxWait: 250 * time.Millisecond},
		"hash_lookup":  {Rate: 9.2},
		"batch_status": {Rate: 0.5},
		"other":        {Rate: 100, Burst: 200, MaxWait: 2 * time.Second},
	}, nil)
	var m *metrics.Metrics
	newTestProxy(t, &countingUpstream{}, func(o *Options) { o.Limits = set; m = o.Metrics })
	tests := []struct {
		route                string
		rate, burst, maxWait float64
	}{
		{"file_result", 2.5, 7, 0.25},
		{"hash_lookup", 9.2, 10, 0},
		{"batch_status", 0.5, 1, 0},
		{"other", 100, 200, 2},
		{"submit", 0, 0, 0},
		{"version", 0, 0, 0},
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
	// One series per route, whatever the route.
	for name, c := range map[string]prometheus.Collector{
		"mdproxy_limit_rate_requests_per_second": m.LimitRate,
		"mdproxy_limit_burst_requests":           m.LimitBurst,
		"mdproxy_limit_max_wait_seconds":         m.LimitMaxWait,
	} {
		if n := testutil.CollectAndCount(c); n != len(RouteNames()) {
			t.Errorf("%s has %d series, want %d (one per route)", name, n, len(RouteNames()))
		}
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
	}, nil)
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
		"decision": setOf("allowed", "delayed", "rejected", "rejected_client", "canceled"),
		"kind":     setOf(metrics.KindRefused, metrics.KindReset, metrics.KindTimeout, metrics.KindCanceled, metrics.KindOther),
		"result":   setOf(metrics.ReloadSuccess, metrics.ReloadError),
	}
	code := regexp.MustCompile(`^[1-5][0-9][0-9]$`)
	secretSet := setOf(secrets...)
	maxSeries := map[string]int{
		"mdproxy_requests_total":            len(routes) * len(methods) * 4,
		"mdproxy_limiter_decisions_total":   len(routes) * 5,
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
		if c != "200" && c != "400" && c != "503" {
			t.Errorf("requests_total has code %s, want only 200, 400 and 503", c)
		}
	}
	t.Logf("%d requests, %d requests_total series", len(jobs), seriesCount(t, reg, "mdproxy_requests_total"))
}

// TestSetLimits swaps the limits of a serving proxy, as a reload does: a request
// waiting for a token of the old bucket finishes there, requests that start afterwards
// use the new bucket, a route whose bucket is kept keeps its state, and the limit
// gauges follow.
func TestSetLimits(t *testing.T) {
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
	}, nil)
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
	mustWaitMetric(t, reg, "mdproxy_in_flight_requests", map[string]string{"route": "file_result"}, 1)

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
	// The poll that waited on the old bucket got its token there.
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
