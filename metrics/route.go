package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Decisions are the values of the decision label of Metrics.Decisions: the limiter's
// outcomes (limiter.Outcome's String, in its order) and, for polls the bridge answered
// without asking the limiter, none.
var Decisions = []string{"allowed", "delayed", "rejected", "rejected_client", "canceled", "would_reject", "exempt"}

// Kinds are the values of the kind label of Metrics.UpstreamErrors.
var Kinds = []string{KindRefused, KindReset, KindTimeout, KindCanceled, KindOther}

// Bridge poll sources, the values of the source label of Metrics.BridgePolls.
const (
	SourceStore   = "store"   // a final result the proxy kept
	SourcePending = "pending" // the scan is not over: Core not asked
	SourceCore    = "core"    // Core was asked
)

// Route is the metrics of one route, made once per route by Metrics.Route: one method
// per event, label values from fixed sets. A child is created at its first use (a route
// never used exports no series, one never limited no limit gauges), then found with one
// atomic load. Safe for concurrent use.
type Route struct {
	requests, upstreamCodes     *codeCounters
	decisions                   [7]*lazy[prometheus.Counter]         // by index in Decisions
	upstreamErrors              [5]*lazy[prometheus.Counter]         // by index in Kinds
	bodyTimeouts                map[string]*lazy[prometheus.Counter] // by peer
	duration, upstreamDuration  *lazy[prometheus.Observer]
	inFlight                    *lazy[prometheus.Gauge]
	requestBytes, responseBytes *lazy[prometheus.Counter]
	limitRate, limitBurst       *lazy[prometheus.Gauge]
	limitMaxWait                *lazy[prometheus.Gauge]
	bridgePolls                 map[string]prometheus.Counter // by source; nil: no bridge
}

// Route returns the metrics of the route name; call it once per route.
func (m *Metrics) Route(name string) *Route {
	r := &Route{
		requests:         &codeCounters{vec: m.Requests, route: name, method: true},
		upstreamCodes:    &codeCounters{vec: m.UpstreamResponses, route: name},
		bodyTimeouts:     map[string]*lazy[prometheus.Counter]{},
		duration:         newLazy(func() prometheus.Observer { return m.Duration.WithLabelValues(name) }),
		upstreamDuration: newLazy(func() prometheus.Observer { return m.UpstreamDuration.WithLabelValues(name) }),
		inFlight:         newLazy(func() prometheus.Gauge { return m.InFlight.WithLabelValues(name) }),
		requestBytes:     counterOf(m.RequestBytes, name),
		responseBytes:    counterOf(m.ResponseBytes, name),
		limitRate:        newLazy(func() prometheus.Gauge { return m.LimitRate.WithLabelValues(name) }),
		limitBurst:       newLazy(func() prometheus.Gauge { return m.LimitBurst.WithLabelValues(name) }),
		limitMaxWait:     newLazy(func() prometheus.Gauge { return m.LimitMaxWait.WithLabelValues(name) }),
	}
	for i, d := range Decisions {
		r.decisions[i] = counterOf(m.Decisions, name, d)
	}
	for i, k := range Kinds {
		r.upstreamErrors[i] = counterOf(m.UpstreamErrors, name, k)
	}
	for _, peer := range []string{PeerClient, PeerCore} {
		r.bodyTimeouts[peer] = counterOf(m.BodyTimeouts, name, peer)
	}
	return r
}

// WithBridgePolls makes r count the bridge's polls (every source's series made now at
// 0) and returns r. Call it before r is used.
func (r *Route) WithBridgePolls(m *Metrics) *Route {
	r.bridgePolls = map[string]prometheus.Counter{}
	for _, src := range []string{SourceStore, SourcePending, SourceCore} {
		r.bridgePolls[src] = m.BridgePolls.WithLabelValues(src)
	}
	return r
}

// Started counts a request in flight on the route, until Done.
func (r *Route) Started() { r.inFlight.get().Inc() }

// Done ends what Started counted.
func (r *Route) Done() { r.inFlight.get().Dec() }

// Answered counts a request answered: its method (OTHER when not in Methods), the status
// sent (499: the client left), the body bytes sent and the time taken.
func (r *Route) Answered(method string, code int, bytes int64, elapsed time.Duration) {
	r.requests.inc(method, code)
	if bytes > 0 {
		r.responseBytes.get().Add(float64(bytes))
	}
	r.duration.get().Observe(elapsed.Seconds())
}

