package proxy

import (
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
