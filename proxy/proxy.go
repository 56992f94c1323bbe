// Package proxy is mdproxy's HTTP side: the route table of Core's API, the chi router
// that names each request's route, the token bucket check, and the streaming reverse
// proxy to Core with Core-style error bodies.
//
// Data flows one way: request -> route name -> limiter decision -> upstream or limit
// response -> metrics.
package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// statusClientClosedRequest is the code counted (never sent) for a request whose client
// went away before its answer: nginx's 499.
const statusClientClosedRequest = 499

// Limits is what the proxy needs of the limiter: the Limiter of a route (a local
// limiter.Bucket or a limiter.RedisBucket shared by replicas), nil for an unlimited
// route.
type Limits interface {
	Limiter(route string) limiter.Limiter
}

var _ Limits = (*limiter.Set)(nil)

// Options configures New.
type Options struct {
	// Upstream is Core's base URL, e.g. http://127.0.0.1:8008. Required.
	Upstream *url.URL
	// Transport carries requests to Core. nil means NewTransport(TransportOptions{}).
	Transport http.RoundTripper
	// Limits gives each route's bucket, read by New; Proxy.SetLimits replaces them.
	// nil means no limit on any route.
	Limits Limits
	// Metrics receives every count and timing. Required.
	Metrics *metrics.Metrics
	// LimitStatus is the status of a rejected request: 503 (zero value), as Core itself
	// answers when busy, or 429 (RFC 6585).
	LimitStatus int
	// TrustedProxies are the peers whose X-Forwarded-For (or X-Real-IP) is believed
	// when keying per-client shares, and whose forwarding fields (X-Forwarded-Proto,
	// -Host, Forwarded...) reach Core as sent (see setForwarded). Empty: the TCP peer
	// is always the client, and Core is told mdproxy's own view of it.
	TrustedProxies []netip.Prefix
	// ClientIPv6Prefix is the prefix length, in bits, by which IPv6 client addresses
	// are grouped into one key of a per-client share: a host given a /64 takes any
	// address in it at will. Zero means 64; otherwise 1 to 128 (128: each address its
	// own key).
	ClientIPv6Prefix int
	// ClientIPv4Prefix is the same for IPv4 client addresses, IPv4-mapped IPv6 ones
	// included. Zero means 32 (each address its own key); otherwise 1 to 32.
	ClientIPv4Prefix int
	// UpstreamTimeout is only quoted in the 504 body; the Transport enforces it.
	UpstreamTimeout time.Duration
	// Bridge, when not nil, takes Core's callback for each POST /file that brings no
	// callbackurl of its own, and answers GET /file/{data_id} from what it knows
	// (package bridge). nil: every request is forwarded.
	Bridge Bridge
	// BodyIdleTimeout bounds how long a client may make no progress sending its
	// request body or reading its answer; the exchange is then cut and counted
	// (mdproxy_body_timeouts_total). The proxy's own answers (the limit answer, a
	// stored result, a refusal) are bounded too, not counted: each write has a write
	// deadline of the timeout (http.ResponseController). Core's side is bounded by the
	// Transport (TransportOptions.BodyIdleTimeout). Zero means 60 s; negative turns it
	// off.
	BodyIdleTimeout time.Duration
	// PollBufferBytes caps, in bytes, Core's answers to the polls the bridge sends it
	// that the proxy holds at once: each is read whole, to be shared by the concurrent
	// polls of its id and stored when final, and held until the last poll sharing it
	// has written it to its client. A 200 that would pass the cap goes to the poll that
	// asked as it comes instead, shared with no one and not stored (the others ask Core
	// themselves), so that large results read by slow clients cannot take the proxy's
	// memory. Zero means DefaultPollBufferBytes (64 MiB); negative is an error.
	PollBufferBytes int64
	// PollBuffers, when not nil, is the budget of PollBufferBytes, shared with what
	// else holds answers to polls (a bridge.RedisStore's copies of the results it reads);
	// PollBufferBytes is then not read.
	PollBuffers *bridge.Budget
	// Logger receives errors worth a line. nil means slog.Default().
	Logger *slog.Logger
}

// Proxy is the http.Handler that forwards Core's API. It is safe for concurrent use.
type Proxy struct {
	router *chi.Mux // the routing tree of routeTable, asked with Find
	// byPattern is the route of each pattern of routeTable; routeCtx pools the chi
	// contexts that Find fills.
	byPattern map[string]*route
	routeCtx  sync.Pool
	other     *route
	routes    []*route      // every route, other included, for SetLimits
	bodyIdle  time.Duration // Options.BodyIdleTimeout; 0: off

	setLimits sync.Mutex // one SetLimits at a time, so the limit gauges follow the last
}

