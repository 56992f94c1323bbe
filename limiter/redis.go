package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Mode says where a process's limits are decided.
type Mode int32

const (
	// ModeLocal: in the process, each replica on its own (no Redis configured).
	ModeLocal Mode = iota
	// ModeRedis: in Redis, shared by every replica on it.
	ModeRedis
	// ModeFallback: Redis is configured but did not answer; each replica decides with
	// its local bucket at Rate/Replicas until Redis answers again.
	ModeFallback
)

// Modes lists every Mode, for metrics that export one series a mode.
var Modes = []Mode{ModeLocal, ModeRedis, ModeFallback}

// String returns the mode's metric label: local, redis or fallback.
func (m Mode) String() string {
	switch m {
	case ModeLocal:
		return "local"
	case ModeRedis:
		return "redis"
	case ModeFallback:
		return "fallback"
	}
	return "unknown"
}

// RedisOptions tunes NewRedis. The zero value is usable.
type RedisOptions struct {
	// Prefix starts every key mdproxy writes ("mdproxy:" when empty): a route's bucket
	// is the key "<Prefix>limit:<route>:<limit>" and a client's share
	// "<Prefix>client:<route>:<limit>:<SHA-256 of the client key, 32 hex digits>",
	// <limit> naming the GCRA's interval and offset in µs.
	Prefix string
	// Timeout is the deadline of each Redis call of a decision (50 ms when 0). A call
	// that misses it counts as Redis not answering.
	Timeout time.Duration
	// Replicas is how many replicas share the Redis (1 when 0): in fallback each one's
	// local bucket runs at Rate/Replicas, Burst/Replicas (rounded down, at least 1) and
	// ClientLimit/Replicas (rounded up), so that the replicas together stay within the
	// configured limit.
	Replicas int
	// FailuresToFallback is how many Redis calls in a row must fail before the limits
	// move to fallback (3 when 0). Each failed call decides its own request locally.
	FailuresToFallback int
	// RetryEvery is how long the limits stay in fallback before one request tries
	// Redis again (1 s when 0); when it succeeds, they are shared again.
	RetryEvery time.Duration
	// Logger gets one line on each change of mode, never one per request (nil
	// discards).
	Logger *slog.Logger
}

// Redis decides the limits of every route in Redis, for all the replicas that use the
// same Redis and Prefix: each route's token bucket and each client's share is a GCRA
// (generic cell rate algorithm, the arithmetic of the local buckets), whose state is
// one key holding its theoretical arrival time, kept by a Lua script (gcraScript) on
// Redis's own clock in integer microseconds, and expired by Redis once the bucket has
// been full for as long as it takes to empty.
//
// A key that Redis drops before its time (evicted under maxmemory, flushed, lost in a
// restart) would make a full bucket. Each replica keeps its last view of each key
// (the route's bucket; the shares of at most WithClientKeysMax clients a route) and
// passes it with every call; the script restores a view still ahead of Redis's clock
// into a lost key, and the replica counts it (Restores) and logs it at most once a
// minute. With one replica a lost key thus comes back as it was; with several, each
// restores its own last view and the key follows the furthest.
//
// It fails open, within bounds: a decision whose Redis call fails or misses Timeout is
// taken by the route's local bucket instead (RedisBucket), and after
// FailuresToFallback such calls in a row a circuit breaker (github.com/sony/gobreaker
// v2) sends every decision to the local buckets, without asking Redis, until a request
// sent after RetryEvery finds Redis answering. A Redis outage thus costs clients no
// error and at most Timeout of latency on the calls that find it. Mode tells where
// decisions go. A Redis is safe for concurrent use.
type Redis struct {
	rdb  redis.Scripter
	o    RedisOptions
	cb   *gobreaker.CircuitBreaker[redisDecision]
	mode atomic.Int32
	// lastErr is the last call's error, for the line that says why the limits went
	// to fallback: no answer, or Redis's own refusal (out of memory, a key of another
	// type).
	lastErr atomic.Pointer[string]

	// restores counts, by route, the keys found lost and restored from this replica's
	// views, since the start; routes are added as their buckets are built.
	restoresMu sync.Mutex
	restores   map[string]*restoreCounts
	// unlogged counts the restores since the last log line about them; nextLog is when
	// (ns since started, monotonic) the next line may be written.
	unlogged atomic.Uint64
	nextLog  atomic.Int64
	started  time.Time
}

