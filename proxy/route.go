package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// route is one route of Core's API, built once by New: its bucket, its reverse proxy,
// its metrics and, for the routes the bridge serves, the bridge's side, so that serving
// a request looks nothing up by name.
type route struct {
	name string
	// limiter is the route's Limiter now (nil inside: unlimited). SetLimits swaps it;
	// a request loads it once and keeps it to the end, a wait for a token included.
	limiter    atomic.Pointer[routeLimiter]
	submit     bool                   // POST /file: Content-Length required
	handler    http.Handler           // serve inside the accounting middleware (account)
	proxy      *httputil.ReverseProxy // forwards to Core
	metrics    *metrics.Route
	limit      *limitAnswer
	clientKeys clientKeys
	bridged    *bridged // the bridge's side of the route; nil: the bridge has none
	// upstreamTimeout is quoted in the 504 body (the Transport enforces it); bodyIdle is
	// Options.BodyIdleTimeout, 0: off.
	upstreamTimeout, bodyIdle time.Duration
	log                       *slog.Logger
	logged                    logSample // the upstream errors logged, at most once a second
}

// newRoute returns the route name with opts' settings, forwarding through proxy (its
// Transport, ErrorHandler and Rewrite are set here).
func newRoute(name string, opts Options, rp *httputil.ReverseProxy) *route {
	rt := &route{
		name:            name,
		submit:          name == "submit",
		proxy:           rp,
		metrics:         opts.Metrics.Route(name),
		limit:           newLimitAnswer(name, opts.LimitStatus),
		clientKeys:      clientKeys{trusted: opts.TrustedProxies, ipv4: opts.ClientIPv4Prefix, ipv6: opts.ClientIPv6Prefix},
		upstreamTimeout: opts.UpstreamTimeout,
		bodyIdle:        opts.BodyIdleTimeout,
		log:             opts.Logger.With("route", name),
	}
	rt.handler = rt.account(http.HandlerFunc(rt.serve))
	rt.setLimiter(opts.Limits.Limiter(name))
	rp.Rewrite = rt.rewrite(opts)
	rp.Transport = timedTransport{next: opts.Transport, m: rt.metrics}
	rp.ErrorHandler = rt.upstreamError
	rp.BufferPool = copyBuffers
	rp.ErrorLog = slog.NewLogLogger(rt.log.Handler(), slog.LevelWarn)
	return rt
}

// routeLimiter holds a route's Limiter (nil: unlimited) for an atomic swap, and
// whether its limit has a per-client share: read once when the Limiter is put in place
// (a Limiter's limit does not change; a new limit comes as a new Limiter), since asking
// on every request cost about 1% of a core under a poll storm.
type routeLimiter struct {
	l         limiter.Limiter
	perClient bool
}

// setLimiter makes l (nil: unlimited) the route's Limiter for the requests that start
// from now on, and sets the limit gauges to its limit (metrics.Route.SetLimit).
func (rt *route) setLimiter(l limiter.Limiter) {
	var lim limiter.Limit
	if l != nil {
		lim = l.Limit()
	}
	rt.limiter.Store(&routeLimiter{l: l, perClient: lim.ClientLimit > 0})
	rt.metrics.SetLimit(l != nil, lim.Rate, lim.Burst, lim.MaxWait)
}

// ServeHTTP serves r on the route, counted (account).
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.handler.ServeHTTP(w, r) }

// account is the route's accounting middleware: next writes to a *recorder (the
// client's writer, each write bounded by the body idle timeout) while the request is
// counted in flight; once next returns, or panics, the request is counted (finish):
// a panic with http.ErrAbortHandler that next did not count itself (abort) is a cut
// answer, counted by why (countCut), and goes on to net/http. Once a forwarded
// request's answer is out and counted, what the client still sends of a body no longer
// forwarded is read and discarded, within bounds (exchange.drain).
func (rt *route) account(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ex := rt.counted(next, w, r); ex != nil {
			ex.drain(w, r)
		}
	})
}