// route is the per-route state built once: its bucket, its reverse proxy and its metric
// children, so that serving a request looks nothing up by label. The children are
// created on first use (see lazy): a route never used exports no series, and a route
// without a limit no limit gauges.
type route struct {
	name string
	// limiter is the route's Limiter now (nil inside: unlimited). SetLimits swaps it;
	// a request loads it once and keeps it to the end, a wait for a token included.
	limiter         atomic.Pointer[routeLimiter]
	submit          bool // POST /file: Content-Length required, bridged
	polled          bool // GET /file/{data_id}: answered by the bridge
	bridge          Bridge
	flight          singleflight.Group // one Core request for concurrent polls of an id
	pollBuffers     *bridge.Budget     // Options.PollBuffers, shared by the routes
	polls           [bridge.Overdue + 1]prometheus.Counter
	lastOwner       atomic.Pointer[ownerMemo]  // see ownerOf
	lastCT          atomic.Pointer[[]string]   // see contentType
	lastCL          atomic.Pointer[lengthMemo] // see contentLength
	lastRetry       atomic.Pointer[retryMemo]  // see retryAfterValue
	secrets         *regexp.Regexp             // webhook_status: the bridge's callback secrets
	readsAnswer     bool                       // the proxy reads or shares Core's answers (askWholeAnswer)
	proxy           *httputil.ReverseProxy
	requests        *codeCounters
	decisions       [limiter.Outcomes]*lazy[prometheus.Counter]
	duration        *lazy[prometheus.Observer]
	upstreamDur     *lazy[prometheus.Observer]
	upstreamErrors  map[string]*lazy[prometheus.Counter]
	inFlight        *lazy[prometheus.Gauge]
	requestBytes    *lazy[prometheus.Counter]
	responseBytes   *lazy[prometheus.Counter]
	bodyTimeouts    *prometheus.CounterVec
	limitRate       *lazy[prometheus.Gauge]
	limitBurst      *lazy[prometheus.Gauge]
	limitMaxWait    *lazy[prometheus.Gauge]
	limitStatus     int
	clientKeys      clientKeys
	upstreamTimeout time.Duration
	bodyIdle        time.Duration // 0: off
	log             *slog.Logger

	// The bodies of the limit answers, rendered once: rejections must stay cheap, as
	// clients retry them at once.
	rejectBody, rejectClientBody []byte
	// and their Content-Length header values.
	rejectLength, rejectClientLength []string

	// lastLog (unix nanoseconds) and unlogged sample upstream error logs.
	lastLog, unlogged atomic.Int64
}

