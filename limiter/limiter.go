// Package limiter holds the token buckets that mdproxy puts on each route: a global
// bucket per route (a GCRA with golang.org/x/time/rate's semantics) and, optionally, a
// per-client share inside it (a GCRA per client key: ClientLimit per ClientWindow, a
// burst of ClientLimit). Each route's budget is a Limiter: a Bucket in the process, or a
// RedisBucket that every replica on one Redis shares (the same GCRA in a Lua script of
// this package, on Redis's clock), with a local Bucket to fall back on. It knows route
// names only as opaque strings; which HTTP requests belong to which route is the proxy
// package's business.
//
// Time comes from a github.com/jonboulle/clockwork Clock given to NewBucket and NewSet:
// the decision for a request is a function of the bucket's state, the instant and the
// client key, and a request that must wait for its token waits on the clock's timer, so
// that tests run on a fake clock and never sleep. A bucket counts time from its first
// reading of the clock, on the monotonic clock when the clock gives it (the real one
// does), so that a step of the wall clock moves no bucket; a clock that steps back all
// the same (a fake one, a wall clock without monotonic readings, Redis's) never makes a
// bucket refuse for longer than one refill of it and its MaxWait.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/jonboulle/clockwork"
)

// Limiter decides for the requests of one route. Bucket (local) and RedisBucket
// (shared by the replicas on one Redis) implement it. Implementations are safe for
// concurrent use.
type Limiter interface {
	// Acquire decides whether a request of client (the per-client key: an apikey or a
	// client address, never logged) may go on. When no token is free now but one will
	// be within MaxWait (or the shorter bound of WithMaxWait in ctx), Acquire blocks
	// until then, or until ctx ends (outcome Canceled, the token given back).
	// Rejections return at once and consume nothing.
	Acquire(ctx context.Context, client string) Decision
	// Limit returns the configuration in force, Burst filled in. It is the same for
	// the Limiter's whole life: a new limit comes as a new Limiter (the proxy reads it
	// once, when it puts the Limiter in place).
	Limit() Limit
}

// MinRate and MaxRate bound a Limit's Rate other than 0, in requests per second. Below
// MinRate (one request in 27.8 hours) a token's interval in nanoseconds no longer fits
// the bucket's arithmetic nor Redis's (a rate of 1e-10 turned the limit off, 3e-10
// refused the first request of a full bucket); above MaxRate the interval is under a
// nanosecond, the clock's unit.
const (
	MinRate = 0.00001
	MaxRate = 1e9
)

// MaxMaxWait and MaxClientWindow bound a Limit's MaxWait (a day: a request waiting
// longer for a token has long been given up by its client) and ClientWindow (30 days),
// so that the tokens a wait brings and a window times the replicas (in fallback) stay
// far within the arithmetic's range.
const (
	MaxMaxWait      = 24 * time.Hour
	MaxClientWindow = 720 * time.Hour
)

