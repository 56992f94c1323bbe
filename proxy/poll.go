package proxy

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// DefaultPollBufferBytes is Options.PollBufferBytes' default, in bytes.
const DefaultPollBufferBytes = 64 << 20

// maxPollError bounds Core's answer to a bridged poll that is not a 200, read whole
// whatever the budget (Core's errors are small JSON objects); a larger one gets 502.
const maxPollError = 64 << 10

// bridgedID returns the data_id of a poll the bridge answers: /file/{data_id} spelt as
// Core's API writes it. Another spelling that routes to file_result (/FILE/{id}, //file/{id},
// /file/{id}/, an escape) is forwarded as with the bridge off: Core on Linux answers 404 to
// most, which must not read as Core losing the scan.
func bridgedID(u *url.URL) (string, bool) {
	id, ok := strings.CutPrefix(u.Path, "/file/")
	if !ok || id == "" || u.RawPath != "" || strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}

// servePoll answers a poll with the bridge: a stored result or the pending answer without
// asking Core or taking a token; otherwise Core is asked under the route's limit, once for
// the concurrent polls of one data_id by one owner, and its final answer stored. A pending
// id never gets the limit answer: its pending answer stands.
func (rt *route) servePoll(rec *recorder, r *http.Request, id string) {
	owner := rt.ownerOf(r)
	a := rt.bridged.bridge.Poll(id, owner)
	if a.Release != nil {
		defer a.Release() // a result read from Redis: its bytes held until written
	}
	switch a.Source {
	case bridge.Stored, bridge.Pending:
		rt.metrics.BridgePoll(a.Source.String())
		rec.decision = a.Source.String()
		rt.quotaHeaders(rec.Header(), limiter.Decision{}) // no token taken: the policy only
		h, ah := rec.Header(), rt.answerHeader(a.ContentType, len(a.Body))
		h["Content-Type"], h["Content-Length"] = ah.ct, ah.length
		rec.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = rec.Write(a.Body)
		}
		return
	}
	// Polls share Core's answer only when they asked the same question, query included.
	key := r.Method + " " + id + " " + string(owner[:]) + "?" + r.URL.RawQuery
	var f *fetched
	held := false       // this poll holds f's buffered answer (bufferHold)
	wait := r.Context() // the wait for a token this poll may have, should it ask Core itself
	for {
		v, _, _ := rt.bridged.flight.Do(key, func() (any, error) { return rt.fetchPoll(rec, r, wait, id, owner), nil })
		f = v.(*fetched)
		if f.leader == rec && f.streamed {
			rec.decide(f.decision)
			rt.metrics.BridgePoll(bridge.Miss.String())
			if f.cut {
				panic(http.ErrAbortHandler) // counted by ServeHTTP (countCut)
			}
			return
		}
		held = f.hold != nil && (f.leader == rec || f.hold.take())
		// The poll that asked Core left, or took Core's answer alone, or the budget cannot hold
		// it once more: a poll still here asks again, within what is left of its MaxWait.
		again := f.canceled || f.streamed || (f.hold != nil && !held)
		if !again || r.Context().Err() != nil {
			break
		}
		wait = rt.waitLeft(r.Context(), rec.start)
	}
	if held {
		defer f.hold.release()
	}
	// Core was not asked, or could not answer (its limit, a failure, a cut answer).
	unanswered := !f.decision.Pass() || f.canceled || f.aborted ||
		f.status >= 500 || f.status == http.StatusTooManyRequests
	if a.Source == bridge.Overdue && unanswered {
		rt.bridged.bridge.NotAsked(id, owner) // the next poll asks again
	}
	rec.decide(f.decision) // each poll counts the decision it shares
	rt.quotaHeaders(rec.Header(), f.decision)
	switch {
	case f.canceled || f.streamed || (f.hold != nil && !held):
		abort(rec) // this client left while waiting
	case a.Source == bridge.Overdue && unanswered:
		// A file the client submitted: its pending answer, never an error or a 503.
		rt.metrics.BridgePoll(bridge.Pending.String())
		writeAnswer(rec, r, http.StatusOK, contentType(a.ContentType), a.Body)
	case f.aborted:
		// Nothing was sent yet: the client learns it failed, counted under the proxy's status.
		writeError(rec, f.failStatus, f.failMsg)
	case !f.decision.Pass():
		rt.limit.write(rec, f.decision)
	default:
		rt.metrics.BridgePoll(bridge.Miss.String())
		h := rec.Header()
		for k, v := range f.header {
			h[k] = v
		}
		// No trailers after an answer sent whole with its length.
		delete(h, "Trailer")
		writeAnswer(rec, r, f.status, nil, f.body)
	}
}