// New returns the proxy for opts. It returns an error when a required option is missing,
// LimitStatus is neither 0, 429 nor 503, a client prefix is out of its range, or
// PollBufferBytes is negative.
func New(opts Options) (*Proxy, error) {
	if opts.Upstream == nil || opts.Upstream.Host == "" {
		return nil, errors.New("proxy: upstream URL with a host is required")
	}
	if opts.Metrics == nil {
		return nil, errors.New("proxy: metrics are required")
	}
	switch opts.LimitStatus {
	case 0:
		opts.LimitStatus = http.StatusServiceUnavailable
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
	default:
		return nil, fmt.Errorf("proxy: limit status %d: want 503 or 429", opts.LimitStatus)
	}
	if opts.Transport == nil {
		opts.Transport = NewTransport(TransportOptions{})
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Limits == nil {
		opts.Limits = (*limiter.Set)(nil)
	}
	if opts.ClientIPv6Prefix == 0 {
		opts.ClientIPv6Prefix = 64
	}
	if opts.ClientIPv4Prefix == 0 {
		opts.ClientIPv4Prefix = 32
	}
	if opts.ClientIPv6Prefix < 1 || opts.ClientIPv6Prefix > 128 || opts.ClientIPv4Prefix < 1 || opts.ClientIPv4Prefix > 32 {
		return nil, fmt.Errorf("proxy: client prefixes /%d (IPv4) and /%d (IPv6): want 1 to 32 and 1 to 128",
			opts.ClientIPv4Prefix, opts.ClientIPv6Prefix)
	}
	switch {
	case opts.PollBufferBytes == 0:
		opts.PollBufferBytes = DefaultPollBufferBytes
	case opts.PollBufferBytes < 0:
		return nil, fmt.Errorf("proxy: poll buffer budget of %d bytes: want 0 or more", opts.PollBufferBytes)
	}
	pollBuffers := opts.PollBuffers
	if pollBuffers == nil {
		pollBuffers = bridge.NewBudget(opts.PollBufferBytes)
	}
	switch {
	case opts.BodyIdleTimeout == 0:
		opts.BodyIdleTimeout = 60 * time.Second
	case opts.BodyIdleTimeout < 0:
		opts.BodyIdleTimeout = 0
	}

	p := &Proxy{router: chi.NewMux(), byPattern: map[string]*route{}, bodyIdle: opts.BodyIdleTimeout}
	p.routeCtx.New = func() any { return chi.NewRouteContext() }
	for _, rt := range routeTable {
		h := newRoute(rt.name, opts)
		h.submit = rt.name == "submit"
		h.polled = rt.name == "file_result"
		h.pollBuffers = pollBuffers
		if opts.Bridge != nil && rt.name == "logout" {
			h.bridge = opts.Bridge
			h.proxy.ModifyResponse = h.recordLogout
		}
		if opts.Bridge != nil && rt.name == "webhook_status" {
			cb, err := url.Parse(opts.Bridge.CallbackPrefix())
			if err != nil {
				return nil, fmt.Errorf("proxy: the bridge's callback URL: %w", err)
			}
			h.secrets = secretsPattern(cb.Path)
			h.proxy.ModifyResponse = h.redactSecrets
		}
		h.readsAnswer = opts.Bridge != nil && (h.submit || h.polled || h.secrets != nil)
		if opts.Bridge != nil && (h.submit || h.polled) {
			h.bridge = opts.Bridge
			if h.submit {
				h.proxy.ModifyResponse = h.recordSubmission
			}
			for src := bridge.Miss; src <= bridge.Overdue; src++ {
				// Polls Core answered (Miss and Overdue alike) count as "core".
				label := src.String()
				if src == bridge.Miss || src == bridge.Overdue {
					label = "core"
				}
				h.polls[src] = opts.Metrics.BridgePolls.WithLabelValues(label)
			}
		}
		p.routes = append(p.routes, h)
		for _, pattern := range rt.patterns {
			p.byPattern[pattern] = h // a pattern belongs to one route
			switch rt.method {
			case "*":
				p.router.Handle(pattern, h)
			case http.MethodGet:
				p.router.Method(http.MethodGet, pattern, h)
				p.router.Method(http.MethodHead, pattern, h)
			default:
				p.router.Method(rt.method, pattern, h)
			}
		}
	}
	p.other = newRoute(RouteOther, opts)
	p.routes = append(p.routes, p.other)
	return p, nil
}

func newRoute(name string, opts Options) *route {
	m := opts.Metrics
	rt := &route{
		name:             name,
		requests:         &codeCounters{vec: m.Requests, route: name},
		duration:         newLazy(func() prometheus.Observer { return m.Duration.WithLabelValues(name) }),
		upstreamDur:      newLazy(func() prometheus.Observer { return m.UpstreamDuration.WithLabelValues(name) }),
		upstreamErrors:   map[string]*lazy[prometheus.Counter]{},
		inFlight:         newLazy(func() prometheus.Gauge { return m.InFlight.WithLabelValues(name) }),
		requestBytes:     counterOf(m.RequestBytes, name),
		responseBytes:    counterOf(m.ResponseBytes, name),
		bodyTimeouts:     m.BodyTimeouts,
		limitRate:        newLazy(func() prometheus.Gauge { return m.LimitRate.WithLabelValues(name) }),
		limitBurst:       newLazy(func() prometheus.Gauge { return m.LimitBurst.WithLabelValues(name) }),
		limitMaxWait:     newLazy(func() prometheus.Gauge { return m.LimitMaxWait.WithLabelValues(name) }),
		limitStatus:      opts.LimitStatus,
		clientKeys:       clientKeys{trusted: opts.TrustedProxies, ipv4: opts.ClientIPv4Prefix, ipv6: opts.ClientIPv6Prefix},
		upstreamTimeout:  opts.UpstreamTimeout,
		bodyIdle:         opts.BodyIdleTimeout,
		log:              opts.Logger.With("route", name),
		rejectBody:       errorBody("Too many requests for route " + name + ". Try again later."),
		rejectClientBody: errorBody("Too many requests for this client on route " + name + ". Try again later."),
	}
	for o := range limiter.Outcome(limiter.Outcomes) {
		rt.decisions[o] = counterOf(m.Decisions, name, o.String())
	}
	for _, kind := range []string{metrics.KindRefused, metrics.KindReset, metrics.KindTimeout, metrics.KindCanceled, metrics.KindOther} {
		rt.upstreamErrors[kind] = counterOf(m.UpstreamErrors, name, kind)
	}
	rt.rejectLength = []string{strconv.Itoa(len(rt.rejectBody))}
	rt.rejectClientLength = []string{strconv.Itoa(len(rt.rejectClientBody))}
	rt.setLimiter(opts.Limits.Limiter(name))

	upstream := opts.Upstream
	trusted := opts.TrustedProxies
	rt.proxy = &httputil.ReverseProxy{
		// Rewrite, not Director: hop-by-hop headers named in Connection are removed after
		// the rewrite, not before it (golang/go#53002).
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream) // keeps the client's path spelling and encoding
			// A trusted load balancer's view of the client is kept; an untrusted
			// peer's claims are dropped, so Core sees no forged address or scheme.
			setForwarded(pr, trusted)
			// Core's API has no protocol upgrade: a tunnel would carry requests past
			// the limiter and the metrics. The request goes on as a plain one, and a
			// 101 from Core fails as a protocol the client did not ask for (502).
			if pr.Out.Header["Upgrade"] != nil {
				delete(pr.Out.Header, "Upgrade")
				delete(pr.Out.Header, "Connection")
			}
			// An HTTP/1.0 client cannot take 100 Continue (RFC 9110, section 15.2):
			// Core must not wait to send one before reading the body.
			if !pr.In.ProtoAtLeast(1, 1) {
				delete(pr.Out.Header, "Expect")
			}
			// The route and the limit were decided on the request line: header
			// fields with which some servers take another path or method do not
			// reach Core.
			for _, k := range overrideFields {
				delete(pr.Out.Header, k)
			}
			if ex := exchangeOf(pr.In); rt.readsAnswer && (!rt.polled || (ex != nil && ex.shared)) {
				askWholeAnswer(pr.Out.Header)
				if rt.submit {
					if ex != nil {
						ex.sub = rt.bridgeSubmission(pr.Out, pr.In)
					}
				}
			}
		},
		Transport:    timedTransport{next: opts.Transport, observe: rt.upstreamDur, codes: &codeCounters{vec: m.UpstreamResponses, route: name}},
		ErrorHandler: rt.upstreamError,
		BufferPool:   copyBuffers,
		ErrorLog:     slog.NewLogLogger(rt.log.Handler(), slog.LevelWarn),
	}
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
// from now on, and sets the limit gauges to its limit: created for a limited route, set
// to 0 when a route that had a limit has none any more, and never created for a route
// that was never limited.
func (rt *route) setLimiter(l limiter.Limiter) {
	rt.limiter.Store(&routeLimiter{l: l, perClient: l != nil && l.Limit().ClientLimit > 0})
	if l == nil && !rt.limitRate.made() {
		return
	}
	var lim limiter.Limit
	if l != nil {
		lim = l.Limit()
	}
	rt.limitRate.get().Set(lim.Rate)
	rt.limitBurst.get().Set(float64(lim.Burst))
	rt.limitMaxWait.get().Set(lim.MaxWait.Seconds())
}

