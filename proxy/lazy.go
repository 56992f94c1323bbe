package proxy

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/metrics"
)

// lazy is a metric child created when it is first used, so that a route exports no
// series for what never happened on it (issue 13: a fleet of sidecars scraped by one
// Prometheus pays for every series). get is one atomic load once the child exists.
// Safe for concurrent use: two first uses may both ask the vector, which answers the
// same child.
type lazy[T any] struct {
	make func() T
	v    atomic.Pointer[T]
}

func newLazy[T any](make func() T) *lazy[T] { return &lazy[T]{make: make} }

// get returns the child, creating it on the first call.
func (l *lazy[T]) get() T {
	if p := l.v.Load(); p != nil {
		return *p
	}
	v := l.make()
	l.v.CompareAndSwap(nil, &v)
	return *l.v.Load()
}

// made reports whether the child exists.
func (l *lazy[T]) made() bool { return l.v.Load() != nil }

// counterOf returns the lazy child of vec for labels.
func counterOf(vec *prometheus.CounterVec, labels ...string) *lazy[prometheus.Counter] {
	return newLazy(func() prometheus.Counter { return vec.WithLabelValues(labels...) })
}

// codeCounters holds the children of a counter vector labelled by route and status
// code (and, for requests, method), created as codes appear: the map lookup of a
// known code does not allocate, where WithLabelValues would format the code and hash
// the labels at every request. Safe for concurrent use.
type codeCounters struct {
	vec   *prometheus.CounterVec
	route string
	byKey sync.Map // uint32(method index<<16 | code) -> *codeMemo
	// last is the key counted last: a route answers runs of the same method and code
	// (a poll storm, its limit answers), and one atomic load then finds the counter.
	last atomic.Pointer[codeMemo]
}

// codeMemo is a key of codeCounters.byKey and its counter, made once per key.
type codeMemo struct {
	key uint32
	ctr prometheus.Counter
}

// inc counts one answer of code to a request of method ("" for a vector without a
// method label).
func (c *codeCounters) inc(method string, code int) {
	key := uint32(code) & 0xffff
	mi := len(metrics.Methods) + 1 // no method label
	if method != "" {
		mi = methodIndex(method)
	}
	key |= uint32(mi) << 16
	m := c.last.Load()
	if m == nil || m.key != key {
		if v, ok := c.byKey.Load(key); ok {
			m = v.(*codeMemo)
		} else {
			m = &codeMemo{key: key}
			if method == "" {
				m.ctr = c.vec.WithLabelValues(c.route, strconv.Itoa(code))
			} else {
				m.ctr = c.vec.WithLabelValues(c.route, metrics.Method(method), strconv.Itoa(code))
			}
			v, _ := c.byKey.LoadOrStore(key, m)
			m = v.(*codeMemo)
		}
		c.last.Store(m)
	}
	m.ctr.Inc()
}

// methodIndex is the index of method in metrics.Methods, len(metrics.Methods) for
// OTHER.
func methodIndex(method string) int {
	for i, m := range metrics.Methods {
		if m == method {
			return i
		}
	}
	return len(metrics.Methods)
}