// counted runs next as account says and returns the exchange of a forwarded request
// whose answer reached the client's connection, nil for any other.
func (rt *route) counted(next http.Handler, w http.ResponseWriter, r *http.Request) *exchange {
	rec := &recorder{ResponseWriter: w, idle: rt.bodyIdle, http10: !r.ProtoAtLeast(1, 1), close: CloseAfter(r), start: time.Now()}
	rt.metrics.Started()
	defer rt.metrics.Done()
	rec.discard = rt.boundDiscard(w, r) // a forwarded body's reads set their own deadlines (exchange)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler && !rec.aborted {
				rt.countCut(rec, r)
			}
			rt.finish(rec, r)
			panic(v)
		}
		rt.finish(rec, r)
	}()
	next.ServeHTTP(rec, r)
	if rec.writeErr != nil || !rec.forwarded {
		return nil
	}
	return rec.ex
}

// finish counts the request once its answer is over, its duration from rec.start.
func (rt *route) finish(rec *recorder, r *http.Request) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if rec.decided {
		rt.metrics.Decided(rec.decision)
	}
	elapsed := time.Since(rec.start)
	rt.metrics.Answered(r.Method, status, rec.bytes, elapsed)
	if ctx := r.Context(); rt.log.Enabled(ctx, slog.LevelDebug) {
		rt.logRequest(ctx, rec, r, status, elapsed)
	}
}

// countCut counts why ReverseProxy cut an answer it had started to relay: the client
// stopped reading it, Core stopped sending it, the client went away, or Core's
// connection broke.
func (rt *route) countCut(rec *recorder, r *http.Request) {
	var coreErr error
	if rec.ex != nil {
		coreErr = rec.ex.responseFailed()
	}
	switch {
	case isDeadline(rec.writeErr):
		rt.metrics.BodyTimeout(metrics.PeerClient)
	case isDeadline(coreErr):
		rt.metrics.BodyTimeout(metrics.PeerCore)
		rt.metrics.UpstreamError(metrics.KindTimeout)
		rt.logUpstream(metrics.KindTimeout, coreErr)
	case r.Context().Err() != nil:
		rec.status = statusClientClosedRequest
		rt.metrics.UpstreamError(metrics.KindCanceled)
	default:
		rt.metrics.UpstreamError(metrics.KindReset)
		if coreErr != nil {
			rt.logUpstream(metrics.KindReset, coreErr)
		}
	}
}

// serve takes a token from the route's bucket, then forwards r to Core; or answers
// the limit response without reading r's body. w is the route's *recorder (account).
func (rt *route) serve(w http.ResponseWriter, r *http.Request) {
	rec := w.(*recorder)
	// Core refuses chunked uploads with 411 (docs/core-api.md); answer it here,
	// before a byte of the body is read or a token taken, so that nothing is forwarded.
	// A POST without any length header has ContentLength 0 in net/http, but the
	// transport would send "Content-Length: 0" (Core: 422, not 411): refuse it too.
	if rt.submit && (r.ContentLength < 0 || len(r.Header.Values("Content-Length")) == 0) {
		msg := "Missing Content-Length header."
		if r.TransferEncoding != nil {
			msg = "Chunked uploads are not accepted: send the file with a Content-Length header."
		}
		writeError(rec, http.StatusLengthRequired, msg)
		return
	}
	if rt.bridged != nil && rt.bridged.poll {
		if id, ok := bridgedID(r.URL); ok {
			rt.servePoll(rec, r, id)
			return
		}
	}

	d := rt.acquire(r.Context(), r)
	rec.decide(d)
	switch d.Outcome {
	case limiter.Rejected, limiter.RejectedClient:
		rt.limit.write(rec, d)
		return
	case limiter.Canceled:
		abort(rec)
	}
	rt.forward(rec, r)
}

