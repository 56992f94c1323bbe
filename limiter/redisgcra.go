package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
)

// gcraScript is the GCRA of gcra run in Redis, on Redis's own clock (TIME), in integer
// microseconds: Unix microseconds are about 1.8e15, well within the 2^53 up to which a
// Lua number (a double) holds every integer, so that no step rounds. A key holds
// "<tat>:<generation>": the theoretical arrival time, and the instant (Unix µs) the key
// was created, which names one life of the key.
//
// KEYS[1] is the bucket's key. ARGV: the interval and the offset in µs (the bucket's
// tokens, with those of the longest wait, times the interval: the furthest ahead tat
// may be), the cost (1 takes a token; -1 gives the last one back, never beyond a full
// bucket), and the caller's view of the key: the tat and generation it last saw (0 0:
// none).
//
// Redis may drop a key before its time: eviction under maxmemory (every policy but
// noeviction may pick it, volatile-* ones because it has a TTL), FLUSHALL, a restart
// without persistence. A bucket would come back full. The key expires naturally only
// once its tat has passed and then a full offset more, while the tat of any view is at
// most the key's tat plus the tokens given back since (which the offset bounds), so a
// view still ahead of now with the key gone, or with a key of another generation than
// the view's (dropped, then created again by a caller that knew nothing), can only mean
// the key was lost: the script takes the view's tat (restored), keeps it and says so.
// With several callers each restores its own view, and the key follows the furthest.
// Within one generation the key is right, views are ignored, and tokens given back
// stay given back.
//
// Redis's clock may step back too: the tat is clamped to now + offset, and kept so, so
// that a step back never refuses for longer than one refill of the bucket and its wait.
//
// It returns {allowed (1 or 0), retry after (µs until a refused request would be
// allowed; 0 when allowed), reset after (µs until the bucket is full), tat, generation
// (0 when there is no key), restored (1 or 0)}.
var gcraScript = redis.NewScript(`
redis.replicate_commands()
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local offset = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local view_tat = tonumber(ARGV[4])
local view_gen = tonumber(ARGV[5])

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local tat, gen = now, now
local v = redis.call("GET", key)
if v then
  local a, g = string.match(v, "^(%d+):(%d+)$")
  if a then
    tat, gen = tonumber(a), tonumber(g)
  else
    v = false
  end
end
local restored = 0
if view_tat > now and view_tat > tat and (not v or gen ~= view_gen) then
  tat = view_tat
  restored = 1
end
local clamped = tat > now + offset
tat = math.min(math.max(tat, now), now + offset)

local function save(new)
  local ttl = math.floor((new - now + offset) / 1000) + 1
  redis.call("SET", key, string.format("%d:%d", new, gen), "PX", string.format("%d", ttl))
end

if cost > 0 then
  local new = tat + interval
  local allow_at = new - offset
  if allow_at > now then
    if restored == 1 or clamped then
      save(tat)
    end
    return {0, allow_at - now, tat - now, tat, gen, restored}
  end
  save(new)
  return {1, 0, new - now, new, gen, restored}
end
if not v and restored == 0 then
  return {1, 0, 0, now, 0, 0}
end
local new = math.max(tat - interval, now)
save(new)
return {1, 0, new - now, new, gen, restored}
`)

// maxRedisOffset bounds a Redis bucket's offset, in µs (about 71 years), so that Unix
// microseconds plus twice the offset stay below 2^53, exact in Lua's doubles.
const maxRedisOffset = int64(1) << 51

// redisLimit is one GCRA in Redis, in µs: an interval (at least 1) and the offset (the
// tokens of the burst and of the longest wait, times the interval, capped at
// maxRedisOffset). The zero redisLimit is none.
type redisLimit struct {
	interval, offset int64
}

// newRedisLimit returns the limit of interval µs (at least 1) and tokens (>= 1).
func newRedisLimit(interval int64, tokens int) redisLimit {
	interval = max(interval, 1)
	offset := maxRedisOffset
	if int64(tokens) < offset/interval {
		offset = int64(tokens) * interval
	}
	return redisLimit{interval: interval, offset: offset}
}

// tag names l in a key: its interval and offset in µs.
func (l redisLimit) tag() string { return fmt.Sprintf("%d/%d", l.interval, l.offset) }

// view is what a replica last saw of one key in Redis: its tat (Unix µs on Redis's
// clock) and generation (0: no key). The zero view is none.
type view struct{ tat, gen int64 }

// merge returns the view to keep after seeing next: within one generation the
// furthest tat seen (answers of concurrent calls arrive in any order), else next.
func (v view) merge(next view) view {
	if next.gen == v.gen {
		next.tat = max(next.tat, v.tat)
	}
	return next
}

