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

// DefaultPollBufferBytes is Options.PollBufferBytes' default: 64 MiB of Core's answers
// to bridged polls held at once.
const DefaultPollBufferBytes = 64 << 20

// maxPollError bounds Core's answer to a bridged poll that is not a 200 (an error, its
// own 503, a 404 for a scan it lost), which the proxy reads whole whatever the budget
// to decide what the polls waiting on it get: Core answers these with a small JSON
// object. A larger one gets 502. 64 KiB: each poll asking Core may hold this much,
// outside the budget.
const maxPollError = 64 << 10

// bridgedID returns the data_id of a poll the bridge answers: GET or HEAD
// /file/{data_id} spelt as Core's API writes it (no escape, no empty segment, no
// trailing slash; the route's name in lower case). Another spelling that routes to
// file_result (/FILE/{id}, //file/{id}, /file/{id}/, a percent-escape) is Core's to
// read, and Core on Linux answers 404 to most: it is forwarded as with the bridge off,
// and the bridge neither answers it from what it knows nor learns from Core's answer
// (a 404 to /file/{id}/ is not Core losing the scan of {id}).
func bridgedID(u *url.URL) (string, bool) {
	id, ok := strings.CutPrefix(u.Path, "/file/")
	if !ok || id == "" || u.RawPath != "" || strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}

// servePoll answers GET or HEAD /file/{id} with the bridge: a stored result or the
// pending answer without asking Core or taking a token; otherwise Core is asked under the
// route's limit, once for all the concurrent polls of the same data_id by the same owner,
// and its final answer is stored. A pending id is never answered with the limit answer:
// when Core may not be asked now, its pending answer stands.
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
		h, ah := rec.Header(), rt.answerHeader(a.ContentType, len(a.Body))
		h["Content-Type"], h["Content-Length"] = ah.ct, ah.length
		rec.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = rec.Write(a.Body)
		}
		return
	}
	// Polls share Core's answer only when they asked the same: a query (a page of an
	// archive's files, a client's cache-buster) may change it. askWholeAnswer takes the
	// header fields that could change it away from the question.
	key := r.Method + " " + id + " " + string(owner[:]) + "?" + r.URL.RawQuery
	var f *fetched
	held := false       // this poll holds f's buffered answer (bufferHold)
	wait := r.Context() // the wait for a token this poll may have, should it ask Core itself
	for {
		v, _, _ := rt.bridged.flight.Do(key, func() (any, error) { return rt.fetchPoll(rec, r, wait, id, owner), nil })
		f = v.(*fetched)
		if f.leader == rec && f.streamed {
			// Core's answer went to this client as it came.
			rec.decide(f.decision)
			rt.metrics.BridgePoll(bridge.Miss.String())
			if f.cut {
				panic(http.ErrAbortHandler) // counted by ServeHTTP (countCut)
			}
			return
		}
		held = f.hold != nil && (f.leader == rec || f.hold.take())
		// The poll that asked Core left (and, waiting for a token, gave its turn on),
		// or took Core's answer alone, or the budget cannot hold the answer for one
		// more: a poll still here asks again itself.
		again := f.canceled || f.streamed || (f.hold != nil && !held)
		if !again || r.Context().Err() != nil {
			break
		}
		// What is left of this poll's MaxWait, not a new one: it may have waited on
		// the other poll's token for most of it.
		wait = rt.waitLeft(r.Context(), rec.start)
	}
	if held {
		defer f.hold.release()
	}
	// Core was not asked after all, or could not answer: its own limit (429, 503), a
	// failure (5xx, the proxy's 502 or 504), an answer cut short.
	unanswered := !f.decision.Pass() || f.canceled || f.aborted ||
		f.status >= 500 || f.status == http.StatusTooManyRequests
	if a.Source == bridge.Overdue && unanswered {
		rt.bridged.bridge.NotAsked(id, owner) // the next poll asks again
	}
	rec.decide(f.decision) // each poll counts the decision it shares
	switch {
	case f.canceled || f.streamed || (f.hold != nil && !held):
		abort(rec) // this client left while waiting
	case a.Source == bridge.Overdue && unanswered:
		// A file the client submitted: its pending answer, never an error or a 503.
		rt.metrics.BridgePoll(bridge.Pending.String())
		writeAnswer(rec, r, http.StatusOK, contentType(a.ContentType), a.Body)
	case f.aborted:
		// Nothing of Core's answer was sent: the client learns it failed, and the
		// request is counted under the proxy's status, not as a client that left.
		writeError(rec, f.failStatus, f.failMsg)
	case !f.decision.Pass():
		rt.limit.write(rec, f.decision)
	default:
		rt.metrics.BridgePoll(bridge.Miss.String())
		h := rec.Header()
		for k, v := range f.header {
			h[k] = v
		}
		// Core's trailers are not relayed: none follows an answer sent whole with
		// its length.
		delete(h, "Trailer")
		writeAnswer(rec, r, f.status, nil, f.body)
	}
}

