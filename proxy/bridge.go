package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// Bridge is what the proxy needs of the bridge (package bridge): a callback URL for
// each submission that brings none, the record of what Core accepted, and the answer to
// a poll of a data_id from what the bridge knows. *bridge.Bridge implements it.
type Bridge interface {
	Callback() (callbackURL, secret string, err error)
	Submitted(dataID, secret string, owner bridge.Owner)
	Poll(dataID string, owner bridge.Owner) bridge.Answer
	Observe(dataID string, owner bridge.Owner, body []byte, contentType string)
	Gone(dataID string, owner bridge.Owner)
	NotAsked(dataID string, owner bridge.Owner)
	CallbackPrefix() string
}

var _ Bridge = (*bridge.Bridge)(nil)

// maxSubmitAnswer bounds the part of Core's answer to POST /file that the proxy reads to
// learn the data_id: Core answers a small JSON object.
const maxSubmitAnswer = 1 << 20

// maxSharedPoll bounds Core's answer to a poll that the proxy buffers, to share it
// between concurrent polls of one data_id and to store it, with the bridge on. A larger
// answer is not relayed: the waiting clients get 502 and a warning is logged.
// It is the bridge's cap on a callback too (bridge.DefaultMaxCallbackBytes): a result of
// that size is beyond anything Core answers for a file.
const maxSharedPoll = 64 << 20

// submission is a POST /file the bridge registered a callback for.
type submission struct {
	secret string
	owner  bridge.Owner
}

// bridgeSubmission gives out, the request forwarded to Core for the POST /file in, the
// callback URL of the bridge's listener when it has no callbackurl of its own, and
// returns what to record once Core accepts it; nil for a submission that brings its own
// callbackurl, the client's business. It runs in the route's Rewrite, on the header as
// forwarded: httputil.ReverseProxy has removed the hop-by-hop fields, so a callbackurl
// the client names in Connection, which Core would never receive (RFC 9110, section
// 7.6.1), is none; and a submission the limit refuses is given no secret.
func (rt *route) bridgeSubmission(out, in *http.Request) *submission {
	if out.Header.Get("callbackurl") != "" {
		return nil
	}
	cb, secret, err := rt.bridge.Callback()
	if err != nil {
		rt.log.Warn("bridge: no callback URL; the submission is forwarded without one", "err", err.Error())
		return nil
	}
	out.Header["Callbackurl"] = []string{cb}
	return &submission{secret: secret, owner: rt.ownerOf(in)}
}

// askWholeAnswer makes h, the header of a request forwarded to Core whose answer the
// proxy reads (a bridged submission or poll, the webhook status it redacts) or shares
// between clients (a bridged poll), ask for Core's whole answer as it is: unencoded
// (Accept-Encoding: identity, RFC 9110, section 12.5.3) and with no Range (section
// 14.2) or precondition (section 13.1), each of which a server may ignore. Otherwise a
// gzip or a partial answer hides a callback secret from the redaction or a data_id
// from the bridge, and a 206, a 304 or a gzip answer to one client's poll reaches
// another, whose request asked none of it.
func askWholeAnswer(h http.Header) {
	for _, k := range [...]string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
		delete(h, k)
	}
	h["Accept-Encoding"] = identity
}

// identity is the Accept-Encoding value of askWholeAnswer.
var identity = []string{"identity"}

// recordSubmission is the submit route's ModifyResponse: when Core accepted a bridged
// submission, the data_id it answered is recorded as pending. Core's answer reaches the
// client unchanged.
func (rt *route) recordSubmission(resp *http.Response) error {
	ex := exchangeOf(resp.Request)
	if ex == nil || ex.sub == nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return fmt.Errorf("reading Core's answer to a submission: %w", err)
	}
	// What was read, then the rest of Core's answer (an answer over maxSubmitAnswer names
	// no data_id the bridge records, but reaches the client whole).
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(body), resp.Body), Closer: resp.Body}
	var answer struct {
		DataID string `json:"data_id"`
	}
	if len(body) > maxSubmitAnswer || json.Unmarshal(body, &answer) != nil || answer.DataID == "" {
		rt.log.Warn("bridge: Core's answer to a submission names no data_id; its result will be polled from Core")
		return nil
	}
	rt.bridge.Submitted(answer.DataID, ex.sub.secret, ex.sub.owner)
	return nil
}

// redactSecrets is the webhook_status route's ModifyResponse with the bridge on: Core's
// answer to GET /file/webhook/{data_id} shows the callback URL of a submission, and for a
// bridged one that URL holds the secret that makes a callback believed. The secret is
// replaced by "redacted" (as written, or with JSON's escaped slashes); the rest of the
// answer reaches the client unchanged, its Content-Length adjusted.
func (rt *route) redactSecrets(resp *http.Response) error {
	if ce := resp.Header.Get("Content-Encoding"); (ce != "" && !strings.EqualFold(ce, "identity")) || resp.StatusCode == http.StatusPartialContent {
		// askWholeAnswer asked for none of these: what cannot be read whole is not
		// relayed, rather than a secret.
		return fmt.Errorf("Core's webhook status came encoded (%q) or partial (%d): it cannot be redacted", ce, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSubmitAnswer+1))
	if err != nil {
		return fmt.Errorf("reading Core's webhook status: %w", err)
	}
	if len(body) > maxSubmitAnswer {
		// Not a webhook status of Core's size: nothing of it is relayed rather than a
		// secret.
		return fmt.Errorf("Core's webhook status is over %d bytes", maxSubmitAnswer)
	}
	resp.Body.Close()
	body = rt.secrets.ReplaceAll(body, []byte("${1}redacted"))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
	return nil
}