// Limit is the budget of one route, in plain values: limiter reads no settings (mdproxy
// reads a route's Limit from its MDPROXY_<ROUTE>_* variables in package sidecar), and
// checks only its own invariants (Validate).
//
// The zero Limit allows everything: no global bucket, no per-client share.
type Limit struct {
	// Rate is the refill rate of the route's global token bucket, in requests per
	// second, from MinRate to MaxRate; fractions are allowed (0.5 = one request every
	// 2 seconds). 0 means no global limit.
	Rate float64
	// Burst is the capacity of the global bucket, in requests: how many requests may
	// pass at once after a quiet period. 0 means one second's worth of tokens,
	// ceil(Rate), and at least 1.
	Burst int
	// MaxWait is how long a request may wait for a token before it is rejected, as
	// nginx's limit_req burst without nodelay does. 0 rejects at once.
	MaxWait time.Duration
	// ClientLimit is each client's share of the route: a token bucket per client key of
	// ClientLimit tokens refilled at ClientLimit per ClientWindow (a GCRA, the same
	// locally and on Redis). A client may send ClientLimit requests at once, then one
	// each ClientWindow/ClientLimit; in any span of one ClientWindow it gets at most
	// 2*ClientLimit-1 requests through (ClientLimit at its start, ClientLimit-1 more as
	// tokens come back), and in any span of n windows at most (n+1)*ClientLimit-1. A
	// request the share refuses gets the time until the client's next token as its
	// RetryAfter: at most ClientWindow/ClientLimit. 0 turns the per-client share off.
	// The keys tracked are bounded and freed when full again: see Bucket.
	ClientLimit int
	// ClientWindow is the window of ClientLimit. Zero is read as one second.
	ClientWindow time.Duration
	// DryRun, when true, decides every request as the limit would but lets each go on
	// at once: a request that would be rejected is counted WouldReject instead (as
	// nginx's limit_req_dry_run and Envoy's shadow_mode do), one that would wait is let
	// through without waiting. The bucket's state follows the decisions a real limit
	// would take: a would-be rejection takes no token, a would-be wait takes its turn.
	DryRun bool
	// Exempt lists the clients the route's limit never refuses, as the caller writes
	// them (mdproxy: client address prefixes and apikey digests, proxy.ParseExempt).
	// The limiter does not read it: the caller lets such a request through without
	// asking the bucket (outcome Exempt). "" exempts no one.
	Exempt string
	// RateMin is the lowest rate, in requests per second, that an adaptive controller
	// may set the route's bucket to (Set.SetRate), from MinRate to Rate; the bucket
	// itself does not read it. 0 means a tenth of Rate (Floor).
	RateMin float64
}

// Floor returns the lowest rate an adaptive controller may set: RateMin, or a tenth of
// Rate (at least MinRate) when RateMin is 0; 0 without a Rate.
func (l Limit) Floor() float64 {
	switch {
	case l.Rate == 0:
		return 0
	case l.RateMin > 0:
		return min(l.RateMin, l.Rate)
	}
	return max(l.Rate/10, MinRate)
}

// filled returns l with the Burst that 0 stands for filled in: ceil(Rate), at least 1,
// when Rate is above 0.
func (l Limit) filled() Limit {
	if l.Rate > 0 && l.Burst == 0 {
		l.Burst = max(1, int(math.Ceil(l.Rate)))
	}
	return l
}

// effective returns l as it acts: filled, with the settings that have no effect set to
// their zero (Burst and MaxWait without a Rate, ClientWindow without a ClientLimit).
// A bucket reports it as its Limit.
func (l Limit) effective() Limit {
	l = l.filled()
	if l.Rate == 0 {
		l.Burst, l.MaxWait = 0, 0
	}
	if l.ClientLimit == 0 {
		l.ClientWindow = 0
	}
	return l
}

// acts returns l's effective form with a ClientWindow of 0 as the one second it stands
// for: two Limits that act alike are equal. A reload keeps a route's bucket when its
// limit acts the same.
func (l Limit) acts() Limit {
	l = l.effective()
	if l.ClientLimit > 0 {
		l.ClientWindow = l.window()
	}
	return l
}

// Unlimited reports whether l lets every request through at once.
func (l Limit) Unlimited() bool { return l.Rate == 0 && l.ClientLimit == 0 }

// window is the per-client share's window: ClientWindow, one second when 0.
func (l Limit) window() time.Duration {
	if l.ClientWindow == 0 {
		return time.Second
	}
	return l.ClientWindow
}

// maxWaitKey is the context key of WithMaxWait's bound.
type maxWaitKey struct{}

// WithMaxWait returns ctx bounding how long a request that a Limiter decides under it
// may wait for its token: d or the Limit's MaxWait, whichever is shorter (d of 0 or
// less: no wait at all). A request whose token would come later is rejected at once,
// with the Retry-After of any rejection, and takes nothing. The proxy gives it to a
// request that asks again, so that MaxWait bounds its wait in all: a poll whose question
// to Core it shared with another (the bridge) asks for a token itself when that other
// poll gave up waiting, with what is left of its own MaxWait.
//
// The bound is a value, not ctx's deadline as x/time/rate's Limiter.Wait reads it: a
// deadline would bound a RedisBucket's call to Redis too, so that a request with no
// wait left would have that call cut and be Canceled even with a token free, and it
// is on the real clock, whereas a Bucket decides on the clock it is given. ctx's
// deadline, if any, ends a wait as its cancellation does (Canceled).
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxWaitKey{}, max(d, 0))
}

