package proxy

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// limitAnswer is a route's answer to a request its bucket refused: the limit status
// (503, or 429: Options.LimitStatus) with Retry-After and a body in Core's format,
// rendered once, since clients retry it at once and it must stay cheap. Safe for
// concurrent use.
type limitAnswer struct {
	status int
	// The bodies for the route's bucket and for a client's share, and their
	// Content-Length header values.
	body, clientBody     []byte
	length, clientLength []string
	lastRetry            atomic.Pointer[retryMemo] // see retryAfterValue
}

// newLimitAnswer renders the limit answers of the route name, of status.
func newLimitAnswer(name string, status int) *limitAnswer {
	a := &limitAnswer{
		status:     status,
		body:       errorBody("Too many requests for route " + name + ". Try again later."),
		clientBody: errorBody("Too many requests for this client on route " + name + ". Try again later."),
	}
	a.length = []string{strconv.Itoa(len(a.body))}
	a.clientLength = []string{strconv.Itoa(len(a.clientBody))}
	return a
}

// write answers a request the bucket rejected, d its decision: the limit status with
// Retry-After (RFC 9110, section 10.2.3: whole seconds, rounded up) and a Core-style
// body.
func (a *limitAnswer) write(w *recorder, d limiter.Decision) {
	h := w.Header()
	if d.Waited == 0 {
		h["Date"] = dateValue(w.start) // decided on arrival: start is now
	}
	h["Retry-After"] = a.retryAfterValue(d.RetryAfterSeconds())
	body, length := a.body, a.length
	if d.Outcome == limiter.RejectedClient {
		body, length = a.clientBody, a.clientLength
	}
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = length
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(a.status)
	_, _ = w.Write(body)
}

// retryAfterValues are the Retry-After header values of 0 to 300 seconds, built once:
// net/http never modifies a header's value slice, so every limit answer may share one.
var retryAfterValues = func() [][]string {
	v := make([][]string, 301)
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

// retryAfterValue returns the Retry-After header value of s seconds: from the table
// up to 300 s, else from the route's memo of its last longer value (a route with a rate
// under 1/300 s answers the same value a whole second long), else a new one.
func (a *limitAnswer) retryAfterValue(s int) []string {
	if s >= 0 && s < len(retryAfterValues) {
		return retryAfterValues[s]
	}
	if m := a.lastRetry.Load(); m != nil && m.s == s {
		return m.v
	}
	v := []string{strconv.Itoa(s)}
	a.lastRetry.Store(&retryMemo{s, v})
	return v
}

// retryMemo is a Retry-After value of s seconds, rendered.
type retryMemo struct {
	s int
	v []string
}

// lastDate is the Date header value of the latest second dateValue was asked for.
var lastDate atomic.Pointer[dateMemo]

// dateMemo is the Date header value of the second sec (Unix time).
type dateMemo struct {
	sec int64
	v   []string
}

// dateValue returns the Date header value of t (RFC 9110, section 6.6.1: IMF-fixdate,
// whole seconds), for an answer the proxy gives itself within moments of t. net/http
// would read the clock and format the date for every answer without one; the proxy
// has read the clock already (the request's start), and formats the value once a
// second. Safe for concurrent use: answers in the same second share one value, which
// net/http never modifies.
func dateValue(t time.Time) []string {
	sec := t.Unix()
	if m := lastDate.Load(); m != nil && m.sec == sec {
		return m.v
	}
	v := []string{t.UTC().Format(http.TimeFormat)}
	lastDate.Store(&dateMemo{sec, v})
	return v
}