// secretsPattern matches the bridge's callback URLs up to their secret, as written and
// with JSON's escaped slashes; the secret is what follows the first group.
func secretsPattern(prefix string) *regexp.Regexp {
	escaped := strings.ReplaceAll(prefix, "/", `\/`)
	return regexp.MustCompile("(" + regexp.QuoteMeta(prefix) + "|" + regexp.QuoteMeta(escaped) + `)[0-9A-Za-z_-]+`)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// servePoll answers GET or HEAD /file/{data_id} with the bridge: a stored result or the
// pending answer without asking Core or taking a token; otherwise Core is asked under the
// route's limit, once for all the concurrent polls of the same data_id by the same owner,
// and its final answer is stored. A pending id is never answered with the limit answer:
// when Core may not be asked now, its pending answer stands.
func (rt *route) servePoll(rec *recorder, r *http.Request) {
	id := path.Base(r.URL.Path) // as the client spelt it; the routing path is lower-cased
	owner := rt.ownerOf(r)
	a := rt.bridge.Poll(id, owner)
	switch a.Source {
	case bridge.Stored, bridge.Pending:
		rt.polls[a.Source].Inc()
		rec.decision = a.Source.String()
		h := rec.Header()
		h["Date"] = dateValue(rec.start) // answered from memory (or Redis) at once
		h["Content-Type"] = rt.contentType(a.ContentType)
		h["Content-Length"] = rt.contentLength(len(a.Body))
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
	for {
		v, _, _ := rt.flight.Do(key, func() (any, error) { return rt.fetchPoll(r, id, owner), nil })
		f = v.(*fetched)
		// The poll that asked Core left (and, waiting for a token, gave its turn on):
		// a poll still here asks again itself.
		if !f.canceled || r.Context().Err() != nil {
			break
		}
	}
	// Core was not asked after all, or could not answer: its own limit (429, 503), a
	// failure (5xx, the proxy's 502 or 504), an answer cut short.
	unanswered := !f.decision.Pass() || f.canceled || f.aborted ||
		f.status >= 500 || f.status == http.StatusTooManyRequests
	if a.Source == bridge.Overdue && unanswered {
		rt.bridge.NotAsked(id, owner) // the next poll asks again
	}
	rec.decide(f.decision) // each poll counts the decision it shares
	switch {
	case f.canceled:
		abort(rec)
	case a.Source == bridge.Overdue && unanswered:
		// A file the client submitted: its pending answer, never an error or a 503.
		rt.polls[bridge.Pending].Inc()
		writeAnswer(rec, r, http.StatusOK, rt.contentType(a.ContentType), a.Body)
	case f.aborted:
		// Nothing of Core's answer was sent: the client learns it failed, and the
		// request is counted under the proxy's status, not as a client that left.
		writeError(rec, f.failStatus, f.failMsg)
	case !f.decision.Pass():
		rt.writeLimit(rec, f.decision)
	default:
		rt.polls[bridge.Miss].Inc()
		h := rec.Header()
		for k, v := range f.header {
			h[k] = v
		}
		// Core's trailers were read into the buffer's header, or lost: none follows
		// an answer sent whole with its length.
		delete(h, "Trailer")
		writeAnswer(rec, r, f.status, nil, f.body)
	}
}

// ownerOf returns the bridge's owner of r: the SHA-256 of its apikey. The last apikey
// seen and its owner are kept, since a client polls with one key in a loop and the
// hash would otherwise be computed anew for each poll.
func (rt *route) ownerOf(r *http.Request) bridge.Owner {
	key := apikeyOf(r)
	if m := rt.lastOwner.Load(); m != nil && m.apikey == key {
		return m.owner
	}
	m := &ownerMemo{apikey: key, owner: bridge.OwnerOf(key)}
	rt.lastOwner.Store(m)
	return m.owner
}

// ownerMemo is an apikey and its owner.
type ownerMemo struct {
	apikey string
	owner  bridge.Owner
}

// fetched is Core's answer to a poll, buffered to be shared by every poll waiting on it.
type fetched struct {
	decision limiter.Decision
	status   int
	header   http.Header
	body     []byte
	aborted  bool // Core's answer broke off, or was too large: each client gets failStatus
	canceled bool // the poll that asked left first: the others ask again
	// failStatus and failMsg answer the polls of an aborted fetch: nothing of Core's
	// answer was sent yet, so each client learns that it failed.
	failStatus int
	failMsg    string
}

// fetchPoll asks Core about id for owner, under the route's limit, and buffers its
// answer; a final 200 is stored by the bridge. It follows r's context: the client that
// asked leaving cancels its wait for a token (its turn given on, issue 9) or its
// request to Core, and the other polls waiting on it ask again.
func (rt *route) fetchPoll(r *http.Request, id string, owner bridge.Owner) (f *fetched) {
	ctx := r.Context()
	f = &fetched{decision: rt.acquire(ctx, r)}
	if f.decision.Outcome == limiter.Canceled {
		f.canceled = true
		return f
	}
	if !f.decision.Pass() {
		return f
	}
	buf := &bufferWriter{header: http.Header{}}
	ex := newExchange(buf, r, 0)
	ex.bodyDone = true
	defer ex.finish()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			f.aborted = true
			f.failStatus, f.failMsg = http.StatusBadGateway, "Core's answer broke off."
			if buf.tooLarge {
				rt.tooLarge(f)
				return
			}
			if ctx.Err() != nil { // the client that asked left mid-answer
				f.canceled = true
				rt.upstreamErrors[metrics.KindCanceled].get().Inc()
			} else if coreErr := ex.responseFailed(); isDeadline(coreErr) {
				rt.bodyTimeouts.WithLabelValues(rt.name, metrics.PeerCore).Inc()
				rt.upstreamErrors[metrics.KindTimeout].get().Inc()
				f.failStatus, f.failMsg = http.StatusGatewayTimeout, fmt.Sprintf("Core's answer made no progress for %v.", rt.bodyIdle)
			} else {
				rt.upstreamErrors[metrics.KindReset].get().Inc()
			}
		}
	}()
	rt.proxy.ServeHTTP(buf, r.WithContext(context.WithValue(ctx, exchangeKey{}, ex)))
	if ctx.Err() != nil {
		f.canceled = true
		return f
	}
	if buf.tooLarge { // when ReverseProxy returned rather than panicked on it
		rt.tooLarge(f)
		return f
	}
	f.status, f.header, f.body = buf.status, buf.header, buf.body.Bytes()
	if f.status == 0 {
		f.status = http.StatusOK
	}
	switch {
	case f.status == http.StatusOK && r.Method == http.MethodGet && r.URL.RawQuery == "" && !r.URL.ForceQuery:
		// Only the answer to the plain question is the result to store: one to a query
		// may be a part of it.
		rt.bridge.Observe(id, owner, f.body, f.header.Get("Content-Type"))
	case f.status == http.StatusNotFound && r.URL.RawQuery == "" && !r.URL.ForceQuery:
		rt.bridge.Gone(id, owner) // no callback will come for a scan Core lost
	}
	return f
}