// maxWaitOf returns the bound WithMaxWait put in ctx, or the longest Duration when none.
func maxWaitOf(ctx context.Context) time.Duration {
	if d, ok := ctx.Value(maxWaitKey{}).(time.Duration); ok {
		return d
	}
	return math.MaxInt64
}

// Outcome is what a Bucket decided for one request.
type Outcome int

const (
	// Allowed: a token was free at once.
	Allowed Outcome = iota
	// Delayed: the request waited for its token (no longer than MaxWait) and may go on.
	Delayed
	// Rejected: no token would be free within MaxWait. No token was consumed.
	Rejected
	// RejectedClient: the global bucket had room but the client used up its share. No
	// token of the global bucket was consumed.
	RejectedClient
	// Canceled: the request's context ended while it waited; its token was given back.
	Canceled
	// WouldReject: the limit is a dry run (Limit.DryRun) and would have rejected the
	// request (for the route's bucket or the client's share); it goes on. No token was
	// consumed.
	WouldReject
	// Exempt: the request is exempt from the route's limit (Limit.Exempt) and goes on
	// without asking the bucket. No Limiter decides it: the caller that reads
	// Limit.Exempt does. No token was consumed.
	Exempt
)

// Outcomes is the number of Outcome values: Allowed to Exempt are 0 to Outcomes-1, for
// arrays indexed by outcome.
const Outcomes = int(Exempt) + 1

// String returns the outcome's metric label: allowed, delayed, rejected,
// rejected_client, canceled, would_reject or exempt.
func (o Outcome) String() string {
	switch o {
	case Allowed:
		return "allowed"
	case Delayed:
		return "delayed"
	case Rejected:
		return "rejected"
	case RejectedClient:
		return "rejected_client"
	case Canceled:
		return "canceled"
	case WouldReject:
		return "would_reject"
	case Exempt:
		return "exempt"
	}
	return "unknown"
}

// Decision is the answer of Bucket.Acquire.
type Decision struct {
	Outcome Outcome
	// Waited is how long the request was held before it was let through (Delayed) or
	// gave up (Canceled); 0 otherwise.
	Waited time.Duration
	// RetryAfter is, for Rejected, the time until a token of the global bucket is free;
	// for RejectedClient, the time until a token of the client's share is (at most
	// ClientWindow/ClientLimit). 0 for the other outcomes.
	RetryAfter time.Duration
	// QuotaKnown reports whether Remaining and Full describe the route's bucket after
	// this decision: true for the decisions of a Bucket, and of a RedisBucket in Redis
	// that let a request through at once or refused it, on a route with a Rate; false
	// for the others (a wait, a RedisBucket's client share refusing before the route's
	// bucket is asked, a RedisBucket deciding in its fallback).
	QuotaKnown bool
	// Remaining is the tokens left in the route's bucket after this decision, rounded
	// down, 0 to Burst.
	Remaining int
	// Full is the time until the route's bucket is full again if no request takes a
	// token meanwhile; 0 when it is full.
	Full time.Duration
}

// Pass reports whether the request may go on to the upstream.
func (d Decision) Pass() bool {
	return d.Outcome == Allowed || d.Outcome == Delayed || d.Outcome == WouldReject || d.Outcome == Exempt
}

// RetryAfterSeconds returns RetryAfter as the value of a Retry-After header: whole
// seconds, rounded up, at least 1 (RFC 9110, section 10.2.3, allows only whole seconds).
// A microsecond of slack absorbs floating-point noise, so that exactly 10 s stays 10.
func (d Decision) RetryAfterSeconds() int {
	s := int(math.Ceil(d.RetryAfter.Seconds() - 1e-6))
	return max(s, 1)
}

