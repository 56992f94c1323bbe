package bridge

import (
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// DefaultAnswerBytes is the size of the answer budget mdproxy runs with: 64 MiB of
// answers held at once for the polls writing them.
const DefaultAnswerBytes = 64 << 20

// Budget bounds, in bytes, the answers to polls that mdproxy holds in memory while the
// clients that asked read them: Core's answers to the polls the bridge sends it (held
// until the last poll sharing one has written it, package proxy) and the results a
// RedisStore reads from Redis for a poll (held until the poll has written it). A slow
// client so holds bytes of the budget rather than more memory. Each holder takes its
// bytes with TryAcquire, which never waits, and gives them back with Release. Safe for
// concurrent use.
type Budget struct {
	sem  *semaphore.Weighted
	max  int64
	held atomic.Int64
}

// NewBudget returns a Budget of size bytes; size <= 0 makes one that takes nothing
// but empty answers.
func NewBudget(size int64) *Budget {
	size = max(size, 0)
	return &Budget{sem: semaphore.NewWeighted(size), max: size}
}

// TryAcquire takes n bytes of the budget and reports whether it could: false, taking
// nothing, when fewer than n are free. n <= 0 always succeeds and takes nothing.
func (b *Budget) TryAcquire(n int64) bool {
	if n <= 0 {
		return true
	}
	if !b.sem.TryAcquire(n) {
		return false
	}
	b.held.Add(n)
	return true
}

// Release gives back n bytes taken with TryAcquire; n <= 0 does nothing. Giving back
// more than was taken panics (golang.org/x/sync/semaphore's rule).
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.held.Add(-n)
	b.sem.Release(n)
}

// Held returns the bytes taken now, from 0 to Max.
func (b *Budget) Held() int64 { return b.held.Load() }

// Max returns the budget's size in bytes.
func (b *Budget) Max() int64 { return b.max }