// SetLimits gives each route the bucket l has for it (nil l: no limit on any route), as
// a reload of the limits does, and sets the limit gauges to match. A route whose bucket
// is the same as before keeps it, its tokens and its waiting requests untouched; a
// request that already took, or waits for, a token of a replaced bucket finishes on
// it, and requests that start afterwards use the new one. No request is refused or
// dropped by the change. Safe for concurrent use with serving and with itself.
func (p *Proxy) SetLimits(l Limits) {
	if l == nil {
		l = (*limiter.Set)(nil)
	}
	p.setLimits.Lock()
	defer p.setLimits.Unlock()
	for _, rt := range p.routes {
		rt.setLimiter(l.Limiter(rt.name))
	}
}

// ServeHTTP routes r by its canonical path and serves it on its route. Before routing,
// it answers itself, counted under route other: 501 to CONNECT, PRI and a method of
// Core's API spelt in another case, 400 to a path canonicalPath refuses and to a
// request with more than one apikey header, each in Core's error format. A request
// framed by Transfer-Encoding, or in HTTP/1.0, ends its connection after its answer
// (CloseAfter).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if CloseAfter(r) {
		w.Header()["Connection"] = closeValue
	}
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodHead:
	default:
		if r.Method == http.MethodConnect || r.Method == "PRI" || otherCase(r.Method) {
			// Core's API has neither of the first two: a CONNECT's authority-form
			// target has no path to route or forward (it went on as "CONNECT /"), and
			// "PRI * HTTP/2.0" is the HTTP/2 preface, which mdproxy does not speak in
			// clear text. Methods are case-sensitive (RFC 9110, section 9.1): "get" is
			// not GET to mdproxy's routes, and a server that read it as GET would
			// serve a poll no limit counted.
			if r.Method == http.MethodConnect {
				// What follows a CONNECT may be tunnel bytes to a proxy in front,
				// never a request to read here.
				w.Header()["Connection"] = closeValue
			}
			p.other.refuse(w, r, http.StatusNotImplemented, "Method not implemented: "+r.Method+" is not part of Core's API.")
			return
		}
	}
	cp, ok := canonicalPath(r.URL)
	if !ok {
		p.other.refuse(w, r, http.StatusBadRequest,
			"Invalid path: dot segments (. and ..), encoded slashes, backslashes, semicolons, NUL bytes and the * target are not accepted.")
		return
	}
	if len(r.Header["Apikey"]) > 1 {
		// The per-client share and the bridge's owner read one apikey; Core might
		// read another.
		p.other.refuse(w, r, http.StatusBadRequest, "Invalid apikey: the header is sent more than once.")
		return
	}
	p.routeOf(r.Method, cp).ServeHTTP(w, r)
}