// Bucket is the budget of one route in this process: a global token bucket (see gcra:
// x/time/rate's semantics, with an exact give-back) and an optional per-client share
// (a GCRA per client key). A nil *Bucket allows everything. A Bucket is safe for
// concurrent use.
//
// The per-client share tracks at most a bound of client keys at once (WithClientKeysMax,
// 100,000 by default; 20 to 40 bytes a key). A key is freed once its bucket is full
// again, when it would decide as an untracked key does (at most one window after its
// last request): a timer of the bucket's clock sweeps those keys every window (at most
// once a second) while keys are tracked, and stops when none is, so that memory returns
// to its baseline without waiting for a request. While the bound is reached, a request
// of a new key passes the per-client check untracked: the route's global bucket, which
// protects Core, still decides for it, whereas refusing it would let a flood of made-up
// keys lock out every client that arrives after it. Such requests are counted
// (Set.ClientKeys) and logged at most once a sweep (WithLogger). Keys already tracked
// keep their share.
type Bucket struct {
	limit Limit
	clock clockwork.Clock
	// base is the clock's first reading: the origin of the bucket's time line (now).
	base time.Time
	// global is the route's bucket's limit; its interval is 0 when Rate == 0.
	global gcra

	// mu makes "look at the bucket, check the client, take the token" one step, so that
	// a rejected request never takes a token and concurrent requests never overdraw.
	mu  sync.Mutex
	tat int64 // the route's bucket's theoretical arrival time (see gcra)
	// clients holds each client key's bucket in the per-client share; nil when
	// ClientLimit == 0.
	clients *clientShare
	// waiting holds the requests waiting for their token, in the order of their
	// reservations: the slot of one that leaves is handed to those behind it.
	waiting []*waiter
}

var _ Limiter = (*Bucket)(nil)

// waiter is a request waiting for its turn. Its fields are guarded by the bucket's mu;
// moved tells it that at changed.
type waiter struct {
	at    int64 // its turn, on the bucket's time line (Bucket.now)
	moved chan struct{}
	// client is the per-client key whose share counted it, given back if it gives up;
	// "" without a per-client share.
	client string
}

// NewBucket returns the bucket for l on clock (nil means the real clock; tests pass a
// clockwork.FakeClock): the global bucket's instants, the waits for a token, the
// per-client share's windows and the sweep of its idle keys all read it. opts bound and
// log the per-client share. It returns an error when l is not valid.
func NewBucket(l Limit, clock clockwork.Clock, opts ...Option) (*Bucket, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	l = l.effective() // what Limit reports: the gauges and /config show the limit as it acts
	b := &Bucket{limit: l, clock: clock, base: clock.Now()}
	if l.Rate > 0 {
		// A new bucket starts full (tat 0): its burst is available at once.
		b.global = routeGCRA(l.Rate, l.Burst, l.MaxWait)
	}
	if l.ClientLimit > 0 {
		b.clients = newClientShare(clientGCRA(l.ClientLimit, l.window()), l.window(), o.clientKeysMax, clock, b.base, o.logger)
	}
	return b, nil
}

// now returns the bucket's clock's reading as nanoseconds since its first one, base:
// on the monotonic clock when both readings carry it (the real clock's do), so that a
// step of the wall clock does not move it; on the wall clock otherwise (a fake clock),
// where it may step back, and the buckets clamp (see gcra).
func (b *Bucket) now() int64 { return int64(b.clock.Now().Sub(b.base)) }

// limited reports whether the route's bucket applies: Rate > 0.
func (b *Bucket) limited() bool { return b.global.interval > 0 }

// clientKeys returns the client keys the per-client share tracks now (idle ones
// included until the next sweep) and the requests it let through untracked since the
// bucket was built, because the bound of keys was reached. ok is false when the bucket
// has no per-client share (or is nil). Safe for concurrent use.
func (b *Bucket) clientKeys() (tracked int, untracked uint64, ok bool) {
	if b == nil || b.clients == nil {
		return 0, 0, false
	}
	tracked, untracked = b.clients.stats()
	return tracked, untracked, true
}

// FieldError is a field of a Limit out of range, which NewBucket and NewSet refuse.
// Field is the field's name (Rate, Burst, MaxWait, ClientLimit or ClientWindow), Want
// what it accepts, in the field's units. Whoever reads a Limit from settings names
// its own variable with it (sidecar does).
type FieldError struct {
	Field, Want string
}

