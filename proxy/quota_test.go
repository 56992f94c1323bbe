package proxy

import (
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/limiter"
)

// TestRateLimitHeaders: with RateLimitHeaders, a limited route's 200 and 503 carry
// RateLimit-Policy (the burst as q, the seconds to fill as w) and RateLimit (the tokens
// left as r, the seconds until full as t), following the bucket, local on a fake clock
// or in Redis; an unlimited route's answers and every answer without the option carry
// neither.
func TestRateLimitHeaders(t *testing.T) {
	// rate 0.5, burst 2: 4 s to fill; r and t after each of three polls.
	local := []quota{{200, "1", "2", "4"}, {200, "0", "4", "4"}, {503, "0", "4", "4"}}
	for _, on := range []bool{true, false} {
		set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.5, Burst: 2}}, newFakeClock())
		checkRateLimitHeaders(t, set, on, local)
	}
	// The bucket in Redis, on Redis's clock: a token each 100 s, so that the time the
	// polls take never brings one back; 200 s to fill.
	srv := redistest.Start(t)
	set, err := limiter.NewSet(map[string]limiter.Limit{"file_result": {Rate: 0.01, Burst: 2}}, nil,
		limiter.WithRedis(limiter.NewRedis(srv.Client(t), limiter.RedisOptions{Timeout: 10 * time.Second})))
	if err != nil {
		t.Fatal(err)
	}
	checkRateLimitHeaders(t, set, true, []quota{{200, "1", "100", "200"}, {200, "0", "200", "200"}, {503, "0", "200", "200"}})
}

// quota is a poll's expected status, RateLimit's r and t, and RateLimit-Policy's w.
type quota struct {
	status  int
	r, t, w string
}

// checkRateLimitHeaders polls file_result (burst 2) through a proxy on set with the
// RateLimit header fields on or off, each poll's answer as want says, and checks that an
// unlimited route never has them.
func checkRateLimitHeaders(t *testing.T, set *limiter.Set, on bool, want []quota) {
	t.Helper()
	policy := regexp.MustCompile(`^"file_result";q=(\d+);w=(\d+)$`)
	quotaField := regexp.MustCompile(`^"file_result";r=(\d+);t=(\d+)$`)
	base, _ := newTestProxy(t, &countingUpstream{}, func(o *Options) { o.Limits = set; o.RateLimitHeaders = on })
	client := keepAliveClient(t, 1)
	for i, want := range want {
		resp, _ := do(t, client, http.MethodGet, base+"/file/abc", nil)
		p, q := resp.Header.Values("RateLimit-Policy"), resp.Header.Values("RateLimit")
		switch {
		case resp.StatusCode != want.status:
			t.Errorf("headers %t, poll %d = %d, want %d", on, i+1, resp.StatusCode, want.status)
		case !on && (len(p) != 0 || len(q) != 0):
			t.Errorf("headers off, poll %d: RateLimit-Policy %q, RateLimit %q, want neither", i+1, p, q)
		case on && (len(p) != 1 || len(q) != 1):
			t.Errorf("headers on, poll %d: RateLimit-Policy %q, RateLimit %q, want one each", i+1, p, q)
		case on:
			pm, qm := policy.FindStringSubmatch(p[0]), quotaField.FindStringSubmatch(q[0])
			if pm == nil || qm == nil || pm[1] != "2" || pm[2] != want.w || qm[1] != want.r || qm[2] != want.t {
				t.Errorf("poll %d (%d): RateLimit-Policy %q, RateLimit %q, want q=2;w=%s and r=%s;t=%s", i+1, resp.StatusCode, p[0], q[0], want.w, want.r, want.t)
			}
		}
	}
	if resp, _ := do(t, client, http.MethodGet, base+"/version", nil); resp.Header.Get("RateLimit-Policy") != "" || resp.Header.Get("RateLimit") != "" {
		t.Errorf("headers %t: an unlimited route's answer has RateLimit-Policy %q, RateLimit %q, want neither", on,
			resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
	}
}
