package limiter

import (
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// defaultClientKeysMax is the number of client keys each per-client share tracks at
// once when no WithClientKeysMax option says otherwise: the default of mdproxy's
// MDPROXY_CLIENT_KEYS_MAX. At 30 to 60 bytes a key (a Go map doubles as it grows), it
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

// clientCounter is the counter of one per-client share. It holds, for each
// client key, the request counts of the key's last two windows, in one map keyed by a
// seeded 64-bit hash of the key (the key itself is not kept; httprate's own counter
// hashes keys too, and two keys of a share collide with odds of about n²/2⁶⁵, 3e-10
// for 100000 keys). The map holds at most max keys;
// a key beyond them is not tracked (Get answers 0, IncrementBy counts the request as
// untracked), so that the route's global bucket alone decides for it.
//
// Idle keys, whose counts no longer weigh in the sliding window (no request in the
// current window nor the one before), are freed by a sweep that a timer of the clock (AfterFunc) runs every
// sweepEvery while the map holds keys, and never otherwise: an idle share holds no timer
// and no goroutine. The sweep builds a new map of the live keys rather than deleting
// from the old one, since a Go map never shrinks.
//
// allow decides with the sliding window of github.com/go-chi/httprate (v0.16): the
// requests of the window before weigh by the share of it still inside the window, those
// of the current window in full. It is written here, on the bucket's clock, because
// httprate reads time.Now itself and a fake clock could not drive it. Windows are the
// clock's instants truncated to the window, in UTC. A clientCounter is safe for
// concurrent use.
type clientCounter struct {
	window     time.Duration
	max        int
	sweepEvery time.Duration
	seed       maphash.Seed
	clock      clockwork.Clock
	log        *slog.Logger

	mu        sync.Mutex
	keys      map[uint64]clientCount // nil when empty
	timer     clockwork.Timer        // the pending sweep; nil when keys is empty
	untracked uint64                 // requests of keys beyond max, since the start
	warned    uint64                 // untracked when the last warning was logged
}

// clientCount is one key's requests in the window starting at start (UnixNano) and in
// the window before it. Counts saturate at math.MaxInt32.
type clientCount struct {
	start     int64
	cur, prev int32
}

// newClientCounter returns an empty counter for windows of window on clock, tracking at
// most keysMax keys, warning on log.
func newClientCounter(window time.Duration, keysMax int, clock clockwork.Clock, log *slog.Logger) *clientCounter {
	return &clientCounter{
		window:     window,
		max:        keysMax,
		sweepEvery: max(window, minSweepEvery),
		seed:       maphash.MakeSeed(),
		clock:      clock,
		log:        log,
	}
}

// allow decides whether a request of key at now fits in limit requests per window, and
// counts it when it does; counted is the window it was counted in (for giveBack). A
// request refused gets retry, how long until one would fit (see retryIn). The caller
// serializes allow for one share (Bucket.mu), so that the look and the count are one
// step.
func (c *clientCounter) allow(key string, now time.Time, limit int) (counted time.Time, ok bool, retry time.Duration) {
	cur := now.UTC().Truncate(c.window)
	curCount, prevCount, _ := c.Get(key, cur, cur.Add(-c.window))
	elapsed := now.Sub(cur)
	if !c.fits(elapsed, curCount, prevCount, limit) {
		return cur, false, c.retryIn(elapsed, curCount, prevCount, limit)
	}
	_ = c.IncrementBy(key, cur, 1)
	return cur, true, 0
}

// fits reports whether one more request fits in limit at elapsed into a window that
// holds curCount requests after prevCount in the window before: the sliding estimate
// prev*(window-elapsed)/window + cur, rounded as httprate rounds it, plus one, is at
// most limit.
func (c *clientCounter) fits(elapsed time.Duration, curCount, prevCount, limit int) bool {
	rate := float64(prevCount)*float64(c.window-elapsed)/float64(c.window) + float64(curCount)
	return int(math.Round(rate))+1 <= limit
}

// retryIn is how long after now, elapsed into its window, a key with curCount requests
// in that window and prevCount in the one before first fits in limit again, with no
// request meanwhile: the sliding estimate prev*(window-elapsed)/window + cur must fall
// below limit-0.5 (fits rounds it). Within the window the previous count's weight
// fades; if the current count alone is too many, the next window starts with it as its
// previous count, which fades in turn. The instant solved for is then checked with fits
// itself, a nanosecond at a time, since floating point may put it a nanosecond early. A
// Retry-After of one window would be early by up to half a window (RFC 9110, section
// 10.2.3: how long the client ought to wait).
func (c *clientCounter) retryIn(elapsed time.Duration, curCount, prevCount, limit int) time.Duration {
	w := float64(c.window)
	room := float64(limit) - 0.5
	base, cnt, prev := time.Duration(0), curCount, prevCount // the window solved in
	var at float64
	if float64(curCount) < room {
		// prev*(w-e)/w + cur < room  <=>  e > w*(1 - (room-cur)/prev)
		at = w * (1 - (room-float64(curCount))/float64(prevCount))
	} else {
		// The next window: cur*(w-e')/w < room  <=>  e' > w*(1 - room/cur).
		at = w * (1 - room/float64(curCount))
		base, cnt, prev = c.window, 0, curCount
	}
	e := max(time.Duration(math.Floor(at))+1, 0)
	for i := 0; i < 4 && !c.fits(e, cnt, prev, limit); i++ {
		e++
	}
	return max(base+e-elapsed, time.Nanosecond)
}

// Increment counts one request of key in currentWindow.
func (c *clientCounter) Increment(key string, currentWindow time.Time) error {
	return c.IncrementBy(key, currentWindow, 1)
}

// IncrementBy counts amount requests of key in currentWindow. A key not yet tracked
// while max keys are is not added: the request is counted as untracked. It never
// returns an error.
func (c *clientCounter) IncrementBy(key string, currentWindow time.Time, amount int) error {
	h := maphash.String(c.seed, key)
	start := currentWindow.UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.keys[h]
	if !ok {
		if len(c.keys) >= c.max {
			c.untracked++
			return nil
		}
		if c.keys == nil {
			c.keys = make(map[uint64]clientCount)
		}
		if c.timer == nil {
			c.timer = c.clock.AfterFunc(c.sweepEvery, c.sweepNow)
		}
	}
	e = e.rolled(start, c.window)
	e.cur = int32(min(int64(e.cur)+int64(amount), math.MaxInt32))
	c.keys[h] = e
	return nil
}

// Get returns key's requests in currentWindow and in previousWindow; 0, 0 for a key
// not tracked. It never returns an error.
func (c *clientCounter) Get(key string, currentWindow, previousWindow time.Time) (int, int, error) {
	h := maphash.String(c.seed, key)
	c.mu.Lock()
	e, ok := c.keys[h]
	c.mu.Unlock()
	if !ok {
		return 0, 0, nil
	}
	switch start := e.start; start {
	case currentWindow.UnixNano():
		return int(e.cur), int(e.prev), nil
	case previousWindow.UnixNano():
		return 0, int(e.cur), nil
	}
	return 0, 0, nil
}

// giveBack takes back one request of key counted in the window starting at window: a
// request that gave up while it waited for its token, and so never reached Core, does
// not use up its client's share. Nothing happens for a key no longer tracked, or whose
// request no longer weighs in the sliding window.
func (c *clientCounter) giveBack(key string, window time.Time) {
	h := maphash.String(c.seed, key)
	start := window.UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.keys[h]
	switch {
	case !ok:
		return
	case e.start == start && e.cur > 0:
		e.cur--
	case e.start == start+int64(c.window) && e.prev > 0:
		e.prev--
	default:
		return
	}
	c.keys[h] = e
}

// rolled returns e moved to the window starting at start: its counts unchanged when it
// is already there, its current count as the previous one when start is the next
// window, and nothing counted when e is older than that.
func (e clientCount) rolled(start int64, window time.Duration) clientCount {
	switch e.start {
	case start:
		return e
	case start - int64(window):
		return clientCount{start: start, prev: e.cur}
	}
	return clientCount{start: start}
}

// sweepNow is the timer's function.
func (c *clientCounter) sweepNow() { c.sweep(c.clock.Now()) }

// sweep frees the keys idle at now: those whose last window started before the window
// preceding now's, whose requests no longer count. When some are idle it replaces the
// map by one holding only the live keys (nil when none is). It schedules the next sweep
// while keys remain and stops the timer otherwise. It warns once about the requests
// left untracked since the last warning, if any.
func (c *clientCounter) sweep(now time.Time) {
	oldest := now.UTC().Truncate(c.window).Add(-c.window).UnixNano()
	c.mu.Lock()
	live := 0
	for _, e := range c.keys {
		if e.start >= oldest {
			live++
		}
	}
	if live < len(c.keys) {
		var keys map[uint64]clientCount
		if live > 0 {
			keys = make(map[uint64]clientCount, live)
			for h, e := range c.keys {
				if e.start >= oldest {
					keys[h] = e
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

// stats returns the keys tracked now (idle ones included until the next sweep) and the
// requests left untracked since the start.
func (c *clientCounter) stats() (tracked int, untracked uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys), c.untracked
}