// CloseAfter reports whether r's connection must end after its answer (the caller sets
// Connection: close). A request framed
// by Transfer-Encoding may have come with a Content-Length too, which net/http drops
// before the handler can see it: RFC 9112, section 6.1, wants the connection closed
// after the answer, since a proxy in front may have framed the request by that length
// (request smuggling); Core's clients send lengths. net/http ignores and removes
// Transfer-Encoding on an HTTP/1.0 request, which the same section wants treated as
// faulty framing, so an HTTP/1.0 connection (kept alive only by an extension) ends
// after each answer too.
func CloseAfter(r *http.Request) bool {
	return r.TransferEncoding != nil || !r.ProtoAtLeast(1, 1)
}

// apiMethods are the methods of Core's API (docs/core-api.md), and those of HTTP that a
// server might take in another case.
var apiMethods = [...]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodDelete, http.MethodPatch, http.MethodOptions}

// otherCase reports whether method is one of apiMethods spelt in another case ("get").
func otherCase(method string) bool {
	for _, m := range apiMethods {
		if method != m && strings.EqualFold(method, m) {
			return true
		}
	}
	return false
}

// overrideFields are the request header fields (canonical keys) with which some servers
// and frameworks replace a request's path (IIS's URL Rewrite) or method (method
// override), which mdproxy does not forward.
var overrideFields = [...]string{"X-Original-Url", "X-Rewrite-Url", "X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// closeValue is the Connection field value that ends a connection after the answer.
var closeValue = []string{"close"}

// routeOf returns the route of a request of method for the canonical path cp, found
// in chi's routing tree (Mux.Find), or the route other. chi's own ServeHTTP would put a
// route context in a copy of the request, two allocations a request that nothing here
// reads: the route is all the proxy needs of the router.
func (p *Proxy) routeOf(method, cp string) *route {
	rctx := p.routeCtx.Get().(*chi.Context)
	rctx.Reset()
	pattern := p.router.Find(rctx, method, cp)
	p.routeCtx.Put(rctx)
	if rt := p.byPattern[pattern]; rt != nil {
		return rt
	}
	return p.other
}

// refuse answers r on rt without forwarding it, counting it like any other request.
func (rt *route) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	rec := &recorder{ResponseWriter: w, idle: rt.bodyIdle, start: time.Now()}
	rt.inFlight.get().Inc()
	defer rt.inFlight.get().Dec()
	rec.discard = rt.boundDiscard(w, r)
	writeError(rec, status, msg)
	rt.finish(rec, r)
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

// ServeHTTP takes a token from the route's bucket, then forwards r to Core; or answers
// the limit response without reading r's body. Once a forwarded request is answered
// and counted, what the client still sends of a body no longer forwarded is read and
// discarded, within bounds (exchange.drain).
func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ex := rt.serve(w, r); ex != nil {
		ex.drain(w, r)
	}
}

// serve is ServeHTTP up to the answer's end: it returns the exchange of a forwarded
// request whose answer reached the client's connection, nil for any other.
func (rt *route) serve(w http.ResponseWriter, r *http.Request) *exchange {
	start := time.Now()
	rt.inFlight.get().Inc()
	defer rt.inFlight.get().Dec()
	rec := &recorder{ResponseWriter: w, idle: rt.bodyIdle, http10: !r.ProtoAtLeast(1, 1), close: CloseAfter(r), start: start}
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
		return nil
	}

	if rt.bridge != nil && rt.polled {
		if id, ok := bridgedID(r.URL); ok {
			rt.servePoll(rec, r, id)
			return nil
		}
	}

	d := rt.acquire(r.Context(), r)
	rec.decide(d)
	switch d.Outcome {
	case limiter.Rejected, limiter.RejectedClient:
		rt.writeLimit(rec, d)
		return nil
	case limiter.Canceled:
		abort(rec)
	}

	ex := newExchange(w, r, rt.bodyIdle)
	defer ex.finish()
	rec.ex = ex
	ctx := context.WithValue(r.Context(), exchangeKey{}, ex)
	hasBody := r.Body != nil && r.Body != http.NoBody
	if hasBody {
		defer func() { rt.requestBytes.get().Add(float64(ex.reqBytes.Load())) }()
	} else {
		ex.bodyDone = true
	}
	ctx = ex.trace(ctx)
	// The body is wrapped in the copy of r that is forwarded, never in r itself:
	// net/http looks at r.Body after the handler, to end the connection gently after
	// a large body left unread (closeWriteAndWait), which it does only for its own
	// body type.
	out := r.WithContext(ctx)
	if hasBody {
		// Core may answer before it has the whole body and read on. net/http would
		// then read the rest of a body under 256 KiB itself before it writes the
		// answer, taking it from the transport that forwards it (Core's upload cut
		// short, and a streamed answer with it): full duplex leaves the body to the
		// transport, and to drain once the answer is written.
		_ = http.NewResponseController(w).EnableFullDuplex()
		out.Body = &requestBody{body: r.Body, ex: ex}
	}
	rt.proxy.ServeHTTP(rec, out)
	if rec.writeErr != nil {
		return nil
	}
	return ex
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