// restoreCounts are a route's restores: of its bucket's key, of its clients' keys.
type restoreCounts struct{ route, client atomic.Uint64 }

// restoreLogEvery is how often, at most, a replica logs that it restored lost keys.
const restoreLogEvery = time.Minute

// The kinds of key that Restores reports, the values of the metric label that tells
// them apart.
const (
	restoreRoute  = "route"  // a route's bucket
	restoreClient = "client" // a client's share
)

// Restores calls f for each route with a bucket on Redis and each kind of key, "route"
// (the route's bucket) and "client" (its clients' shares): the keys of that kind that
// this replica found lost in Redis (evicted, flushed, Redis restarted empty) while its
// view of them was still ahead, and restored, since the start. Safe for concurrent use.
func (r *Redis) Restores(f func(route, kind string, n uint64)) {
	r.restoresMu.Lock()
	defer r.restoresMu.Unlock()
	for route, c := range r.restores {
		f(route, restoreRoute, c.route.Load())
		f(route, restoreClient, c.client.Load())
	}
}

// restoreCountsOf returns the counts of route, adding them at 0.
func (r *Redis) restoreCountsOf(route string) *restoreCounts {
	r.restoresMu.Lock()
	defer r.restoresMu.Unlock()
	c := r.restores[route]
	if c == nil {
		c = &restoreCounts{}
		r.restores[route] = c
	}
	return c
}

// restored logs that a key of route (kind: restoreRoute or restoreClient) was lost and
// restored, at most once every restoreLogEvery, with the restores since the last line
// (the caller counts it in the route's restoreCounts).
func (r *Redis) restored(route, kind string) {
	r.unlogged.Add(1)
	now := int64(time.Since(r.started))
	next := r.nextLog.Load()
	if now < next || !r.nextLog.CompareAndSwap(next, now+int64(restoreLogEvery)) {
		return
	}
	r.o.Logger.Warn("limiter state lost in Redis (evicted under maxmemory, flushed, or Redis restarted empty) and restored from this replica's last view; give Redis memory to spare (see mdproxy_limiter_redis_restores_total)",
		"route", route, "bucket", kind, "restores", r.unlogged.Swap(0))
}

// NewRedis returns the shared limits on rdb (a *redis.Client, or any
// redis.UniversalClient) with o's settings; pass it to NewSet with WithRedis. It does
// not contact Redis: the first decisions do, and move to fallback if it does not
// answer. rdb should not retry on its own (MaxRetries -1): the breaker decides when to
// try again.
func NewRedis(rdb redis.UniversalClient, o RedisOptions) *Redis {
	o.Prefix = cmpOr(o.Prefix, "mdproxy:")
	o.Timeout = cmpOr(o.Timeout, 50*time.Millisecond)
	o.Replicas = max(o.Replicas, 1)
	o.FailuresToFallback = cmpOr(o.FailuresToFallback, 3)
	o.RetryEvery = cmpOr(o.RetryEvery, time.Second)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Redis{rdb: rdb, o: o, restores: map[string]*restoreCounts{}, started: time.Now()}
	r.mode.Store(int32(ModeRedis))
	r.cb = gobreaker.NewCircuitBreaker[redisDecision](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: 1, // one request tries Redis again after RetryEvery
		Timeout:     o.RetryEvery,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= uint32(o.FailuresToFallback)
		},
		// A request whose client left while Redis answered says nothing of Redis.
		IsExcluded:    func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, _, to gobreaker.State) { r.setMode(to) },
	})
	return r
}

