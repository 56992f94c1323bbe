package limiter

import (
	"hash/maphash"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// defaultClientKeysMax is the number of client keys each per-client share tracks at
// once when no WithClientKeysMax option says otherwise: the default of mdproxy's
// MDPROXY_CLIENT_KEYS_MAX. At 20 to 40 bytes a key (a Go map doubles as it grows), it
// bounds a share to a few MiB.
const defaultClientKeysMax = 100_000

// minSweepEvery is the shortest period of the sweep of idle client keys: a client window
// of a few milliseconds must not make the sweep run that often.
const minSweepEvery = time.Second

// Option tunes NewBucket and NewSet.
type Option func(*options)

type options struct {
	clientKeysMax int
	logger        *slog.Logger
	redis         *Redis
}

func newOptions(opts []Option) options {
	o := options{clientKeysMax: defaultClientKeysMax}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// WithClientKeysMax bounds the client keys that each per-client share tracks at once to
// n (see Bucket for what a key beyond the bound gets). n <= 0 keeps the default,
// 100,000.
func WithClientKeysMax(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.clientKeysMax = n
		}
	}
}

// WithRedis makes NewSet and Update build a RedisBucket on r for each limited route
// instead of a local Bucket. nil, the default, keeps local buckets.
func WithRedis(r *Redis) Option {
	return func(o *options) { o.redis = r }
}

// WithLogger is where a per-client share warns that requests passed untracked because
// it held its bound of client keys: at most once per sweep, that is once a client window
// (once a second for windows shorter than that). NewSet adds the route's name to it.
// nil, the default, discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// clientShare is one route's per-client share: a GCRA (see gcra) per client key, the
// key's theoretical arrival time in one map keyed by a seeded 64-bit hash of the key
// (the key itself is not kept; two keys of a share collide with odds of about n²/2⁶⁵,
// 3e-10 for 100000 keys). A key whose bucket is full again (tat at or before now)
// decides as a missing key does, so it is freed. The map holds at most max keys; a key
// beyond them is not tracked, so that the route's global bucket alone decides for it
// (its request counted as untracked).
//
// The keys whose bucket is full again are freed by a sweep that a timer of the clock
// (AfterFunc) runs every sweepEvery while the map holds keys, and never otherwise: an
// idle share holds no timer and no goroutine. The sweep builds a new map of the live
// keys rather than deleting from the old one, since a Go map never shrinks.
//
// Its instants are nanoseconds on its bucket's time line (Bucket.now: since base). A
// clientShare is safe for concurrent use.
type clientShare struct {
	limit      gcra
	max        int
	sweepEvery time.Duration
	seed       maphash.Seed
	clock      clockwork.Clock
	base       time.Time // the origin of the bucket's time line
	log        *slog.Logger

	mu        sync.Mutex
	keys      map[uint64]int64 // tat by key hash; nil when empty
	timer     clockwork.Timer  // the pending sweep; nil when keys is empty
	untracked uint64           // requests of keys beyond max, since the start
	warned    uint64           // untracked when the last warning was logged
}

// newClientShare returns an empty share of limit (a clientGCRA of window), on clock
// from base, tracking at most keysMax keys, warning on log.
func newClientShare(limit gcra, window time.Duration, keysMax int, clock clockwork.Clock, base time.Time, log *slog.Logger) *clientShare {
	return &clientShare{
		limit:      limit,
		max:        keysMax,
		sweepEvery: max(window, minSweepEvery),
		seed:       maphash.MakeSeed(),
		clock:      clock,
		base:       base,
		log:        log,
	}
}

// allow decides whether a request of key at now fits in its share, and counts it when
// it does. A request refused gets retry, how long until the key's next token: exactly
// when a request first fits again (RFC 9110, section 10.2.3: how long the client ought
// to wait). The caller serializes allow for one share (Bucket.mu), so that the look and
// the count are one step.
func (c *clientShare) allow(key string, now int64) (ok bool, retry time.Duration) {
	h := maphash.String(c.seed, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	tat, tracked := c.keys[h]
	if clamped := c.limit.clamp(tat, now); clamped != tat {
		tat = clamped
		c.keys[h] = tat // kept, or the next request would find it as far ahead
	}
	if d := c.limit.delay(tat, now); d > 0 {
		return false, d
	}
	if !tracked && len(c.keys) >= c.max {
		c.untracked++
		return true, 0
	}
	if c.keys == nil {
		c.keys = make(map[uint64]int64)
	}
	if c.timer == nil {
		c.timer = c.clock.AfterFunc(c.sweepEvery, c.sweepNow)
	}
	c.keys[h] = c.limit.take(tat, now)
	return true, 0
}

// giveBack takes back the last request counted for key: a request that gave up while
// it waited for its token, and so never reached Core, does not use up its client's
// share. Nothing happens for a key no longer tracked (its bucket is full).
func (c *clientShare) giveBack(key string) {
	h := maphash.String(c.seed, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if tat, ok := c.keys[h]; ok {
		c.keys[h] = c.limit.giveBack(tat)
	}
}

// sweepNow is the timer's function.
func (c *clientShare) sweepNow() { c.sweep(int64(c.clock.Now().Sub(c.base))) }

// sweep frees the keys whose bucket is full at now (tat at or before now). The timer's
// goroutine may read now before requests taken later reach the map, so now may be
// older than theirs: a key full at now is full then too. When some are freed, it
// replaces the map by one holding only the others (nil when none is). It
// schedules the next sweep while keys remain and stops the timer otherwise. It warns
// once about the requests left untracked since the last warning, if any.
func (c *clientShare) sweep(now int64) {
	c.mu.Lock()
	live := 0
	for _, tat := range c.keys {
		if tat > now {
			live++
		}
	}
	if live < len(c.keys) {
		var keys map[uint64]int64
		if live > 0 {
			keys = make(map[uint64]int64, live)
			for h, tat := range c.keys {
				if tat > now {
					keys[h] = tat // not clamped: now may be older than the last request's
				}
			}
		}
		c.keys = keys
	}
	switch {
	case len(c.keys) == 0 && c.timer != nil:
		c.timer.Stop()
		c.timer = nil
	case len(c.keys) > 0 && c.timer != nil:
		c.timer.Reset(c.sweepEvery)
	case len(c.keys) > 0:
		c.timer = c.clock.AfterFunc(c.sweepEvery, c.sweepNow)
	}
	untracked := c.untracked - c.warned
	c.warned = c.untracked
	tracked := len(c.keys)
	c.mu.Unlock()
	if untracked > 0 {
		c.log.Warn("per-client share full: requests of new client keys passed without a per-client check, the route's bucket still applied",
			"client_keys_max", c.max, "client_keys", tracked, "untracked_requests", untracked)
	}
}

// stats returns the keys tracked now (full ones included until the next sweep) and the
// requests left untracked since the start.
func (c *clientShare) stats() (tracked int, untracked uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys), c.untracked
}