// tooLarge marks f, whose answer from Core was over maxSharedPoll, as failed: 502 to
// each poll waiting on it.
func (rt *route) tooLarge(f *fetched) {
	f.aborted = true
	f.failStatus, f.failMsg = http.StatusBadGateway, fmt.Sprintf("Core's answer is larger than the proxy relays (%d MiB).", maxSharedPoll>>20)
	rt.log.Warn("bridge: Core's answer to a poll is larger than the proxy relays; the polls waiting on it get 502", "limit_bytes", maxSharedPoll)
}

// bufferWriter is the http.ResponseWriter a shared poll's answer is buffered in, up to
// maxSharedPoll bytes.
type bufferWriter struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	tooLarge bool
}

func (b *bufferWriter) Header() http.Header { return b.header }

func (b *bufferWriter) WriteHeader(code int) {
	if b.status == 0 && code >= 200 {
		b.status = code
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	if b.body.Len()+len(p) > maxSharedPoll {
		b.tooLarge = true
		return 0, fmt.Errorf("poll answer over %d bytes", maxSharedPoll)
	}
	return b.body.Write(p)
}

// Flush is a no-op: the answer is sent once buffered.
func (b *bufferWriter) Flush() {}

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

// contentLength is the Content-Length header value for n bytes. The value last used
// is kept: a client polling a finished scan gets the same answer, of the same length,
// each time.
func (rt *route) contentLength(n int) []string {
	if m := rt.lastCL.Load(); m != nil && m.n == n {
		return m.v
	}
	m := &lengthMemo{n: n, v: []string{strconv.Itoa(n)}}
	rt.lastCL.Store(m)
	return m.v
}

// lengthMemo is a body length and its Content-Length header value.
type lengthMemo struct {
	n int
	v []string
}

// contentType is the Content-Type header value of a bridge answer: Core's own, or JSON.
// The value last used is kept (net/http never modifies a header value): Core answers
// results in one type, and answering from the store then allocates no header value.
func (rt *route) contentType(ct string) []string {
	if ct == "" {
		return jsonContentType
	}
	if v := rt.lastCT.Load(); v != nil && (*v)[0] == ct {
		return *v
	}
	v := []string{ct}
	rt.lastCT.Store(&v)
	return v
}
