package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestConcurrentPollsBurst releases 50 polls at once, each on its own connection,
// against file_result with burst 2 and a negligible rate: exactly 2 reach Core, 48 are
// answered 503.

func TestConcurrentPollsBurst(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 2}}, newFakeClock())
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

// TestFloodConcurrent floods file_result (20/s, burst 5) from 8 goroutines at once over
// 2 simulated seconds, on a fake clock advanced in steps of 50 ms (one token each):
// within a step the goroutines race for the tokens until each is refused, and in all
// exactly burst + rate×elapsed = 45 polls pass, every one of them reaching Core, the
// rest answered 503.
func TestFloodConcurrent(t *testing.T) {
	const rate, burst = 20.0, 5
	const workers, step, steps = 8, 50 * time.Millisecond, 40
	clock := newFakeClock()
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: rate, Burst: burst}}, clock)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, workers)

	var accepted, rejected, other atomic.Int64
	for i := 0; i <= steps; i++ {
		if i > 0 {
			clock.Advance(step)
		}
		// The clock stands still while the goroutines flood: once one is refused, the
		// bucket is empty until the next step, and each goroutine stops at its first 503.
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for n := 0; n <= burst+1; n++ {
					resp, err := client.Get(base + "/file/abc")
					if err != nil {
						other.Add(1)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					switch resp.StatusCode {
					case http.StatusOK:
						accepted.Add(1)
					case http.StatusServiceUnavailable:
						rejected.Add(1)
						return
					default:
						other.Add(1)
						return
					}
				}
				other.Add(1) // more polls passed in one step than the bucket holds
			})
		}
		wg.Wait()
	}

	elapsed := (steps * step).Seconds()
	want := burst + rate*elapsed
	if got := float64(accepted.Load()); got != want {
		t.Errorf("accepted %v over %v simulated s at %v/s burst %d, want %v", got, elapsed, rate, burst, want)
	}
	if got, want := rejected.Load(), int64(workers*(steps+1)); got != want {
		t.Errorf("rejected %d, want %d: each goroutine refused once a step", got, want)
	}
	if other.Load() != 0 {
		t.Errorf("%d requests failed, got another status or passed beyond the bucket", other.Load())
	}
	if up.n.Load() != accepted.Load() {
		t.Errorf("upstream got %d, want the %d accepted", up.n.Load(), accepted.Load())
	}
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}, float64(rejected.Load()))
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "allowed"}, want)
}

// TestFloodFakeClock floods file_result (2/s, burst 3) through HTTP over 10 simulated
// seconds in steps of 100 ms, on a limiter built with a fake clock: accepted is
// burst + rate×elapsed = 23, within 1.
func TestFloodFakeClock(t *testing.T) {
	const rate, burst = 2.0, 3
	clock := newFakeClock()
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: rate, Burst: burst}}, clock)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 1)

	accepted, rejected := 0, 0
	const step, steps = 100 * time.Millisecond, 100
	for i := 0; i <= steps; i++ {
		if i > 0 {
			clock.Advance(step)
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

// TestClientShare has two clients (apikeys) poll file_result over 10 simulated seconds
// with a per-client share of 2 per second and a generous global bucket, on a fake
// clock advanced 250 ms at a time: one client polls 4 times a second, the other 12 (3
// at each step, all at once). Each keeps getting about 2 a second, the same whatever the
// other does, and every refusal is the client's share's.
//
// A share is a token bucket of 2 refilled at 2 a second (limiter.Limit.ClientLimit):
// each client gets its 2 at once, then one each 500 ms, 21 over the 9.75 s; the polls
// start 100 ms into a second, which changes nothing (there are no windows to fall on).
func TestClientShare(t *testing.T) {
	clock := newFakeClock()
	clock.Advance(100 * time.Millisecond)
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 1000, Burst: 1000, ClientLimit: 2, ClientWindow: time.Second}}, clock)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 4)

	perStep := []int{1, 3} // polls of each client at each step
	results := make([]map[int]int, len(perStep))
	for c := range results {
		results[c] = map[int]int{}
	}
	const steps = 40
	for i := range steps {
		if i > 0 {
			clock.Advance(250 * time.Millisecond)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for c, n := range perStep {
			for range n {
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodGet, base+"/file/abc", nil)
					req.Header.Set("apikey", fmt.Sprintf("key-%d", c))
					code := -1
					if resp, err := client.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					mu.Lock()
					results[c][code]++
					mu.Unlock()
				})
			}
		}
		wg.Wait()
	}
	for c, codes := range results {
		t.Logf("client %d: %v", c, codes)
		if codes[200] < 17 || codes[200] > 23 {
			t.Errorf("client %d: %d accepted over 10 s at 2/s, want 17..23 (%v)", c, codes[200], codes)
		}
		if sent := steps * perStep[c]; codes[200]+codes[503] != sent {
			t.Errorf("client %d: statuses %v, want only 200 and 503 for its %d polls", c, codes, sent)
		}
	}
	if results[0][200] != results[1][200] {
		t.Errorf("accepted %d of client 0 (4/s) and %d of client 1 (12/s), want the same: each client's share is its own", results[0][200], results[1][200])
	}
	rej := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected_client"})
	if want := float64(results[0][503] + results[1][503]); rej != want {
		t.Errorf("limiter_decisions_total{file_result,rejected_client} = %v, want %v", rej, want)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}); got != 0 {
		t.Errorf("limiter_decisions_total{file_result,rejected} = %v, want 0: the global bucket is generous", got)
	}
	if got, want := up.n.Load(), int64(results[0][200]+results[1][200]); got != want {
		t.Errorf("upstream got %d, want the %d accepted", got, want)
	}
}