// waitLeft returns ctx with the wait for a token bounded by what is left of the route's
// MaxWait for a request that arrived at start (limiter.WithMaxWait).
func (rt *route) waitLeft(ctx context.Context, start time.Time) context.Context {
	held := rt.limiter.Load()
	if held.l == nil {
		return ctx
	}
	return limiter.WithMaxWait(ctx, held.l.Limit().MaxWait-time.Since(start))
}

// fetched is Core's answer to a poll: buffered for every poll waiting on it, or, past the
// budget, sent to the poll that asked as it came.
type fetched struct {
	leader     *recorder // the poll that asked Core
	decision   limiter.Decision
	status     int
	header     http.Header
	body       []byte
	hold       *bufferHold // body's charge to the budget; nil when nothing was buffered
	aborted    bool        // Core's answer broke off, or was too large: each client gets failStatus
	canceled   bool        // the poll that asked left first: the others ask again
	streamed   bool        // the answer went to leader's client as it came: the others ask again
	cut        bool        // the streamed answer broke off: leader's connection is cut
	failStatus int
	failMsg    string
}

// fetchPoll asks Core about id for owner under the route's limit (the token under wait) and
// buffers its answer within the budget (Options.PollBufferBytes); a final 200 is stored. A
// 200 over the budget goes to rec as it comes, stored nowhere. The asking client leaving
// cancels its wait (its turn given on) or its request, and the others ask again.
func (rt *route) fetchPoll(rec *recorder, r *http.Request, wait context.Context, id string, owner bridge.Owner) (f *fetched) {
	ctx := r.Context()
	f = &fetched{leader: rec, decision: rt.acquire(wait, r)}
	if f.decision.Outcome == limiter.Canceled {
		f.canceled = true
		return f
	}
	if !f.decision.Pass() {
		return f
	}
	buf := &bufferWriter{header: http.Header{}, budget: rt.bridged.buffers, leader: rec}
	ex := newExchange(buf, r, 0)
	ex.bodyDone = true
	ex.shared = true
	buf.ex = ex
	defer ex.finish()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			buf.release()
			if buf.streaming {
				f.streamed, f.cut = true, true // counted by the leader's ServeHTTP
				return
			}
			f.aborted = true
			f.failStatus, f.failMsg = http.StatusBadGateway, "Core's answer broke off."
			if buf.tooLarge {
				rt.tooLarge(f)
				return
			}
			if ctx.Err() != nil { // the client that asked left mid-answer
				f.canceled = true
				rt.metrics.UpstreamError(metrics.KindCanceled)
			} else if coreErr := ex.responseFailed(); isDeadline(coreErr) {
				rt.metrics.BodyTimeout(metrics.PeerCore)
				rt.metrics.UpstreamError(metrics.KindTimeout)
				f.failStatus, f.failMsg = http.StatusGatewayTimeout, fmt.Sprintf("Core's answer made no progress for %v.", rt.bodyIdle)
			} else {
				rt.metrics.UpstreamError(metrics.KindReset)
			}
		}
	}()
	rt.proxy.ServeHTTP(buf, r.WithContext(ex.trace(context.WithValue(ctx, exchangeKey{}, ex))))
	if buf.streaming {
		f.streamed = true
		return f
	}
	if ctx.Err() != nil {
		buf.release()
		f.canceled = true
		return f
	}
	if buf.tooLarge { // when ReverseProxy returned rather than panicked on it
		buf.release()
		rt.tooLarge(f)
		return f
	}
	f.status, f.header, f.body = buf.status, buf.final, buf.body.Bytes()
	f.hold = &bufferHold{budget: rt.bridged.buffers, n: buf.charged, charged: buf.charged > 0, polls: 1}
	if f.status == 0 { // no status and no body written: not from ReverseProxy
		f.status, f.header = http.StatusOK, buf.header
	}
	switch {
	case f.status == http.StatusOK && r.Method == http.MethodGet && r.URL.RawQuery == "" && !r.URL.ForceQuery:
		// Only the answer to the plain question is the result; a query's may be a part.
		rt.bridged.bridge.Observe(id, owner, f.body, f.header.Get("Content-Type"))
	case f.status == http.StatusNotFound && r.URL.RawQuery == "" && !r.URL.ForceQuery:
		rt.bridged.bridge.Gone(id, owner) // no callback will come for a scan Core lost
	}
	return f
}

// tooLarge fails f, Core's non-200 answer over maxPollError: 502 to each poll on it.
func (rt *route) tooLarge(f *fetched) {
	f.aborted = true
	f.failStatus, f.failMsg = http.StatusBadGateway, fmt.Sprintf("Core's error answer is larger than the proxy reads (%d KiB).", maxPollError>>10)
	rt.log.Warn("bridge: Core's error answer to a poll is larger than the proxy reads; the polls waiting on it get 502", "limit_bytes", maxPollError)
}

