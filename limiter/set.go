package limiter

import (
	"fmt"
	"slices"

	"github.com/jonboulle/clockwork"
)

// Set is the Limiter of every route, keyed by route name: a Bucket, or a RedisBucket
// when the Set was built WithRedis. A route without one is unlimited. A Set is
// read-only after NewSet and safe for concurrent use; Update returns a new Set rather
// than changing one.
type Set struct {
	limiters map[string]Limiter
	// limits is each route's Limit as given to NewSet or Update, before Burst is filled
	// in: what Update compares.
	limits map[string]Limit
	clock  clockwork.Clock
	opts   []Option
}

// NewSet builds one Limiter per entry of limits (route name to Limit), all on clock
// (nil means the real clock), with opts (each bucket's logger gets a route attribute):
// a Bucket each, or a RedisBucket each WithRedis. It returns the first invalid limit's
// error, naming its route.
func NewSet(limits map[string]Limit, clock clockwork.Clock, opts ...Option) (*Set, error) {
	return newSet(limits, nil, clock, opts)
}

// Update returns a Set for limits (route name to Limit) that keeps, for each route
// whose Limit acts the same as in s (a Burst of 0 and one of ceil(Rate) are the same,
// and so are two that differ only in a setting without effect, such as ClientWindow
// without a ClientLimit),
// s's own Limiter with its tokens, waiting requests and per-client counts, and builds a
// new, full one for each route whose Limit changed, on s's clock and options (on
// Redis, a changed limit has new keys, the old ones expiring; an unchanged one keeps
// its keys and their state).
// changed lists, sorted, the routes whose Limit changed, appeared or disappeared. s
// itself is not changed: requests holding one of its Limiters finish on it. It returns
// the first invalid limit's error, naming its route, and a nil Set then. Update of a nil
// Set is NewSet(limits, nil).
func (s *Set) Update(limits map[string]Limit) (next *Set, changed []string, err error) {
	if s == nil {
		s = &Set{}
	}
	next, err = newSet(limits, s, s.clock, s.opts)
	if err != nil {
		return nil, nil, err
	}
	for route, l := range limits {
		if old, ok := s.limits[route]; !ok || old.acts() != l.acts() {
			changed = append(changed, route)
		}
	}
	for route := range s.limits {
		if _, ok := limits[route]; !ok {
			changed = append(changed, route)
		}
	}
	slices.Sort(changed)
	return next, changed, nil
}

// newSet builds the Set of limits, taking from prev (nil: none) the Limiter of each
// route whose Limit is unchanged.
func newSet(limits map[string]Limit, prev *Set, clock clockwork.Clock, opts []Option) (*Set, error) {
	o := newOptions(opts)
	s := &Set{
		limiters: make(map[string]Limiter, len(limits)),
		limits:   make(map[string]Limit, len(limits)),
		clock:    clock,
		opts:     slices.Clone(opts),
	}
	for route, l := range limits {
		// Validate before skipping unlimited limits: Rate 0 with Burst -1 is invalid too.
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("route %s: %w", route, err)
		}
		s.limits[route] = l
		if l.Unlimited() {
			continue
		}
		if prev != nil && prev.limiters[route] != nil && prev.limits[route].acts() == l.acts() {
			s.limiters[route] = prev.limiters[route]
			continue
		}
		routeOpts := append(slices.Clip(opts), WithLogger(o.logger.With("route", route)))
		var lim Limiter
		var err error
		if o.redis != nil {
			lim, err = o.redis.bucket(route, l, clock, routeOpts)
		} else {
			lim, err = NewBucket(l, clock, routeOpts...)
		}
		if err != nil {
			return nil, fmt.Errorf("route %s: %w", route, err)
		}
		s.limiters[route] = lim
	}
	return s, nil
}

// Limiter returns the Limiter of route, or nil (unlimited) when the route has none.
func (s *Set) Limiter(route string) Limiter {
	if s == nil {
		return nil
	}
	return s.limiters[route]
}

// SetRate sets the rate of route's bucket to rate, in requests per second, clamped to
// the route's Floor and its configured Rate, keeping the bucket's state: a Bucket keeps
// the tokens it misses, a RedisBucket its shared bucket in Redis and the time it takes
// to be full (every replica of a fleet puts the same rate in force). It returns an
// error when route has no rate. Safe for concurrent use; Update builds the route's
// bucket anew at its configured rate when its Limit changed.
func (s *Set) SetRate(route string, rate float64) error {
	if s == nil {
		return fmt.Errorf("route %s: no rate to set", route)
	}
	conf := s.limits[route].effective()
	rate = min(max(rate, conf.Floor()), conf.Rate)
	switch b := s.Limiter(route).(type) {
	case *Bucket:
		if b != nil && b.limited() {
			b.setRate(rate)
			return nil
		}
	case *RedisBucket:
		if b != nil && b.limit.Rate > 0 {
			b.setRate(rate)
			return nil
		}
	}
	return fmt.Errorf("route %s: no rate to set", route)
}

// Configured returns route's Limit as given to NewSet or Update, as it acts (Burst
// filled in), whatever SetRate did since, and whether the route has a limit.
func (s *Set) Configured(route string) (Limit, bool) {
	if s == nil {
		return Limit{}, false
	}
	l, ok := s.limits[route]
	return l.effective(), ok && !l.Unlimited()
}

// Limit returns the Limit in force on route, Burst filled in; the zero Limit when the
// route is unlimited.
func (s *Set) Limit(route string) Limit {
	if l := s.Limiter(route); l != nil {
		return l.Limit()
	}
	return Limit{}
}

// ClientKeys calls f once for each route with a per-client share in this process, in
// no set order, with what the route's local bucket reports (for a RedisBucket, its
// fallback's): the client keys tracked now and the requests let through untracked since
// the start. It serves metrics at scrape time. Safe for concurrent use.
func (s *Set) ClientKeys(f func(route string, tracked int, untracked uint64)) {
	if s == nil {
		return
	}
	for route, l := range s.limiters {
		var b *Bucket
		switch l := l.(type) {
		case *Bucket:
			b = l
		case *RedisBucket:
			b = l.fallback
		}
		if tracked, untracked, ok := b.clientKeys(); ok {
			f(route, tracked, untracked)
		}
	}
}
