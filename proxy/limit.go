package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/mdproxy/mdproxy/limiter"
)

// limitAnswer is a route's answer to a request its bucket refused: the limit status
// (Options.LimitStatus) with Retry-After and a body in Core's format, rendered once.
// Safe for concurrent use.
type limitAnswer struct {
	status               int
	body, clientBody     []byte   // the route's bucket refused; the client's share refused
	length, clientLength []string // their Content-Length values
	lastRetry            atomic.Pointer[retryMemo]
}

func newLimitAnswer(name string, status int) *limitAnswer {
	a := &limitAnswer{
		status:     status,
		body:       errorBody("Too many requests for route " + name + ". Try again later."),
		clientBody: errorBody("Too many requests for this client on route " + name + ". Try again later."),
	}
	a.length, a.clientLength = []string{strconv.Itoa(len(a.body))}, []string{strconv.Itoa(len(a.clientBody))}
	return a
}

// write answers a request the bucket refused, d its decision, with Retry-After in whole
// seconds rounded up (RFC 9110, section 10.2.3).
func (a *limitAnswer) write(w http.ResponseWriter, d limiter.Decision) {
	h := w.Header()
	h["Retry-After"] = a.retryAfter(d.RetryAfterSeconds())
	body, length := a.body, a.length
	if d.Outcome == limiter.RejectedClient {
		body, length = a.clientBody, a.clientLength
	}
	h["Content-Type"], h["Content-Length"], h["X-Content-Type-Options"] = jsonContentType, length, nosniff
	w.WriteHeader(a.status)
	_, _ = w.Write(body)
}

// retryAfter returns the Retry-After value of s seconds. The last one is kept: clients
// retry at once and are answered the same value for a second.
func (a *limitAnswer) retryAfter(s int) []string {
	if m := a.lastRetry.Load(); m != nil && m.s == s {
		return m.v
	}
	m := &retryMemo{s, []string{strconv.Itoa(s)}}
	a.lastRetry.Store(m)
	return m.v
}

type retryMemo struct {
	s int
	v []string
}

// quotaHeaders sets, when the route has a rate and Options.RateLimitHeaders is on, the
// RateLimit-Policy and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-10
// (structured fields, RFC 9651) on h, for the limit in force: the policy named after the
// route, its quota q the bucket's burst and its window w the whole seconds the bucket
// takes to fill from empty; and, when d knows the bucket's quota (limiter.Decision
// QuotaKnown), its remaining tokens r and the whole seconds t until it is full. A
// request's answer carries them whether it was let through or refused.
func (rt *route) quotaHeaders(h http.Header, d limiter.Decision) {
	if !rt.rateLimitHeaders {
		return
	}
	held := rt.limiter.Load()
	if held.l == nil {
		return
	}
	lim := held.l.Limit()
	if lim.Rate <= 0 {
		return
	}
	name := strconv.Quote(rt.name) // a route name is a valid sf-string as it is quoted
	window := max(int64(math.Ceil(float64(lim.Burst)/lim.Rate)), 1)
	h["Ratelimit-Policy"] = []string{fmt.Sprintf("%s;q=%d;w=%d", name, lim.Burst, window)}
	if d.QuotaKnown {
		h["Ratelimit"] = []string{fmt.Sprintf("%s;r=%d;t=%d", name, d.Remaining, int64(math.Ceil(d.Full.Seconds())))}
	}
}