// TestClientKeys checks the per-client share's key over HTTP: the apikey when present
// (two apikeys have independent shares), else the peer address (a new connection from
// the same address, another port, shares it).
func TestClientKeys(t *testing.T) {
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {ClientLimit: 1, ClientWindow: time.Minute}}, newFakeClock())
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
			// A share of 1 a minute: the request counted weighs under 0.5 halfway into
			// the next minute, 30 to 90 s from now depending on where in this minute
			// it fell.
			if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 30 || ra > 90 {
				t.Errorf("step %d: Retry-After = %q, want 30 to 90 s (when the client's next request fits)", i, resp.Header.Get("Retry-After"))
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
			set := limitSet(t, map[string]limiter.Limit{"file_result": {ClientLimit: 1, ClientWindow: time.Minute}}, newFakeClock())
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
			set := limitSet(t, map[string]limiter.Limit{"batch_status": {Rate: 0.1, Burst: 1}}, clock)
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
				clock.Advance(tc.advance)
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
			clock.Advance(2 * time.Millisecond)
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
	set := limitSet(t, map[string]limiter.Limit{"submit": {Rate: 0.001, Burst: 1}}, newFakeClock())
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
// when it comes within MaxWait, and passes when its turn comes on the bucket's clock:
// with 20/s and burst 1, two polls sent after the first wait 50 and 100 ms, each
// released, in turn, by the clock reaching it, and none of them sooner.
func TestDelayedWithinMaxWait(t *testing.T) {
	clock := newFakeClock()
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"hash_lookup": {Rate: 20, Burst: 1, MaxWait: 5 * time.Second}}, clock)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 2)
	if resp, _ := do(t, client, http.MethodGet, base+"/hash/abc", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status = %d, want 200", resp.StatusCode)
	}

	codes := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := client.Get(base + "/hash/abc")
			if err != nil {
				t.Errorf("waiting request: %v", err)
				codes <- -1
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	blockUntilWaiting(t, clock, 2) // both wait on the clock's timers
	released := func(at string, want int) {
		t.Helper()
		for range want {
			select {
			case code := <-codes:
				if code != http.StatusOK {
					t.Errorf("waiting request released at %s: status = %d, want 200", at, code)
				}
			case <-time.After(longWait):
				t.Fatalf("at %s: a waiting request was not released", at)
			}
		}
		select {
		case code := <-codes:
			t.Fatalf("at %s: a request answered %d before its turn", at, code)
		default:
		}
	}
	clock.Advance(49 * time.Millisecond)
	released("49 ms", 0)
	clock.Advance(time.Millisecond)
	released("50 ms", 1)
	clock.Advance(49 * time.Millisecond)
	released("99 ms", 0)
	clock.Advance(time.Millisecond)
	released("100 ms", 1)

	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "hash_lookup", "code": "200"}, 3)
	if up.n.Load() != 3 {
		t.Errorf("upstream got %d, want 3", up.n.Load())
	}
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "allowed"}, 1)
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "delayed"}, 2)
}