// waitLeft returns ctx bounding the wait for a token (limiter.WithMaxWait) to what is
// left of the route's MaxWait for a request that arrived at start: none when it is
// spent, the whole of it for one that just came.
func (rt *route) waitLeft(ctx context.Context, start time.Time) context.Context {
	held := rt.limiter.Load()
	if held.l == nil {
		return ctx
	}
	return limiter.WithMaxWait(ctx, held.l.Limit().MaxWait-time.Since(start))
}

// fetched is Core's answer to a poll: buffered to be shared by every poll waiting on it,
// or, when the budget could not hold it, sent to the poll that asked as it came.
type fetched struct {
	leader   *recorder // the poll that asked Core
	decision limiter.Decision
	status   int
	header   http.Header
	body     []byte
	hold     *bufferHold // body's charge to the budget; nil when nothing was buffered
	aborted  bool        // Core's answer broke off, or was too large: each client gets failStatus
	canceled bool        // the poll that asked left first: the others ask again
	streamed bool        // the answer went to leader's client as it came: the others ask again
	cut      bool        // the streamed answer broke off: leader's connection is cut
	// failStatus and failMsg answer the polls of an aborted fetch: nothing of Core's
	// answer was sent yet, so each client learns that it failed.
	failStatus int
	failMsg    string
}

// fetchPoll asks Core about id for owner, under the route's limit, for the poll rec
// answers, and buffers its answer within the route's budget (Options.PollBufferBytes);
// a final 200 is stored by the bridge. A 200 that does not fit the budget goes to rec
// as it comes instead, stored nowhere, so that the polls of large results held by slow
// clients cannot take the proxy's memory. It follows r's context: the client that asked
// leaving cancels its wait for a token (its turn given on, issue 9) or its request to
// Core, and the other polls waiting on it ask again. The token is asked for under wait,
// r's context or one that bounds the wait further (waitLeft).
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
		// Only the answer to the plain question is the result to store: one to a query
		// may be a part of it.
		rt.bridged.bridge.Observe(id, owner, f.body, f.header.Get("Content-Type"))
	case f.status == http.StatusNotFound && r.URL.RawQuery == "" && !r.URL.ForceQuery:
		rt.bridged.bridge.Gone(id, owner) // no callback will come for a scan Core lost
	}
	return f
}

// tooLarge marks f, whose answer from Core was not a 200 and over maxPollError, as
// failed: 502 to each poll waiting on it.
func (rt *route) tooLarge(f *fetched) {
	f.aborted = true
	f.failStatus, f.failMsg = http.StatusBadGateway, fmt.Sprintf("Core's error answer is larger than the proxy reads (%d KiB).", maxPollError>>10)
	rt.log.Warn("bridge: Core's error answer to a poll is larger than the proxy reads; the polls waiting on it get 502", "limit_bytes", maxPollError)
}

// bufferHold is the charge of a buffered answer to the route's budget of poll buffers,
// from its reading until the last poll sharing it has written it: slow clients reading
// shared answers hold the budget, not more memory. Safe for concurrent use.
type bufferHold struct {
	budget  *bridge.Budget
	n       int64 // the answer's bytes
	mu      sync.Mutex
	polls   int  // the polls writing it, the one that asked Core among them until it has
	charged bool // the budget holds n for it: while a poll holds it
}

// take makes one more poll a holder of the answer. A poll that comes once every other
// has let it go charges it anew, and when the budget cannot take it, take returns false:
// the poll asks Core itself, the answer then sent to it as it comes when still too
// large for the budget.
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

// release lets the answer go for one poll; the last one gives its bytes back to the
// budget.
func (h *bufferHold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.polls--
	if h.polls == 0 && h.charged {
		h.budget.Release(h.n)
		h.charged = false
	}
}

// bufferWriter is the http.ResponseWriter Core's answer to a shared poll is buffered in,
// each piece charged to budget. A 200 that the budget cannot take turns it into the
// leader's own writer: the bytes buffered so far are written to leader, given back to
// the budget, and the rest goes to leader as it comes, relayed like any answer of Core
// (ex is the exchange the leader's writes then record). Another status is buffered
// whatever the budget, up to maxPollError bytes.
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

// snapshot keeps Core's header as it is at the status: the trailer fields ReverseProxy
// adds to the header after the body are not header fields (RFC 9110, section 6.5.1),
// and an answer sent whole has no trailer section.
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

// stream sends what was buffered to the leader, with Core's header, and makes b write
// the rest there as it comes.
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

// release gives the bytes buffered back to the budget.
func (b *bufferWriter) release() {
	if b.charged > 0 {
		b.budget.Release(b.charged)
		b.charged = 0
	}
}

// Flush sends what was written to the leader's client, once the answer goes there;
// otherwise the answer is sent once buffered.
func (b *bufferWriter) Flush() {
	if b.streaming {
		_ = http.NewResponseController(b.leader).Flush()
	}
}

// writeAnswer writes status and body (its Content-Length set; no body for HEAD), with
// the Content-Type ct when not nil.
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
// route, kept: a client polls a finished scan in a loop for the same answer.
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
