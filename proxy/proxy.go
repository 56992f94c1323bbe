// Package proxy is mdproxy's HTTP side: the route table of Core's API, the chi router
// that names each request's route, the token bucket check, and the streaming reverse
// proxy to Core with Core-style error bodies.
//
// Data flows one way: request -> route name -> limiter decision -> upstream or limit
// response -> metrics.
package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

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
	routes    []*route // every route, other included, for SetLimits

	setLimits sync.Mutex // one SetLimits at a time, so the limit gauges follow the last
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

	p := &Proxy{router: chi.NewMux(), byPattern: map[string]*route{}}
	p.routeCtx.New = func() any { return chi.NewRouteContext() }
	for _, spec := range routeTable {
		rt := newRoute(spec.name, opts, &httputil.ReverseProxy{})
		if opts.Bridge != nil {
			if err := rt.bridgeWith(opts.Bridge, pollBuffers, opts.Metrics); err != nil {
				return nil, err
			}
		}
		p.routes = append(p.routes, rt)
		for _, pattern := range spec.patterns {
			p.byPattern[pattern] = rt // a pattern belongs to one route
			switch spec.method {
			case "*":
				p.router.Handle(pattern, rt)
			case http.MethodGet:
				p.router.Method(http.MethodGet, pattern, rt)
				p.router.Method(http.MethodHead, pattern, rt)
			default:
				p.router.Method(spec.method, pattern, rt)
			}
		}
	}
	p.other = newRoute(RouteOther, opts, &httputil.ReverseProxy{})
	p.routes = append(p.routes, p.other)
	return p, nil
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