// TestCanceledWhileWaiting checks that a client that leaves while its request waits for
// a token is counted as canceled and 499, that Core never sees the request, and that
// its token is given back: once the clock reaches the turn it held, a new request
// passes at once.
func TestCanceledWhileWaiting(t *testing.T) {
	clock := newFakeClock()
	up := &countingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"hash_lookup": {Rate: 0.1, Burst: 1, MaxWait: 30 * time.Second}}, clock)
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })
	if resp, _ := do(t, nil, http.MethodGet, base+"/hash/abc", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("first request: status = %d, want 200", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/hash/abc", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		done <- err
	}()
	blockUntilWaiting(t, clock, 1) // it waits for its token, 10 s away
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("waiting request: %v, want the client's cancellation to end it", err)
		}
	case <-time.After(longWait):
		t.Fatal("waiting request did not end when its client left")
	}
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "canceled"}, 1)
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "hash_lookup", "code": "499"}, 1)
	waitMetric(t, reg, "mdproxy_in_flight_requests", map[string]string{"route": "hash_lookup"}, 0)
	if up.n.Load() != 1 {
		t.Errorf("upstream got %d, want 1", up.n.Load())
	}

	// The canceled request's turn, 10 s after the first, is free again: a request then
	// is allowed at once rather than waiting another 10 s.
	clock.Advance(10 * time.Second)
	if resp, _ := do(t, nil, http.MethodGet, base+"/hash/abc", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("request after 10 s: status = %d, want 200", resp.StatusCode)
	}
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "allowed"}, 2)
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "hash_lookup", "decision": "delayed"}, 0)
}

// TestDryRunFlood floods file_result with n polls from 8 goroutines against a loopback
// Core, on a fake clock that stands still, under limits that take 1 to 3 of them. In a
// dry run every poll gets Core's answer, none the limit's, and what the limit would
// have refused is counted would_reject (a would-be wait goes at once, counted allowed,
// and takes its turn); the same flood with the limit enforced is refused.
func TestDryRunFlood(t *testing.T) {
	const n = 40
	tests := []struct {
		name      string
		limit     limiter.Limit
		bridge    bool               // the polls go through the bridge (Options.Bridge)
		passed    int                // polls answered by Core; the others get 503
		decisions map[string]float64 // every other decision 0
	}{
		{"dry run", limiter.Limit{Rate: 0.5, Burst: 1, DryRun: true}, false,
			n, map[string]float64{"allowed": 1, "would_reject": n - 1}},
		{"enforced", limiter.Limit{Rate: 0.5, Burst: 1}, false,
			1, map[string]float64{"allowed": 1, "rejected": n - 1}},
		// 2 s a token, MaxWait 5 s: after the first, two would wait (2 and 4 s) and go
		// at once; the rest would wait 6 s or more, and would be rejected.
		{"dry run, would wait", limiter.Limit{Rate: 0.5, Burst: 1, MaxWait: 5 * time.Second, DryRun: true}, false,
			n, map[string]float64{"allowed": 3, "would_reject": n - 3}},
		{"dry run, client share", limiter.Limit{ClientLimit: 3, ClientWindow: time.Minute, DryRun: true}, false,
			n, map[string]float64{"allowed": 3, "would_reject": n - 3}},
		{"enforced, client share", limiter.Limit{ClientLimit: 3, ClientWindow: time.Minute}, false,
			3, map[string]float64{"allowed": 3, "rejected_client": n - 3}},
	}
	// The same floods through the bridge, which asks Core about ids it does not know
	// under the route's limit.
	for _, tt := range tests[:2] {
		tt.name += ", bridge"
		tt.bridge = true
		tests = append(tests, tt)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newFakeClock()
			up := &countingUpstream{}
			set := limitSet(t, map[string]limiter.Limit{"file_result": tt.limit}, clock)
			base, reg := newTestProxy(t, up, func(o *Options) {
				o.Limits = set
				if tt.bridge {
					o.Bridge = newTestBridge(t)
				}
			})
			client := keepAliveClient(t, 8)
			client.Timeout = longWait // a poll held on the clock, which never moves, fails

			type answer struct {
				code       int
				body       string
				retryAfter string
			}
			answers := make(chan answer, n)
			work := make(chan int, n)
			for i := range n {
				work <- i
			}
			close(work)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for i := range work {
						req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/file/id%d", base, i), nil)
						req.Header.Set("apikey", "one-client")
						resp, err := client.Do(req)
						if err != nil {
							t.Errorf("poll %d: %v", i, err)
							continue
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						answers <- answer{resp.StatusCode, string(b), resp.Header.Get("Retry-After")}
					}
				})
			}
			wg.Wait()
			close(answers)

			passed, limited := 0, 0
			for a := range answers {
				switch {
				case a.code == http.StatusOK && a.body == "ok" && a.retryAfter == "":
					passed++
				case a.code == http.StatusServiceUnavailable && a.retryAfter != "" && strings.Contains(a.body, "file_result"):
					limited++
				default:
					t.Errorf("poll answered %d %q (Retry-After %q), want Core's 200 \"ok\" or the limit's 503", a.code, a.body, a.retryAfter)
				}
			}
			if passed != tt.passed || limited != n-tt.passed {
				t.Errorf("%d polls: %d got Core's answer and %d the limit's 503, want %d and %d", n, passed, limited, tt.passed, n-tt.passed)
			}
			if got := up.n.Load(); got != int64(tt.passed) {
				t.Errorf("Core got %d polls, want %d", got, tt.passed)
			}
			for o := range limiter.Outcome(limiter.Outcomes) {
				checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": o.String()}, tt.decisions[o.String()])
			}
			waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "200"}, float64(tt.passed))
			checkMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "503"}, float64(n-tt.passed))
		})
	}
}

