package proxy

import (
	"sync"
	"time"
)

// sweepSet is a set of T that one goroutine visits, each member every period, while the
// set is not empty: what the proxy checks often for many (reads waiting for a batch,
// client connections' read deadlines) without a runtime timer for each. The goroutine
// starts with the first member added and ends once the last is removed. Safe for
// concurrent use.
type sweepSet[T comparable] struct {
	period time.Duration
	visit  func(x T, now time.Time) // called by the sweeping goroutine, without mu

	mu       sync.Mutex
	m        map[T]struct{}
	sweeping bool          // the goroutine runs
	emptied  chan struct{} // the last member was removed: the goroutine may end now
}

func newSweepSet[T comparable](period time.Duration, visit func(T, time.Time)) *sweepSet[T] {
	return &sweepSet[T]{period: period, visit: visit, m: map[T]struct{}{}, emptied: make(chan struct{}, 1)}
}

// add puts x in the set.
func (s *sweepSet[T]) add(x T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[x] = struct{}{}
	if !s.sweeping {
		s.sweeping = true
		go s.sweep()
	}
}

// remove takes x out of the set, if it is there.
func (s *sweepSet[T]) remove(x T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, x)
	if len(s.m) == 0 && s.sweeping {
		select {
		case s.emptied <- struct{}{}:
		default:
		}
	}
}

// sweep visits the members every period until the set is empty.
func (s *sweepSet[T]) sweep() {
	t := time.NewTicker(s.period)
	defer t.Stop()
	var members []T
	for {
		var now time.Time
		select {
		case now = <-t.C:
		case <-s.emptied:
			now = time.Now()
		}
		s.mu.Lock()
		if len(s.m) == 0 {
			s.sweeping = false
			s.mu.Unlock()
			return
		}
		members = members[:0]
		for x := range s.m {
			members = append(members, x)
		}
		s.mu.Unlock()
		for _, x := range members {
			s.visit(x, now)
		}
		clear(members) // nothing removed is kept until the next period
	}
}