// writeLimit answers a request the bucket rejected: the limit status with Retry-After
// and a Core-style body.
func (rt *route) writeLimit(w *recorder, d limiter.Decision) {
	h := w.Header()
	if d.Waited == 0 {
		h["Date"] = dateValue(w.start) // decided on arrival: start is now
	}
	h["Retry-After"] = rt.retryAfterValue(d.RetryAfterSeconds())
	body, length := rt.rejectBody, rt.rejectLength
	if d.Outcome == limiter.RejectedClient {
		body, length = rt.rejectClientBody, rt.rejectClientLength
	}
	h["Content-Type"] = jsonContentType
	h["Content-Length"] = length
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(rt.limitStatus)
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
func (rt *route) retryAfterValue(s int) []string {
	if s >= 0 && s < len(retryAfterValues) {
		return retryAfterValues[s]
	}
	if m := rt.lastRetry.Load(); m != nil && m.s == s {
		return m.v
	}
	v := []string{strconv.Itoa(s)}
	rt.lastRetry.Store(&retryMemo{s, v})
	return v
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

// retryMemo is a Retry-After value of s seconds, rendered.
type retryMemo struct {
	s int
	v []string
}

// abort ends the request without an answer: net/http recovers http.ErrAbortHandler
// and closes the connection without writing anything. A handler that merely returned
// would make net/http send "200 OK" with an empty body, a status that neither Core
// nor the proxy gave, which a client could take for Core's answer.
func abort(rec *recorder) {
	rec.status = statusClientClosedRequest
	rec.aborted = true
	panic(http.ErrAbortHandler)
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
		rt.bodyTimeouts.WithLabelValues(rt.name, metrics.PeerClient).Inc()
	case isDeadline(coreErr):
		rt.bodyTimeouts.WithLabelValues(rt.name, metrics.PeerCore).Inc()
		rt.upstreamErrors[metrics.KindTimeout].get().Inc()
		rt.logUpstream(metrics.KindTimeout, coreErr)
	case r.Context().Err() != nil:
		rec.status = statusClientClosedRequest
		rt.upstreamErrors[metrics.KindCanceled].get().Inc()
	default:
		rt.upstreamErrors[metrics.KindReset].get().Inc()
		if coreErr != nil {
			rt.logUpstream(metrics.KindReset, coreErr)
		}
	}
}

// finish counts the request once its answer is over, its duration from rec.start.
func (rt *route) finish(rec *recorder, r *http.Request) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	rt.requests.inc(r.Method, status)
	if rec.decided {
		rt.decisions[rec.outcome].get().Inc()
	}
	if rec.bytes > 0 {
		rt.responseBytes.get().Add(float64(rec.bytes))
	}
	elapsed := time.Since(rec.start)
	rt.duration.get().Observe(elapsed.Seconds())
	if ctx := r.Context(); rt.log.Enabled(ctx, slog.LevelDebug) {
		rt.logRequest(ctx, rec, r, status, elapsed)
	}
}

// upstreamError is the ReverseProxy's ErrorHandler: it maps a failed round trip to 502
// (refused, reset), 504 (no response headers in time) or 499 (the client went away
// first: counted, nothing sent), with a Core-style JSON body.
func (rt *route) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rec, _ := w.(*recorder)
	if errors.Is(exchangeOf(r).requestFailed(), errClientIdle) {
		// Not Core's fault: the client stopped sending its upload.
		rt.bodyTimeouts.WithLabelValues(rt.name, metrics.PeerClient).Inc()
		writeError(w, http.StatusRequestTimeout,
			fmt.Sprintf("The request body made no progress for %v.", rt.bodyIdle))
		return
	}
	kind := classify(r, err)
	rt.upstreamErrors[kind].get().Inc()
	switch kind {
	case metrics.KindCanceled:
		// A client whose upload broke may still be there to read why; one that went
		// away gets nothing, not even a status.
		if r.Context().Err() != nil && rec != nil {
			abort(rec)
		}
		msg := "The request body ended before its Content-Length."
		if r.TransferEncoding != nil {
			msg = "The request body's chunked encoding is malformed or ended early."
		}
		writeError(w, http.StatusBadRequest, msg)
		if rec != nil {
			rec.status = statusClientClosedRequest
		}
	case metrics.KindTimeout:
		switch {
		case isDial(err):
			writeError(w, http.StatusBadGateway, "Core could not be reached: connect timeout.")
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A read or write deadline of Core's connection, not the header timeout.
			rt.bodyTimeouts.WithLabelValues(rt.name, metrics.PeerCore).Inc()
			writeError(w, http.StatusGatewayTimeout,
				fmt.Sprintf("Core made no progress on the request for %v.", rt.bodyIdle))
		default:
			writeError(w, http.StatusGatewayTimeout,
				fmt.Sprintf("Core did not answer within %v.", rt.upstreamTimeout))
		}
		rt.logUpstream(kind, err)
	default:
		msg := "Core could not be reached: " + kind + "."
		var bad *badStatusError
		switch {
		case isTLS(err):
			msg = "Core could not be reached: TLS handshake failed (see mdproxy's log)."
		case errors.As(err, new(*acceptedCutError)):
			// Not "Core could not be reached": a client told so may submit again.
			msg = "Core accepted the file (200) but its answer broke off before the data_id: the scan may be running."
		case errors.As(err, &bad):
			msg = fmt.Sprintf("Core's answer has an invalid status (%03d).", bad.code)
		case strings.HasPrefix(err.Error(), "backend tried to switch protocol"):
			// httputil.ReverseProxy's error, untyped, for a 101 to a request that
			// asked no upgrade (the proxy forwards none).
			msg = "Core switched protocols (101): Core's API has no protocol upgrade, so none is relayed."
		}
		writeError(w, http.StatusBadGateway, msg)
		rt.logUpstream(kind, err)
	}
}