// cmpOr returns v, or def when v is its type's zero value.
func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// setMode follows the breaker's state: closed is ModeRedis, open and half-open are
// ModeFallback. It logs a change of mode, not a change of state within fallback.
func (r *Redis) setMode(s gobreaker.State) {
	m := ModeFallback
	if s == gobreaker.StateClosed {
		m = ModeRedis
	}
	if Mode(r.mode.Swap(int32(m))) == m {
		return
	}
	if m == ModeFallback {
		why := ""
		if e := r.lastErr.Load(); e != nil {
			why = *e
		}
		r.o.Logger.Warn("limits in fallback: Redis does not answer or refuses (err), each replica decides alone at its share of each limit",
			"err", why, "replicas", r.o.Replicas, "timeout", r.o.Timeout.String(), "retry_every", r.o.RetryEvery.String())
	} else {
		r.o.Logger.Info("limits shared on Redis again")
	}
}

// Mode returns ModeRedis or ModeFallback. Safe for concurrent use.
func (r *Redis) Mode() Mode { return Mode(r.mode.Load()) }

// bucket builds the RedisBucket of route for l, whose fallback is a local Bucket on
// clock at the replica's share of l.
func (r *Redis) bucket(route string, l Limit, clock clockwork.Clock, opts []Option) (*RedisBucket, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	l = l.effective()
	fallback, err := NewBucket(l.share(r.o.Replicas), clock, opts...)
	if err != nil {
		return nil, err
	}
	b := &RedisBucket{r: r, route: route, limit: l, clock: clock, fallback: fallback, restores: r.restoreCountsOf(route)}
	rr := newRedisRate(l, l.Rate)
	b.rated.Store(rr)
	if l.ClientLimit > 0 {
		b.client = clientRedisLimit(l.ClientLimit, l.window())
		b.clients = newClientViews(newOptions(opts).clientKeysMax, clock)
	}
	// The keys name the limit they hold the state of, so that a changed limit starts
	// from a new, full bucket, as a local one does, rather than from the old limit's
	// debt (after a limit of 0.001/s, up to 1000 s of refusals under a looser one);
	// every replica with the same limit shares the same keys, and the old ones expire
	// by their TTL.
	b.routeKey = r.o.Prefix + "limit:" + route + ":" + rr.global.tag()
	b.clientPre = r.o.Prefix + "client:" + route + ":" + b.client.tag() + ":"
	return b, nil
}

// share is the part of l that one of replicas takes when they decide alone: the rate
// and burst divided by replicas (a burst of at least 1), and each client's share
// spread over a window replicas times as long (its limit kept), so that the replicas
// together hold a client to ClientLimit per ClientWindow on average, however few
// requests ClientLimit is; dividing the limit instead rounds up (a limit of 1 stays 1
// on each replica: replicas times the share).
func (l Limit) share(replicas int) Limit {
	if replicas <= 1 {
		return l
	}
	l.Rate /= float64(replicas)
	if l.Burst > 0 {
		l.Burst = max(1, l.Burst/replicas)
	}
	if l.ClientLimit > 0 {
		l.ClientWindow = l.window() * time.Duration(replicas)
	}
	return l
}

// RedisBucket is the budget of one route shared on Redis: see Redis. Its decisions
// differ from a Bucket's in three ways, all bounded: a request waiting for its token
// that gives up gives its token back to the end of the line rather than to the request
// behind it; MaxWait is counted in whole emission intervals (1/Rate), rounded down; and
// its instants are Redis's microseconds rather than the replica's nanoseconds. Safe for
// concurrent use.
type RedisBucket struct {
	r        *Redis
	route    string
	limit    Limit
	clock    clockwork.Clock
	fallback *Bucket // at the replica's share of limit
	restores *restoreCounts

	routeKey, clientPre string // named after the configured limit
	rated               atomic.Pointer[redisRate]
	client              redisLimit // zero when ClientLimit == 0

	view    viewCell     // the last view of the route's bucket's key
	clients *clientViews // of the clients' keys; nil when ClientLimit == 0
}

var _ Limiter = (*RedisBucket)(nil)

