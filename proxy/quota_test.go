package proxy

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestRateLimitHeaders: with RateLimitHeaders, a limited route's 200 and 503 carry
// RateLimit-Policy (the burst as q, the seconds to fill as w) and RateLimit (the tokens
// left as r, the seconds until full as t), following the bucket on a fake clock; an
// unlimited route's answers and every answer without the option carry neither.
func TestRateLimitHeaders(t *testing.T) {
	policy := regexp.MustCompile(`^"file_result";q=(\d+);w=(\d+)$`)
	quota := regexp.MustCompile(`^"file_result";r=(\d+);t=(\d+)$`)
	for _, on := range []bool{true, false} {
		clock := newFakeClock()
		set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.5, Burst: 2}}, clock)
		base, _ := newTestProxy(t, &countingUpstream{}, func(o *Options) { o.Limits = set; o.RateLimitHeaders = on })
		client := keepAliveClient(t, 1)
		for i, want := range []struct {
			status  int
			r, t, w string
		}{{200, "1", "2", "4"}, {200, "0", "4", "4"}, {503, "0", "4", "4"}} {
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
				pm, qm := policy.FindStringSubmatch(p[0]), quota.FindStringSubmatch(q[0])
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
}