// isTLS reports whether err comes from the TLS handshake with Core: its certificate not
// verified, or an alert from Core (e.g. a client certificate missing or refused). Over
// TCP, crypto/tls reports Core's alert as a *net.OpError whose Op is "remote error"
// around an unexported type (tls.AlertError is QUIC's).
func isTLS(err error) bool {
	var cv *tls.CertificateVerificationError
	var alert tls.AlertError
	var rec tls.RecordHeaderError
	var op *net.OpError
	return errors.As(err, &cv) || errors.As(err, &alert) || errors.As(err, &rec) ||
		(errors.As(err, &op) && op.Op == "remote error")
}

// logUpstream logs an upstream error at warn level, at most once a second per route,
// with the number of errors it stands for: Core being down must show in the logs
// without a line per request.
func (rt *route) logUpstream(kind string, err error) {
	n := rt.unlogged.Add(1)
	now := time.Now().UnixNano()
	last := rt.lastLog.Load()
	// A line less than a second ago waits; one "in the future" means the clock stepped
	// back, and must not silence the log until the clock catches up.
	if since := now - last; (since >= 0 && since < int64(time.Second)) || !rt.lastLog.CompareAndSwap(last, now) {
		return
	}
	rt.unlogged.Add(-n)
	rt.log.Warn("upstream error", "kind", kind, "err", err.Error(), "errors", n)
}

// isDial reports whether err happened while connecting to Core.
func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// classify names the kind of a round trip error of r, a request forwarded by the
// proxy.
func classify(r *http.Request, err error) string {
	bodyErr := exchangeOf(r).requestFailed()
	var ne net.Error
	switch {
	case errors.Is(err, errCoreGone), errors.Is(bodyErr, errCoreGone):
		// Core's connection closed while the upload was being read.
		return metrics.KindReset
	case r.Context().Err() != nil, bodyErr != nil:
		return metrics.KindCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return metrics.KindTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return metrics.KindRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return metrics.KindReset
	}
	return metrics.KindOther
}

// copyBuffers recycles the 32 KiB buffers ReverseProxy copies bodies through.
var copyBuffers = &bufferPool{sync.Pool{New: func() any { return new([32 << 10]byte) }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte { return b.p.Get().(*[32 << 10]byte)[:] }
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) == 32<<10 {
		b.p.Put((*[32 << 10]byte)(buf[:32<<10]))
	}
}

// timedTransport observes the time to Core's response headers and counts Core's
// answers by status code.
type timedTransport struct {
	next    http.RoundTripper
	observe *lazy[prometheus.Observer]
	codes   *codeCounters
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	if err == nil && (resp.StatusCode < 100 || resp.StatusCode > 599) {
		// RFC 9110, section 15: a status is 100 to 599. net/http reads any three
		// digits; relayed, 099 read as a 1xx became a 200 of the proxy's, and 999
		// went to the client and into the metrics' code label.
		resp.Body.Close()
		return nil, &badStatusError{resp.StatusCode}
	}
	if err == nil {
		t.observe.get().Observe(time.Since(start).Seconds())
		t.codes.inc("", resp.StatusCode)
		if ex := exchangeOf(r); ex != nil {
			ex.answered()
			if resp.Body != nil && resp.Body != http.NoBody {
				resp.Body = &responseBody{ReadCloser: resp.Body, ex: ex}
			}
		}
	}
	return resp, err
}

// badStatusError is Core's answer with a status outside 100 to 599.
type badStatusError struct{ code int }

func (e *badStatusError) Error() string {
	return fmt.Sprintf("Core answered with status %03d, outside 100 to 599", e.code)
}