// bufferHold is a buffered answer's charge to the budget, held until the last poll sharing
// it has written it. Safe for concurrent use.
type bufferHold struct {
	budget  *bridge.Budget
	n       int64 // the answer's bytes
	mu      sync.Mutex
	polls   int  // the polls writing it, the one that asked Core among them until it has
	charged bool // the budget holds n for it: while a poll holds it
}

// take makes one more poll a holder; after every other let go it charges the budget anew,
// and false means the budget cannot: the poll asks Core itself.
func (h *bufferHold) take() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.polls == 0 && !h.charged && h.n > 0 {
		if !h.budget.TryAcquire(h.n) {
			return false
		}
		h.charged = true
	}
	h.polls++
	return true
}

// release lets the answer go for one poll; the last gives the bytes back.
func (h *bufferHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.polls--
	if h.polls == 0 && h.charged {
		h.budget.Release(h.n)
		h.charged = false
	}
}

// bufferWriter buffers Core's answer to a shared poll, each piece charged to budget. A 200
// the budget cannot take goes to the leader's writer instead, relayed like any answer of
// Core (ex then records its writes). Another status is buffered up to maxPollError.
type bufferWriter struct {
	header    http.Header // what ReverseProxy writes: Core's header, then its trailers
	final     http.Header // Core's header as it was at WriteHeader: the answer's
	status    int
	body      bytes.Buffer
	budget    *bridge.Budget
	charged   int64 // the bytes of body the budget took
	leader    *recorder
	ex        *exchange
	streaming bool // the answer goes to leader
	tooLarge  bool
}

func (b *bufferWriter) Header() http.Header {
	if b.streaming {
		return b.leader.Header() // Core's trailers, after the body
	}
	return b.header
}

func (b *bufferWriter) WriteHeader(code int) {
	if b.status == 0 && code >= 200 {
		b.status = code
		b.snapshot()
	}
}

// snapshot keeps Core's header as at the status: the trailers ReverseProxy adds after the
// body are not header fields (RFC 9110, section 6.5.1).
func (b *bufferWriter) snapshot() {
	b.final, b.header = b.header, http.Header{}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.streaming {
		return b.leader.Write(p)
	}
	if b.status == 0 {
		b.status = http.StatusOK
		b.snapshot()
	}
	if b.status != http.StatusOK {
		if b.body.Len()+len(p) > maxPollError {
			b.tooLarge = true
			return 0, fmt.Errorf("poll answer over %d bytes", maxPollError)
		}
		return b.body.Write(p)
	}
	if !b.budget.TryAcquire(int64(len(p))) {
		if err := b.stream(); err != nil {
			return 0, err
		}
		return b.leader.Write(p)
	}
	b.charged += int64(len(p))
	return b.body.Write(p)
}

// stream sends what was buffered to the leader and the rest as it comes.
func (b *bufferWriter) stream() error {
	b.streaming = true
	b.leader.ex = b.ex // Core's answer, relayed: each write bounded, a cut classified
	h := b.leader.Header()
	for k, v := range b.final {
		h[k] = v
	}
	b.leader.WriteHeader(b.status)
	_, err := b.leader.Write(b.body.Bytes())
	b.body = bytes.Buffer{}
	b.release()
	return err
}

func (b *bufferWriter) release() {
	if b.charged > 0 {
		b.budget.Release(b.charged)
		b.charged = 0
	}
}

// Flush flushes the leader's client once the answer goes there.
func (b *bufferWriter) Flush() {
	if b.streaming {
		_ = http.NewResponseController(b.leader).Flush()
	}
}

// writeAnswer writes status and body with its Content-Length (none for HEAD), and the
// Content-Type ct when not nil.
func writeAnswer(w http.ResponseWriter, r *http.Request, status int, ct []string, body []byte) {
	h := w.Header()
	if ct != nil {
		h["Content-Type"] = ct
	}
	noSniff(h)
	if len(body) > 0 || r.Method != http.MethodHead { // Core's answer to HEAD keeps its length
		h["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// contentType is the Content-Type of a bridge answer: Core's own, or JSON.
func contentType(ct string) []string {
	if ct == "" {
		return jsonContentType
	}
	return []string{ct}
}

// answerHeader is the Content-Type and Content-Length of the bridge's last answer on a
// route, kept: a finished scan is polled in a loop for the same answer.
type answerHeader struct {
	contentType string
	n           int
	ct, length  []string
}

func (rt *route) answerHeader(ct string, n int) *answerHeader {
	if h := rt.bridged.lastAnswer.Load(); h != nil && h.contentType == ct && h.n == n {
		return h
	}
	h := &answerHeader{contentType: ct, n: n, ct: contentType(ct), length: []string{strconv.Itoa(n)}}
	rt.bridged.lastAnswer.Store(h)
	return h
}