// Decided counts a decision, one of Decisions; any other is not counted.
func (r *Route) Decided(decision string) {
	for i, d := range Decisions {
		if d == decision {
			r.decisions[i].get().Inc()
			return
		}
	}
}

// RequestBytes counts n bytes of a request body sent to Core.
func (r *Route) RequestBytes(n int64) {
	if n > 0 {
		r.requestBytes.get().Add(float64(n))
	}
}

// UpstreamAnswered counts Core's answer of status code, its headers in after elapsed.
func (r *Route) UpstreamAnswered(code int, elapsed time.Duration) {
	r.upstreamDuration.get().Observe(elapsed.Seconds())
	r.upstreamCodes.inc("", code)
}

// UpstreamError counts a failed exchange with Core of kind (Kinds; else KindOther).
func (r *Route) UpstreamError(kind string) {
	for i, k := range Kinds {
		if k == kind {
			r.upstreamErrors[i].get().Inc()
			return
		}
	}
	r.upstreamErrors[len(Kinds)-1].get().Inc()
}

// BodyTimeout counts an exchange cut because peer (PeerClient, PeerCore) made no progress.
func (r *Route) BodyTimeout(peer string) {
	if c := r.bodyTimeouts[peer]; c != nil {
		c.get().Inc()
	}
}

// BridgePoll counts a poll the bridge answered by its source: "store", "pending", or
// "miss" and "overdue" (Core asked: "core"). Nothing without WithBridgePolls.
func (r *Route) BridgePoll(source string) {
	switch source {
	case "miss", "overdue":
		source = SourceCore
	}
	if c := r.bridgePolls[source]; c != nil {
		c.Inc()
	}
}

// SetLimit sets the limit gauges: rate in requests a second, burst, the longest wait;
// limited false sets a route that had a limit to 0, and makes nothing for one never
// limited.
func (r *Route) SetLimit(limited bool, rate float64, burst int, maxWait time.Duration) {
	if !limited {
		if !r.limitRate.made() {
			return
		}
		rate, burst, maxWait = 0, 0, 0
	}
	r.limitRate.get().Set(rate)
	r.limitBurst.get().Set(float64(burst))
	r.limitMaxWait.get().Set(maxWait.Seconds())
}

// lazy is a metric child created at its first use. Safe for concurrent use: two first
// uses get the same child from the vector.
type lazy[T any] struct {
	make func() T
	v    atomic.Pointer[T]
}

func newLazy[T any](make func() T) *lazy[T] { return &lazy[T]{make: make} }

func (l *lazy[T]) get() T {
	if p := l.v.Load(); p != nil {
		return *p
	}
	v := l.make()
	l.v.CompareAndSwap(nil, &v)
	return *l.v.Load()
}

func (l *lazy[T]) made() bool { return l.v.Load() != nil }

// counterOf returns the lazy child of vec for labels.
func counterOf(vec *prometheus.CounterVec, labels ...string) *lazy[prometheus.Counter] {
	return newLazy(func() prometheus.Counter { return vec.WithLabelValues(labels...) })
}

// codeCounters holds the children of a vector labelled by route, (method,) and code, made
// as they appear: WithLabelValues would format and hash at every request. Safe for
// concurrent use.
type codeCounters struct {
	vec    *prometheus.CounterVec
	route  string
	method bool                     // the vector has a method label, between route and code
	byKey  sync.Map                 // uint32(method index<<16 | code) -> *codeMemo
	last   atomic.Pointer[codeMemo] // a route answers runs of one method and code
}

type codeMemo struct {
	key uint32
	ctr prometheus.Counter
}

func (c *codeCounters) inc(method string, code int) {
	mi := 0
	if c.method {
		mi = methodIndex(method)
	}
	key := uint32(mi)<<16 | uint32(code)&0xffff
	m := c.last.Load()
	if m == nil || m.key != key {
		if v, ok := c.byKey.Load(key); ok {
			m = v.(*codeMemo)
		} else {
			m = &codeMemo{key: key}
			if c.method {
				m.ctr = c.vec.WithLabelValues(c.route, Method(method), strconv.Itoa(code))
			} else {
				m.ctr = c.vec.WithLabelValues(c.route, strconv.Itoa(code))
			}
			v, _ := c.byKey.LoadOrStore(key, m)
			m = v.(*codeMemo)
		}
		c.last.Store(m)
	}
	m.ctr.Inc()
}

func methodIndex(method string) int {
	for i, m := range Methods {
		if m == method {
			return i
		}
	}
	return len(Methods)
}
