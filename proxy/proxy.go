// Package proxy is mdproxy's HTTP side: the route table of Core's API, the token bucket
// check, and the streaming reverse proxy to Core with Core-style error bodies.
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

// statusClientClosedRequest is counted, never sent, for a client that left: nginx's 499.
const statusClientClosedRequest = 499

// Limits gives the Limiter of a route (nil: unlimited).
type Limits interface {
	Limiter(route string) limiter.Limiter
}

var _ Limits = (*limiter.Set)(nil)

// Options configures New.
type Options struct {
	// Upstream is Core's base URL, e.g. http://127.0.0.1:8008. Required.
	Upstream *url.URL
	// Transport carries requests to Core. nil: NewTransport(TransportOptions{}).
	Transport http.RoundTripper
	// Limits is read by New (SetLimits replaces it); nil: no limit.
	Limits Limits
	// Metrics receives every count and timing. Required.
	Metrics *metrics.Metrics
	// LimitStatus is a refused request's status: 503 (zero value), as Core answers when busy,
	// or 429 (RFC 6585).
	LimitStatus int
	// RateLimitHeaders adds the RateLimit-Policy and RateLimit fields to the answers of
	// routes with a rate (quotaHeaders). False: none.
	RateLimitHeaders bool
	// TrustedProxies are the peers whose X-Forwarded-For (or X-Real-IP) keys per-client
	// shares and whose forwarding fields reach Core as sent (setForwarded). Empty: the TCP
	// peer is the client.
	TrustedProxies []netip.Prefix
	// ClientIPv6Prefix is the prefix length, in bits, by which IPv6 clients share a key: a
	// host given a /64 takes any address in it. Zero means 64; else 1 to 128.
	ClientIPv6Prefix int
	// ClientIPv4Prefix is the same for IPv4 (mapped ones included). Zero means 32; else 1 to 32.
	ClientIPv4Prefix int
	// UpstreamTimeout is only quoted in the 504 body; the Transport enforces it.
	UpstreamTimeout time.Duration
	// Bridge, when not nil, takes Core's callback for each POST /file without a callbackurl
	// and answers GET /file/{data_id} from what it knows. nil: everything is forwarded.
	Bridge Bridge
	// BodyIdleTimeout bounds how long a client may make no progress sending its body or
	// reading its answer (then cut, counted in mdproxy_body_timeouts_total; the proxy's own
	// answers not counted). Core's side is the Transport's. Zero means 60 s; negative: off.
	BodyIdleTimeout time.Duration
	// PollBufferBytes caps, in bytes, Core's answers to bridged polls held at once, each until
	// the last poll sharing it has written it; a 200 past the cap goes to the poll that asked,
	// shared and stored nowhere. Zero means DefaultPollBufferBytes; negative is an error.
	PollBufferBytes int64
	// PollBuffers, when not nil, is that budget shared with others (a bridge.RedisStore's
	// reads); PollBufferBytes is then not read.
	PollBuffers *bridge.Budget
	// Logger: nil means slog.Default().
	Logger *slog.Logger
}

// Proxy is the http.Handler that forwards Core's API. Safe for concurrent use.
type Proxy struct {
	router *chi.Mux // the routing tree of routeTable, asked with Find
	// byPattern: each pattern's route; routeCtx pools the chi contexts Find fills.
	byPattern map[string]*route
	routeCtx  sync.Pool
	other     *route
	routes    []*route // every route, other included, for SetLimits

	setLimits sync.Mutex // one SetLimits at a time, so the limit gauges follow the last
}

// New returns the proxy for opts, or an error for a missing Upstream or Metrics, a
// LimitStatus other than 0, 429 and 503, a client prefix out of range, or a negative
// PollBufferBytes.
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

// SetLimits gives each route l's bucket (nil l: none), as a reload does, and sets the limit
// gauges. An unchanged bucket keeps its tokens and waiters; a request on a replaced bucket
// finishes on it. Nothing is refused or dropped by the change. Safe for concurrent use.
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

// ServeHTTP routes r by its canonical path. Before routing it answers itself, under route
// other: 501 to CONNECT, PRI and an API method in another case, 400 to a path
// canonicalPath refuses and to more than one apikey header.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if CloseAfter(r) {
		w.Header()["Connection"] = closeValue
	}
	switch r.Method {
	case http.MethodGet, http.MethodPost, http.MethodHead:
	default:
		if r.Method == http.MethodConnect || r.Method == "PRI" || otherCase(r.Method) {
			// Neither CONNECT nor the HTTP/2 preface (PRI) is Core's API; methods are
			// case-sensitive (RFC 9110, section 9.1): "get" would dodge GET's limit.
			if r.Method == http.MethodConnect {
				// What follows a CONNECT may be tunnel bytes: never read them.
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
		// Core might read another apikey than the limit and the bridge.
		p.other.refuse(w, r, http.StatusBadRequest, "Invalid apikey: the header is sent more than once.")
		return
	}
	p.routeOf(r.Method, cp).ServeHTTP(w, r)
}

// CloseAfter reports whether r's connection must end after its answer: a request framed by
// Transfer-Encoding may have had a Content-Length net/http dropped, and an HTTP/1.0
// Transfer-Encoding is faulty framing (RFC 9112, section 6.1: request smuggling).
func CloseAfter(r *http.Request) bool {
	return r.TransferEncoding != nil || !r.ProtoAtLeast(1, 1)
}

// apiMethods are the methods of Core's API and of HTTP a server might take in another case.
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

// routeOf returns the route of method and canonical path cp (chi's Mux.Find), else other.
// chi's ServeHTTP would copy the request into a new context, which nothing here reads.
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