// Error returns the field's name in lower-case words and what it accepts, e.g.
// "max wait out of range: want a duration from 0 to 24h0m0s".
func (e *FieldError) Error() string {
	var words strings.Builder
	for i, r := range e.Field {
		if i > 0 && unicode.IsUpper(r) {
			words.WriteByte(' ')
		}
		words.WriteRune(unicode.ToLower(r))
	}
	return words.String() + " out of range: " + e.Want
}

// Validate returns nil when NewBucket and NewSet accept l. Otherwise it returns an
// error joining (errors.Join: it has an Unwrap() []error method) one *FieldError for
// each field out of range, in field order: Rate other than 0 outside MinRate to
// MaxRate (or NaN, infinite, negative), Burst or ClientLimit negative, MaxWait outside
// 0 to MaxMaxWait, ClientWindow outside 0 to MaxClientWindow. A field without effect
// (Burst without a Rate) must be in range all the same.
func (l Limit) Validate() error {
	var errs []error
	bad := func(field, want string) { errs = append(errs, &FieldError{Field: field, Want: want}) }
	if l.Rate < 0 || math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) ||
		(l.Rate > 0 && (l.Rate < MinRate || l.Rate > MaxRate)) {
		bad("Rate", fmt.Sprintf("want 0 (no limit) or from %g to %g requests per second", MinRate, MaxRate))
	}
	if l.Burst < 0 {
		bad("Burst", "want 0 (one second's worth) or more requests")
	}
	if l.MaxWait < 0 || l.MaxWait > MaxMaxWait {
		bad("MaxWait", fmt.Sprintf("want a duration from 0 to %v", MaxMaxWait))
	}
	if l.ClientLimit < 0 {
		bad("ClientLimit", "want 0 (off) or more requests per window")
	}
	if l.ClientWindow < 0 || l.ClientWindow > MaxClientWindow {
		bad("ClientWindow", fmt.Sprintf("want a duration from 0 (one second) to %v", MaxClientWindow))
	}
	if l.RateMin < 0 || math.IsNaN(l.RateMin) || math.IsInf(l.RateMin, 0) ||
		(l.RateMin > 0 && (l.RateMin < MinRate || (l.Rate > 0 && l.RateMin > l.Rate))) {
		bad("RateMin", fmt.Sprintf("want 0 (a tenth of the rate) or from %g requests per second to the rate", MinRate))
	}
	return errors.Join(errs...)
}