// stubLimiter is a limiter.Limiter of the test's own that decides every request alike,
// and records the client keys it is asked about.
type stubLimiter struct {
	decision limiter.Decision
	limit    limiter.Limit

	mu      sync.Mutex
	clients []string
}

func (l *stubLimiter) Acquire(_ context.Context, client string) limiter.Decision {
	l.mu.Lock()
	l.clients = append(l.clients, client)
	l.mu.Unlock()
	return l.decision
}

func (l *stubLimiter) Limit() limiter.Limit { return l.limit }

func (l *stubLimiter) asked() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.clients)
}

// stubLimits gives each route the Limiter of the map; a route not in it is unlimited.
type stubLimits map[string]limiter.Limiter

func (m stubLimits) Limiter(route string) limiter.Limiter { return m[route] }

// TestCustomLimiter checks the proxy's seam to the limiter: whatever Limiter a Limits
// gives a route, the proxy asks it once a request, with the client key when its Limit
// has a per-client share, and follows its decision: a rejection is the limit status
// with the Retry-After it says and nothing sent to Core, any passing decision is
// forwarded, and the limit gauges show its Limit.
func TestCustomLimiter(t *testing.T) {
	reject := &stubLimiter{
		decision: limiter.Decision{Outcome: limiter.Rejected, RetryAfter: 3 * time.Second},
		limit:    limiter.Limit{Rate: 7, Burst: 9, ClientLimit: 1},
	}
	rejectClient := &stubLimiter{decision: limiter.Decision{Outcome: limiter.RejectedClient, RetryAfter: 90 * time.Second}}
	wouldReject := &stubLimiter{decision: limiter.Decision{Outcome: limiter.WouldReject}}
	delayed := &stubLimiter{decision: limiter.Decision{Outcome: limiter.Delayed, Waited: time.Second}}
	up := &recordingUpstream{}
	base, reg := newTestProxy(t, up, func(o *Options) {
		o.Limits = stubLimits{
			"file_result":  reject,
			"hash_lookup":  rejectClient,
			"batch_status": wouldReject,
			"stat":         delayed,
		}
	})
	client := keepAliveClient(t, 1)
	tests := []struct {
		path, route string
		lim         *stubLimiter // nil: unlimited
		code        int
		retryAfter  string
		body        string // a part of it
		client      string // the key the limiter is asked about
	}{
		{"/file/x", "file_result", reject, http.StatusServiceUnavailable, "3", "route file_result", "apikey:alpha"},
		{"/hash/abc", "hash_lookup", rejectClient, http.StatusServiceUnavailable, "90", "this client on route hash_lookup", ""},
		{"/file/batch/b1", "batch_status", wouldReject, http.StatusOK, "", "ok", ""},
		{"/stat/nodes", "stat", delayed, http.StatusOK, "", "ok", ""},
		{"/version", "version", nil, http.StatusOK, "", "ok", ""},
	}
	for _, tt := range tests {
		resp, body := do(t, client, http.MethodGet, base+tt.path, http.Header{"Apikey": {"alpha"}})
		if resp.StatusCode != tt.code || resp.Header.Get("Retry-After") != tt.retryAfter || !strings.Contains(body, tt.body) {
			t.Errorf("GET %s = %d %q (Retry-After %q), want %d with %q (Retry-After %q)",
				tt.path, resp.StatusCode, body, resp.Header.Get("Retry-After"), tt.code, tt.body, tt.retryAfter)
		}
		if tt.lim != nil {
			if got := tt.lim.asked(); !slices.Equal(got, []string{tt.client}) {
				t.Errorf("GET %s: the route's limiter was asked about %q, want once about %q", tt.path, got, tt.client)
			}
			checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": tt.route, "decision": tt.lim.decision.Outcome.String()}, 1)
		} else {
			checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": tt.route, "decision": "allowed"}, 1)
		}
	}
	if got, want := up.requests(), []string{"GET /file/batch/b1", "GET /stat/nodes", "GET /version"}; !slices.Equal(got, want) {
		t.Errorf("Core got %q, want %q: the rejected requests reached it, or a passed one did not", got, want)
	}
	checkMetric(t, reg, "mdproxy_limit_rate_requests_per_second", map[string]string{"route": "file_result"}, 7)
	checkMetric(t, reg, "mdproxy_limit_burst_requests", map[string]string{"route": "file_result"}, 9)
	checkMetric(t, reg, "mdproxy_limit_rate_requests_per_second", map[string]string{"route": "version"}, 0)
}