// acquire asks the route's Limiter (the one in place now, kept to the decision's end,
// whatever a reload swaps in) for a token for r. The decision is counted by finish,
// once for each request it answers (recorder.decide): the polls that share one question
// to Core (the bridge) share its decision too.
func (rt *route) acquire(ctx context.Context, r *http.Request) limiter.Decision {
	held := rt.limiter.Load()
	if held.l == nil {
		return limiter.Decision{Outcome: limiter.Allowed}
	}
	var client string
	if held.perClient {
		client = rt.clientKeys.key(r)
	}
	d := held.l.Acquire(ctx, client)
	if d.Outcome < 0 || int(d.Outcome) >= limiter.Outcomes {
		// A Limiter of another package that answers no known outcome: refused, so that
		// a broken limiter protects Core rather than lets everything through.
		d = limiter.Decision{Outcome: limiter.Rejected, RetryAfter: time.Second}
	}
	return d
}

// refuse answers r on rt with status and msg in Core's error format, without
// forwarding it, counted like any other request.
func (rt *route) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	rt.account(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeError(w, status, msg) })).ServeHTTP(w, r)
}

// boundDiscard bounds by the body idle timeout net/http's own read of the body of a
// request answered without forwarding it (a limit answer, a refusal, the bridge's
// answer to a poll that came with a body): net/http reads up to 256 KiB of an unread
// body before it writes the answer, and with no bound a client gone silent would never
// get the answer and would hold the connection. A forwarded body's reads each set
// their own deadline (requestBody), and the next request on the connection gets
// net/http's again. It returns how much later than its last write an answer the
// proxy gives itself may be written (net/http's read of the body comes first): the
// body idle timeout, or 0 for a request without a body, which costs one comparison.
func (rt *route) boundDiscard(w http.ResponseWriter, r *http.Request) time.Duration {
	if rt.bodyIdle <= 0 || r.Body == nil || r.Body == http.NoBody {
		return 0
	}
	if d, ok := w.(deadliner); ok {
		_ = d.SetReadDeadline(time.Now().Add(rt.bodyIdle))
	}
	return rt.bodyIdle
}

// logSample samples the upstream error lines of a route: lastLog (unix nanoseconds)
// is the instant of the last line, unlogged the errors since.
type logSample struct{ lastLog, unlogged atomic.Int64 }

// logUpstream logs an upstream error at warn level, at most once a second per route,
// with the number of errors it stands for: Core being down must show in the logs
// without a line per request.
func (rt *route) logUpstream(kind string, err error) {
	s := &rt.logged
	n := s.unlogged.Add(1)
	now := time.Now().UnixNano()
	last := s.lastLog.Load()
	// A line less than a second ago waits; one "in the future" means the clock stepped
	// back, and must not silence the log until the clock catches up.
	if since := now - last; (since >= 0 && since < int64(time.Second)) || !s.lastLog.CompareAndSwap(last, now) {
		return
	}
	s.unlogged.Add(-n)
	rt.log.Warn("upstream error", "kind", kind, "err", err.Error(), "errors", n)
}

// logRequest writes the debug line of one request answered on rt: the route (from
// rt.log), the method (from the fixed set of the metrics), the limiter's decision
// ("none" when the proxy answered before asking it: a path refused, an upload without
// a length), the status sent (499: the client went away), the time in the proxy in
// seconds, and the body bytes forwarded to Core and answered to the client. Never the
// path (it holds data_ids), the query, the apikey, the client key nor an address. The
// caller checks first that debug is enabled, so that a request costs nothing more at
// info level.
func (rt *route) logRequest(ctx context.Context, rec *recorder, r *http.Request, status int, elapsed time.Duration) {
	decision := rec.decision
	if decision == "" {
		decision = "none"
	}
	var requestBytes int64
	if rec.ex != nil {
		requestBytes = rec.ex.reqBytes.Load()
	}
	rt.log.LogAttrs(ctx, slog.LevelDebug, "request",
		slog.String("method", metrics.Method(r.Method)),
		slog.String("decision", decision),
		slog.Int("status", status),
		slog.Float64("duration_s", elapsed.Seconds()),
		slog.Int64("request_bytes", requestBytes),
		slog.Int64("response_bytes", rec.bytes))
}