// recorder remembers the status and body size of an answer, and bounds each of its
// writes by the body idle timeout (armWrite). It unwraps to the connection's writer, so
// that http.ResponseController (and so ReverseProxy's flushes) reach it.
type recorder struct {
	http.ResponseWriter
	status   int
	bytes    int64
	idle     time.Duration // the body idle timeout; 0: writes unbounded
	discard  time.Duration // how long net/http may read an unread body before it writes
	http10   bool          // the client speaks HTTP/1.0: no 1xx may reach it
	close    bool          // the connection ends after the answer (CloseAfter, or the body's end not in)
	interim  uint8         // the 1xx answers relayed, at most maxInterim
	aborted  bool          // abort cut the request, already counted
	decided  bool          // outcome is the limiter's decision, counted by finish (decide)
	ex       *exchange     // nil for answers the proxy gives itself
	writeErr error         // the first failed write to the client
	decision string        // the limiter's outcome (or the bridge's source); "": neither
	start    time.Time     // when the request reached the route: its duration, its Date
	outcome  limiter.Outcome
	// The fields are in this order so that a recorder takes 128 bytes, one allocation
	// of the smallest size class that holds it.
}

// decide records d as the limiter's decision for the request, counted once by finish.
func (w *recorder) decide(d limiter.Decision) {
	w.decision = d.Outcome.String()
	w.outcome, w.decided = d.Outcome, true
}

// armWrite sets the client connection's write deadline one body idle timeout from
// now, for the writes that follow: a client that stops reading its answer (its socket
// buffers full, for a long answer or for many short ones sent back to back) has its
// connection closed then, instead of holding it, its goroutine and its buffers for
// ever. net/http's own WriteTimeout counts from the request's arrival and would cut a
// long answer that progresses; this one counts from the last write. net/http writes
// an answer's last bytes after the handler returns, within the deadline the last write
// set, then clears it for the connection's next request. Before it writes the
// header of an answer the proxy gives without forwarding, net/http reads what is left
// of a body nobody read (up to 256 KiB, for at most discard): the deadline allows for
// that wait too. A forwarded body is left to the handler (full duplex, route.serve).
func (w *recorder) armWrite() {
	if w.idle <= 0 {
		return
	}
	d, ok := w.ResponseWriter.(deadliner)
	if !ok {
		return
	}
	bound := w.idle
	if w.discard > 0 && w.ex == nil {
		bound += w.discard
	}
	_ = d.SetWriteDeadline(time.Now().Add(bound))
}

// maxInterim is the most 1xx answers of Core's relayed to a client for one request.
const maxInterim = 16

// ownPiece is the most the proxy writes of an answer of its own (a stored result) in
// one write, in bytes, its write deadline moved on before each piece: a slow client
// that keeps reading a long answer is not cut.
const ownPiece = 64 << 10

func (w *recorder) WriteHeader(code int) {
	if code < 200 && w.http10 {
		return // RFC 9110, section 15.2: no 1xx to an HTTP/1.0 client
	}
	if code < 200 {
		// net/http caps Core's 1xx answers only when nobody hooks them, and
		// ReverseProxy does: the client gets the first maxInterim, not a flood.
		if w.interim >= maxInterim {
			return
		}
		w.interim++
	}
	if code >= 200 && w.ex != nil && w.ex.bodyUnread() {
		// The answer starts before the client's body is all in (Core answered
		// early, or the proxy cut the exchange): the connection ends after it, and
		// the answer says so (RFC 9110, section 10.1.1), as net/http's does when it
		// does not read the rest first; with the body left to the handler (full
		// duplex), net/http says so only behind "Expect: 100-continue".
		w.close = true
	}
	if w.close {
		// ReverseProxy clears the header map after relaying Core's 1xx (100
		// Continue, 103): the final answer says Connection: close again, a 1xx not.
		if code >= 200 {
			w.Header()["Connection"] = closeValue
		} else {
			delete(w.Header(), "Connection")
		}
	}
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	if w.ex != nil && code >= 200 {
		noSniff(w.Header()) // Core's answer, relayed
	}
	w.armWrite() // a 1xx is written at once; a final status with the first body bytes
	w.ResponseWriter.WriteHeader(code)
}

// noSniff keeps net/http from giving an answer without a Content-Type one guessed from
// its first bytes (a "text/html" for a sanitized file that starts like HTML): the proxy
// relays Core's media type, and none when Core gave none (RFC 9110, section 8.3). A nil
// value is written as nothing.
func noSniff(h http.Header) {
	if _, ok := h["Content-Type"]; !ok {
		h["Content-Type"] = nil
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	implicit := w.status == 0 // net/http writes a 200 header now, no WriteHeader armed it
	if implicit {
		w.status = http.StatusOK
	}
	if w.ex != nil {
		// Core's answer, relayed as it comes: each write may wait on the client.
		w.armWrite()
		return w.write(p)
	}
	// An answer of the proxy's own, whole in memory: the header's deadline covers its
	// first piece, and each piece after moves it on.
	if implicit {
		w.armWrite()
	}
	n := 0
	for {
		k, err := w.write(p[:min(len(p), ownPiece)])
		n += k
		p = p[k:]
		if err != nil || len(p) == 0 {
			return n, err
		}
		w.armWrite()
	}
}

// write writes p to the client and counts it.
func (w *recorder) write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	if err != nil && w.writeErr == nil {
		w.writeErr = err
	}
	return n, err
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