// gcraResult is the answer of one run of gcraScript.
type gcraResult struct {
	allowed    bool
	retryAfter time.Duration // until a refused request would be allowed
	resetAfter time.Duration // until the bucket is full
	view       view
	restored   bool
}

// runGCRA runs gcraScript on key with l, cost (1 or -1) and v, the caller's last view
// of the key. Its error is Redis's, or one saying that the answer was not the script's.
func runGCRA(ctx context.Context, rdb redis.Scripter, key string, l redisLimit, cost int, v view) (gcraResult, error) {
	vals, err := gcraScript.Run(ctx, rdb, []string{key}, l.interval, l.offset, cost, v.tat, v.gen).Int64Slice()
	if err != nil {
		return gcraResult{}, err
	}
	if len(vals) != 6 {
		return gcraResult{}, fmt.Errorf("limiter: GCRA script answered %d values, want 6", len(vals))
	}
	return gcraResult{
		allowed:    vals[0] == 1,
		retryAfter: time.Duration(vals[1]) * time.Microsecond,
		resetAfter: time.Duration(vals[2]) * time.Microsecond,
		view:       view{tat: vals[3], gen: vals[4]},
		restored:   vals[5] == 1,
	}, nil
}

// viewCell is a route's bucket's view. Safe for concurrent use.
type viewCell struct {
	mu sync.Mutex
	v  view
}

func (c *viewCell) load() view {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}

func (c *viewCell) store(next view) {
	c.mu.Lock()
	c.v = c.v.merge(next)
	c.mu.Unlock()
}

// clientViews holds a replica's views of the per-client shares' keys in Redis, by a
// 64-bit digest of the client key, at most max of them: the last view of each client
// it decided for. A view is useful only while its tat is ahead of Redis's clock, after
// which the script ignores it: it expires then (on the replica's clock, from the reset
// after of the answer that brought it). When max views are held, the expired ones are
// freed at most once a second; while none is, a new client's view is not kept (its key
// goes unguarded against loss, as before there were views). Safe for concurrent use.
type clientViews struct {
	max   int
	clock clockwork.Clock
	base  time.Time

	mu        sync.Mutex
	m         map[uint64]clientView
	nextSweep int64 // ns since base: no sweep before
}

// clientView is a view and when it expires, in ns since the views' base.
type clientView struct {
	view
	expires int64
}

// sweepEvery is how often, at most, a full clientViews looks for expired views.
const viewSweepEvery = int64(time.Second)

func newClientViews(max int, clock clockwork.Clock) *clientViews {
	return &clientViews{max: max, clock: clock, base: clock.Now()}
}

func (c *clientViews) now() int64 { return int64(c.clock.Now().Sub(c.base)) }

// get returns the view of the client of digest h; none when unknown or expired.
func (c *clientViews) get(h uint64) view {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cv, ok := c.m[h]; ok && cv.expires > now {
		return cv.view
	}
	return view{}
}

// put keeps what the answer r told of the client of digest h.
func (c *clientViews) put(h uint64, r gcraResult) {
	now := c.now()
	expires := now + int64(r.resetAfter)
	c.mu.Lock()
	defer c.mu.Unlock()
	cv, ok := c.m[h]
	if !ok && r.resetAfter <= 0 {
		return // a full bucket: nothing to guard
	}
	if !ok && len(c.m) >= c.max {
		if now < c.nextSweep {
			return
		}
		c.nextSweep = now + viewSweepEvery
		c.sweep(now)
		if len(c.m) >= c.max {
			return
		}
	}
	if c.m == nil {
		c.m = make(map[uint64]clientView)
	}
	if cv.expires <= now || cv.gen != r.view.gen {
		cv = clientView{} // expired, or of a key lost since
	}
	c.m[h] = clientView{view: cv.view.merge(r.view), expires: max(cv.expires, expires)}
}

// sweep frees the views expired at now, in a new map (a Go map never shrinks). The
// caller holds c.mu.
func (c *clientViews) sweep(now int64) {
	live := make(map[uint64]clientView, len(c.m)/2)
	for h, cv := range c.m {
		if cv.expires > now {
			live[h] = cv
		}
	}
	c.m = live
}

// len returns the views held (expired ones included until a sweep).
func (c *clientViews) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// routeRedisLimit is the Redis limit of a route's bucket: rate tokens per second (an
// interval rounded to the µs), burst plus waitTokens tokens.
func routeRedisLimit(rate float64, burst, waitTokens int) redisLimit {
	return newRedisLimit(int64(math.Round(1e6/rate)), burst+waitTokens)
}

// clientRedisLimit is the Redis limit of a per-client share: limit per window, a burst
// of limit, an interval rounded up to the µs (as clientGCRA's to the ns).
func clientRedisLimit(limit int, window time.Duration) redisLimit {
	per := int64(limit) * int64(time.Microsecond)
	return newRedisLimit((int64(window)+per-1)/per, limit)
}
