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

// route is one route of Core's API, built once by New: nothing is looked up by name while
// serving.
type route struct {
	name string
	// limiter is swapped by SetLimits; a request loads it once, a wait for a token included.
	limiter    atomic.Pointer[routeLimiter]
	submit     bool                   // POST /file: Content-Length required
	handler    http.Handler           // serve inside the accounting middleware (account)
	proxy      *httputil.ReverseProxy // forwards to Core
	metrics    *metrics.Route
	limit      *limitAnswer
	clientKeys clientKeys
	bridged    *bridged // the bridge's side of the route; nil: the bridge has none
	// upstreamTimeout is quoted in the 504 body; bodyIdle is Options.BodyIdleTimeout (0: off).
	upstreamTimeout, bodyIdle time.Duration
	log                       *slog.Logger
	logged                    logSample // the upstream errors logged, at most once a second
	rateLimitHeaders          bool      // Options.RateLimitHeaders
}

func newRoute(name string, opts Options, rp *httputil.ReverseProxy) *route {
	rt := &route{
		name:             name,
		submit:           name == "submit",
		proxy:            rp,
		metrics:          opts.Metrics.Route(name),
		limit:            newLimitAnswer(name, opts.LimitStatus),
		clientKeys:       clientKeys{trusted: opts.TrustedProxies, ipv4: opts.ClientIPv4Prefix, ipv6: opts.ClientIPv6Prefix},
		upstreamTimeout:  opts.UpstreamTimeout,
		bodyIdle:         opts.BodyIdleTimeout,
		log:              opts.Logger.With("route", name),
		rateLimitHeaders: opts.RateLimitHeaders,
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

// routeLimiter is a route's Limiter (nil: unlimited), whether its limit has a per-client
// share and its exemptions, read once per Limiter rather than on every request.
type routeLimiter struct {
	l         limiter.Limiter
	perClient bool
	exempt    Exemptions
}

// setLimiter makes l the Limiter of requests from now on and sets the limit gauges. An
// Exempt that does not parse (ParseExempt; sidecar refuses one at start and at a reload)
// exempts no one: the limit protects Core.
func (rt *route) setLimiter(l limiter.Limiter) {
	var lim limiter.Limit
	if l != nil {
		lim = l.Limit()
	}
	exempt, err := ParseExempt(lim.Exempt)
	if err != nil {
		rt.log.Error("route exemptions not read: no client is exempt", "err", err.Error())
	}
	rt.limiter.Store(&routeLimiter{l: l, perClient: lim.ClientLimit > 0, exempt: exempt})
	rt.metrics.SetLimit(l != nil, lim.Rate, lim.Burst, lim.MaxWait)
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.handler.ServeHTTP(w, r) }

// account is the accounting middleware: next writes to a *recorder while the request is in
// flight, and the request is counted once next returns or panics (a cut answer counted by
// why: countCut). A forwarded request's unsent body is then drained (exchange.drain).
func (rt *route) account(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ex := rt.counted(next, w, r); ex != nil {
			ex.drain(w, r)
		}
	})
}

// counted runs next as account says; it returns the exchange of a forwarded request whose
// answer reached the client, else nil.
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

// countCut counts why ReverseProxy cut an answer under way: the client stopped reading,
// Core stopped sending, the client left, or Core's connection broke.
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

// serve forwards r to Core once the bucket gives a token, or answers the limit answer
// without reading r's body. w is the route's *recorder.
func (rt *route) serve(w http.ResponseWriter, r *http.Request) {
	rec := w.(*recorder)
	// Core refuses chunked uploads with 411 (docs/core-api.md): refused before a byte is read.
	// A POST without a length would reach Core as "Content-Length: 0" (422): refused too.
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
	rt.quotaHeaders(rec.Header(), d)
	switch d.Outcome {
	case limiter.Rejected, limiter.RejectedClient:
		rt.limit.write(rec, d)
		return
	case limiter.Canceled:
		abort(rec)
	}
	rt.forward(rec, r)
}

// acquire asks the route's Limiter in place now for a token for r. The decision is counted
// by finish, once for each request it answers (polls sharing a question share it).
func (rt *route) acquire(ctx context.Context, r *http.Request) limiter.Decision {
	held := rt.limiter.Load()
	if held.l == nil {
		return limiter.Decision{Outcome: limiter.Allowed}
	}
	if !held.exempt.Empty() && held.exempt.allows(r, rt.clientKeys.trusted) {
		return limiter.Decision{Outcome: limiter.Exempt}
	}
	var client string
	if held.perClient {
		client = rt.clientKeys.key(r)
	}
	d := held.l.Acquire(ctx, client)
	if d.Outcome < 0 || int(d.Outcome) >= limiter.Outcomes {
		// An unknown outcome is refused: a broken limiter protects Core.
		d = limiter.Decision{Outcome: limiter.Rejected, RetryAfter: time.Second}
	}
	return d
}

// refuse answers r with status and msg in Core's error format, counted, not forwarded.
func (rt *route) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	rt.account(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeError(w, status, msg) })).ServeHTTP(w, r)
}

// boundDiscard bounds by the body idle timeout net/http's read of up to 256 KiB of the
// body of a request answered without forwarding, done before the answer is written: a
// silent client would otherwise hold the connection. It returns the extra write time the
// answer needs for it (0 without a body).
func (rt *route) boundDiscard(w http.ResponseWriter, r *http.Request) time.Duration {
	if rt.bodyIdle <= 0 || r.Body == nil || r.Body == http.NoBody {
		return 0
	}
	if d, ok := w.(deadliner); ok {
		_ = d.SetReadDeadline(time.Now().Add(rt.bodyIdle))
	}
	return rt.bodyIdle
}

// logSample: lastLog (unix ns) is the last upstream error line, unlogged the errors since.
type logSample struct{ lastLog, unlogged atomic.Int64 }

// logUpstream logs an upstream error at most once a second per route, with the number it
// stands for.
func (rt *route) logUpstream(kind string, err error) {
	s := &rt.logged
	n := s.unlogged.Add(1)
	now := time.Now().UnixNano()
	last := s.lastLog.Load()
	// A line in the future means the clock stepped back: it must not silence the log.
	if since := now - last; (since >= 0 && since < int64(time.Second)) || !s.lastLog.CompareAndSwap(last, now) {
		return
	}
	s.unlogged.Add(-n)
	rt.log.Warn("upstream error", "kind", kind, "err", err.Error(), "errors", n)
}

// logRequest writes the debug line of a request: route, method (the metrics' fixed set),
// decision ("none" when the limiter was not asked), status, seconds and body bytes. Never
// the path, query, apikey, client key or address.
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