// Limit returns the route's configuration, Burst filled in (not the fallback's share),
// with the rate in force (SetRate).
func (b *RedisBucket) Limit() Limit {
	l := b.limit
	l.Rate = b.rated.Load().rate
	return l
}

// redisRate is the rate a RedisBucket's route's bucket runs at: the configured one or,
// set by the adaptive limit (Set.SetRate), the one every replica of the fleet puts in
// force. The key stays the configured limit's: a change keeps the time the bucket takes
// to be full again, where a Bucket keeps the tokens it misses.
type redisRate struct {
	rate       float64
	global     redisLimit // zero when rate == 0
	waitTokens int64      // the tokens MaxWait brings, floor(MaxWait*rate)
}

// newRedisRate returns the bucket of l at rate (0: none). A request may wait up to
// MaxWait for its token: GCRA admits it when the bucket would be full enough within
// MaxWait, which is a bucket larger by the tokens that MaxWait brings, the surplus
// being the request's wait.
func newRedisRate(l Limit, rate float64) *redisRate {
	rr := &redisRate{rate: rate}
	if rate > 0 {
		rr.waitTokens = int64(math.Floor(l.MaxWait.Seconds() * rate))
		rr.global = routeRedisLimit(rate, l.Burst, int(rr.waitTokens))
	}
	return rr
}

// setRate puts rate (> 0) in force on the route's bucket in Redis and, at this replica's
// share, on its fallback.
func (b *RedisBucket) setRate(rate float64) {
	b.rated.Store(newRedisRate(b.limit, rate))
	b.fallback.setRate(rate / float64(max(b.r.o.Replicas, 1)))
}

// redisDecision is a decision taken in Redis: d, and for a request that must wait, its
// wait.
type redisDecision struct {
	d     Decision
	delay time.Duration
}

// Acquire decides in Redis whether a request of client may go on; see Limiter. When
// Redis does not answer within the timeout, or the limits are in fallback, the route's
// local bucket decides.
func (b *RedisBucket) Acquire(ctx context.Context, client string) Decision {
	rd, err := b.r.cb.Execute(func() (redisDecision, error) {
		rd, err := b.decide(ctx, client)
		if err != nil {
			msg := err.Error()
			b.r.lastErr.Store(&msg)
		}
		return rd, err
	})
	if err != nil {
		if ctx.Err() != nil {
			return Decision{Outcome: Canceled}
		}
		// The replica's share decides: the fleet's bucket, which RateLimit describes, is
		// not known.
		d := b.fallback.Acquire(ctx, client)
		d.QuotaKnown, d.Remaining, d.Full = false, 0, 0
		return d
	}
	if rd.delay <= 0 {
		return rd.d
	}
	if rd.delay > maxWaitOf(ctx) {
		// Within MaxWait, but not within the wait ctx allows (WithMaxWait).
		b.giveBack(ctx, client, true)
		return Decision{Outcome: Rejected, RetryAfter: rd.delay}
	}
	start := b.clock.Now()
	t := b.clock.NewTimer(rd.delay)
	defer t.Stop()
	select {
	case <-t.Chan():
		return Decision{Outcome: Delayed, Waited: rd.delay}
	case <-ctx.Done():
		waited := max(b.clock.Since(start), 0) // a fake clock may have stepped back
		b.giveBack(ctx, client, true)
		return Decision{Outcome: Canceled, Waited: waited}
	}
}