// Limit returns the configuration the bucket was built with as it acts: Burst filled
// in, the settings without effect (Burst and MaxWait without a Rate, ClientWindow
// without a ClientLimit) at their zero.
func (b *Bucket) Limit() Limit {
	if b == nil {
		return Limit{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit
}

// setRate makes rate (MinRate to MaxRate) the bucket's rate from now on, Burst and
// MaxWait kept; the tokens missing now stay missing (the time the bucket is behind is
// scaled to the new rate, as x/time/rate's SetLimit keeps its tokens), and requests
// waiting keep their turns.
func (b *Bucket) setRate(rate float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	old := b.global
	b.global = routeGCRA(rate, b.limit.Burst, b.limit.MaxWait)
	b.limit.Rate = rate
	if debt := b.tat - now; debt > 0 {
		b.tat = now + int64(float64(debt)*float64(b.global.interval)/float64(old.interval))
	}
}

// Acquire decides whether a request of client may go on, at the instant the bucket's
// clock reads; see Limiter. A request that must wait waits on the clock's timer.
func (b *Bucket) Acquire(ctx context.Context, client string) Decision {
	if b == nil || (!b.limited() && b.clients == nil) {
		return Decision{Outcome: Allowed}
	}
	b.mu.Lock()
	now := b.now() // read under the lock, so that instants reach the bucket in order
	d, w := b.reserve(ctx, now, client)
	b.mu.Unlock()
	if w == nil {
		return d
	}
	return b.wait(ctx, w, now)
}

// reserve is the decision for a request of client arriving at now, a function of the
// bucket's state, now, client and the wait ctx allows (WithMaxWait) alone: Allowed,
// Rejected or RejectedClient (or, in a dry run, WouldReject), or a waiter holding the
// request's turn when it must wait for its token. The caller holds b.mu.
func (b *Bucket) reserve(ctx context.Context, now int64, client string) (Decision, *waiter) {
	var delay time.Duration
	if b.limited() {
		b.tat = b.global.clamp(b.tat, now)
		delay = max(b.global.delay(b.tat, now), 0)
		if delay > b.limit.MaxWait || (delay > 0 && delay > maxWaitOf(ctx)) {
			return b.withQuota(b.refuse(Decision{Outcome: Rejected, RetryAfter: delay}), now), nil
		}
	}
	if b.clients != nil {
		if ok, retry := b.clients.allow(client, now); !ok {
			return b.withQuota(b.refuse(Decision{Outcome: RejectedClient, RetryAfter: retry}), now), nil
		}
	}
	if !b.limited() {
		return Decision{Outcome: Allowed}, nil
	}
	b.tat = b.global.take(b.tat, now)
	if delay <= 0 || b.limit.DryRun {
		// A dry run takes the turn the request would wait for, but does not hold it.
		return b.withQuota(Decision{Outcome: Allowed}, now), nil
	}
	w := &waiter{at: now + int64(delay), moved: make(chan struct{}, 1)}
	if b.clients != nil {
		w.client = client
	}
	b.waiting = append(b.waiting, w)
	return Decision{}, w
}

// withQuota returns d with the route's bucket's quota at now (Decision.Remaining, Full);
// d unchanged when the route has no Rate. The caller holds b.mu.
func (b *Bucket) withQuota(d Decision, now int64) Decision {
	if b.limited() {
		d.QuotaKnown = true
		d.Remaining, d.Full = b.global.quota(b.tat, now)
	}
	return d
}

// refuse returns d, a rejection, or WouldReject in a dry run.
func (b *Bucket) refuse(d Decision) Decision {
	if b.limit.DryRun {
		return Decision{Outcome: WouldReject}
	}
	return d
}

// wait holds w until its turn or until ctx ends. A request leaving the queue early
// must give its turn to those behind it: with x/time/rate alone, a canceled
// reservation gives back no token while later ones exist (golang/go#56924), and the
// route would lose that slot, Core receiving less than the configured rate. So the
// requests behind it move up one turn each, and the last turn is given back to the
// bucket. The request is also taken back from its client's share.
func (b *Bucket) wait(ctx context.Context, w *waiter, start int64) Decision {
	t := b.clock.NewTimer(b.until(w))
	defer t.Stop()
	for {
		select {
		case <-t.Chan():
			b.mu.Lock()
			b.leave(w, false)
			waited := time.Duration(w.at - start)
			b.mu.Unlock()
			return Decision{Outcome: Delayed, Waited: waited}
		case <-w.moved:
			t.Reset(b.until(w))
		case <-ctx.Done():
			b.mu.Lock()
			now := b.now()
			b.leave(w, true)
			b.mu.Unlock()
			return Decision{Outcome: Canceled, Waited: time.Duration(max(now-start, 0))}
		}
	}
}

// until is how long w has yet to wait for its turn, timed from the clock's reading now
// rather than from the reservation (time that passed since counts towards the wait):
// never more than MaxWait, however far the clock stepped back meanwhile.
func (b *Bucket) until(w *waiter) time.Duration {
	b.mu.Lock()
	at := w.at
	b.mu.Unlock()
	return min(time.Duration(at-b.now()), b.limit.MaxWait)
}

// leave removes w from the queue. When w gives up its turn (canceled), each request
// behind it takes the turn of the one before it, and the last turn is given back to the
// bucket. The caller holds b.mu.
func (b *Bucket) leave(w *waiter, canceled bool) {
	i := slices.Index(b.waiting, w)
	if i < 0 {
		return
	}
	lastAt := w.at
	if canceled {
		for _, next := range b.waiting[i+1:] {
			next.at, lastAt = lastAt, next.at
			select {
			case next.moved <- struct{}{}:
			default:
			}
		}
	}
	b.waiting = slices.Delete(b.waiting, i, i+1)
	if canceled {
		b.tat = b.global.giveBack(b.tat)
		if b.clients != nil {
			b.clients.giveBack(w.client)
		}
	}
}