// decide takes the decision for a request of client in Redis: the client's share first
// (a request it refuses takes no token of the route), then the route's bucket (a
// request it refuses is given back to its client's share).
func (b *RedisBucket) decide(ctx context.Context, client string) (redisDecision, error) {
	ctx, cancel := context.WithTimeout(ctx, b.r.o.Timeout)
	defer cancel()
	if b.limit.ClientLimit > 0 {
		res, err := b.runClient(ctx, client, 1)
		if err != nil {
			return redisDecision{}, err
		}
		if !res.allowed {
			return redisDecision{d: b.refuse(RejectedClient, res.retryAfter)}, nil
		}
	}
	if b.limit.Rate == 0 {
		return redisDecision{d: Decision{Outcome: Allowed}}, nil
	}
	rr := b.rated.Load()
	res, err := b.run(ctx, rr, 1)
	if err != nil {
		b.giveBack(ctx, client, false)
		return redisDecision{}, err
	}
	interval := time.Duration(rr.global.interval) * time.Microsecond
	if !res.allowed {
		b.giveBack(ctx, client, false)
		// retryAfter is when the request would be let in to wait; its token is free
		// the waitTokens' intervals after that.
		return redisDecision{d: b.withQuota(b.refuse(Rejected, res.retryAfter+time.Duration(rr.waitTokens)*interval), interval, res)}, nil
	}
	// resetAfter is when the route's bucket is full again; the request's token is free
	// Burst intervals before that.
	delay := res.resetAfter - time.Duration(b.limit.Burst)*interval
	if delay <= 0 || b.limit.DryRun {
		return redisDecision{d: b.withQuota(Decision{Outcome: Allowed}, interval, res)}, nil
	}
	return redisDecision{delay: delay}, nil
}

// withQuota returns d with the quota of the route's bucket in Redis as the script's
// answer res gives it, for tokens of interval: Full its debt (reset after), Remaining
// the whole tokens of the burst that debt leaves, as Bucket's quota counts them.
func (b *RedisBucket) withQuota(d Decision, interval time.Duration, res gcraResult) Decision {
	d.QuotaKnown = true
	d.Full = max(res.resetAfter, 0)
	d.Remaining = int(max(time.Duration(b.limit.Burst)*interval-d.Full, 0) / interval)
	return d
}

// run runs the GCRA of the route's bucket at rr with cost, passing and keeping the
// replica's view of its key.
func (b *RedisBucket) run(ctx context.Context, rr *redisRate, cost int) (gcraResult, error) {
	res, err := runGCRA(ctx, b.r.rdb, b.routeKey, rr.global, cost, b.view.load())
	if err != nil {
		return res, err
	}
	b.view.store(res.view)
	if res.restored {
		b.restores.route.Add(1)
		b.r.restored(b.route, restoreRoute)
	}
	return res, nil
}

// runClient runs the GCRA of client's share with cost, passing and keeping the
// replica's view of its key.
func (b *RedisBucket) runClient(ctx context.Context, client string, cost int) (gcraResult, error) {
	key, h := b.clientKey(client)
	res, err := runGCRA(ctx, b.r.rdb, key, b.client, cost, b.clients.get(h))
	if err != nil {
		return res, err
	}
	b.clients.put(h, res)
	if res.restored {
		b.restores.client.Add(1)
		b.r.restored(b.route, restoreClient)
	}
	return res, nil
}

// refuse returns the rejection o with retryAfter, or WouldReject in a dry run.
func (b *RedisBucket) refuse(o Outcome, retryAfter time.Duration) Decision {
	if b.limit.DryRun {
		return Decision{Outcome: WouldReject}
	}
	return Decision{Outcome: o, RetryAfter: retryAfter}
}

// giveBack returns, best effort and within the timeout, a request's count to its
// client's share and, when route is true, its token to the route's bucket: a GCRA
// step of cost -1, which the script bounds so that a bucket never holds more than
// full.
func (b *RedisBucket) giveBack(ctx context.Context, client string, route bool) {
	if b.limit.ClientLimit == 0 && !route {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.r.o.Timeout)
	defer cancel()
	if route {
		_, _ = b.run(ctx, b.rated.Load(), -1)
	}
	if b.limit.ClientLimit > 0 {
		_, _ = b.runClient(ctx, client, -1)
	}
}

// clientKey is the Redis key of client's share, a digest, so that Redis never holds
// an apikey, and the digest's first 64 bits, which key the replica's view of it.
func (b *RedisBucket) clientKey(client string) (string, uint64) {
	sum := sha256.Sum256([]byte(client))
	return b.clientPre + hex.EncodeToString(sum[:16]), binary.BigEndian.Uint64(sum[:8])
}
