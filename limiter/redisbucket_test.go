package limiter_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
)

// The tests of RedisBucket run against a real redis-server (internal/redistest): the
// GCRA runs in Redis on Redis's clock, so the route's rate is measured in real time,
// by flooding, never by sleeping until a bucket refills; waits for a token run on the
// fake clock given to the Set.

// replica is one mdproxy replica's limits on the shared Redis.
type replica struct {
	set    *limiter.Set
	shared *limiter.Redis
}

// newReplica builds the limits of one replica on srv for limits, with o's settings (a
// short RetryEvery unless o sets it) and clock (nil: real). Its calls have 10 s each
// unless o sets Timeout, so that none is decided by the local bucket because the
// machine is loaded: the tests of fallback stop Redis (a call then fails at once) or
// set a Timeout.
func newReplica(t testing.TB, srv *redistest.Server, limits map[string]limiter.Limit, o limiter.RedisOptions, clock clockwork.Clock) replica {
	t.Helper()
	const patience = 10 * time.Second
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DisableIdentity: true,
		DialTimeout: patience, ReadTimeout: patience, WriteTimeout: patience})
	t.Cleanup(func() { rdb.Close() })
	if o.RetryEvery == 0 {
		o.RetryEvery = 200 * time.Millisecond
	}
	if o.Timeout == 0 {
		o.Timeout = patience
	}
	shared := limiter.NewRedis(rdb, o)
	set, err := limiter.NewSet(limits, clock, limiter.WithRedis(shared))
	if err != nil {
		t.Fatalf("NewSet(%v, WithRedis) = %v", limits, err)
	}
	return replica{set, shared}
}

// untilWaiting waits until clock holds a timer: a request waiting for its token. It
// fails t after blockTimeout, a bound only a broken limiter reaches.
func untilWaiting(t testing.TB, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("no request waits on the clock after %v: %v", blockTimeout, err)
	}
}

// flood sends requests of client to route on each replica from one goroutine per
// replica, until stop is closed, and returns the outcomes counted by replica. Every
// decision must come within bound.
func flood(t *testing.T, reps []replica, route, client string, stop <-chan struct{}, bound time.Duration) [][limiter.Outcomes]int {
	t.Helper()
	counts := make([][limiter.Outcomes]int, len(reps))
	var slowest atomic.Int64
	var wg sync.WaitGroup
	for i, r := range reps {
		wg.Go(func() {
			l := r.set.Limiter(route)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				d := l.Acquire(context.Background(), client)
				took := time.Since(start)
				if int64(took) > slowest.Load() {
					slowest.Store(int64(took))
				}
				counts[i][d.Outcome]++
			}
		})
	}
	wg.Wait()
	if s := time.Duration(slowest.Load()); s > bound {
		t.Errorf("slowest decision took %v, want at most %v", s, bound)
	} else {
		t.Logf("slowest decision: %v", s)
	}
	return counts
}

// TestRedisBurstShared checks that two replicas share the route's burst: at a rate too
// small to refill during the test, 40 requests spread over both get exactly the burst.
func TestRedisBurstShared(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 5}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	b := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	allowed := 0
	for i := range 40 {
		r := a
		if i%2 == 1 {
			r = b
		}
		d := r.set.Limiter("file_result").Acquire(context.Background(), "")
		switch d.Outcome {
		case limiter.Allowed:
			allowed++
		case limiter.Rejected:
			// A token comes back every 1000 s, and the Retry-After says so.
			if d.RetryAfter < 990*time.Second || d.RetryAfter > 1000*time.Second {
				t.Errorf("request %d: RetryAfter = %v, want about 1000s", i, d.RetryAfter)
			}
		default:
			t.Errorf("request %d: outcome %v, want allowed or rejected", i, d.Outcome)
		}
	}
	if allowed != 5 {
		t.Errorf("allowed %d of 40 over two replicas, want the shared burst, 5", allowed)
	}
	if a.shared.Mode() != limiter.ModeRedis || b.shared.Mode() != limiter.ModeRedis {
		t.Errorf("modes %v, %v, want redis", a.shared.Mode(), b.shared.Mode())
	}
}

// TestRedisRateShared checks that two replicas flooded together admit the route's
// burst plus its rate times the time, within one request: together, the configured
// limit, not twice it.
func TestRedisRateShared(t *testing.T) {
	srv := redistest.Start(t)
	const rate, burst = 5, 5
	limits := map[string]limiter.Limit{"file_result": {Rate: rate, Burst: burst}}
	reps := []replica{
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil),
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil),
	}
	stop := make(chan struct{})
	start := time.Now()
	time.AfterFunc(1500*time.Millisecond, func() { close(stop) })
	counts := flood(t, reps, "file_result", "", stop, 10*time.Second)
	elapsed := time.Since(start).Seconds()
	total := counts[0][limiter.Allowed] + counts[1][limiter.Allowed]
	most := burst + rate*elapsed + 1
	// Fewer than the burst plus the whole seconds' tokens would mean refused tokens.
	least := burst + rate*(elapsed-0.5)
	t.Logf("%.2f s: allowed %d (%d + %d), rejected %d; want %.1f to %.1f",
		elapsed, total, counts[0][limiter.Allowed], counts[1][limiter.Allowed],
		counts[0][limiter.Rejected]+counts[1][limiter.Rejected], least, most)
	if float64(total) > most || float64(total) < least {
		t.Errorf("allowed %d over %.2f s on two replicas, want between %.1f and %.1f (burst %d + %d/s)",
			total, elapsed, least, most, burst, rate)
	}
	for i, c := range counts {
		if c[limiter.Allowed] == 0 {
			t.Errorf("replica %d allowed nothing: the shared bucket is not shared fairly enough to test", i)
		}
	}
}

// TestRedisFallbackAndBack stops Redis under two replicas: each keeps deciding, with
// no error, at its share of the limit (here half the burst: the rate is too small to
// refill), and goes back to the shared bucket once Redis answers again.
func TestRedisFallbackAndBack(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 10}}
	reps := []replica{
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2, Timeout: 50 * time.Millisecond}, nil),
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2, Timeout: 50 * time.Millisecond}, nil),
	}
	srv.Stop()
	for i, r := range reps {
		allowed := 0
		for range 20 {
			start := time.Now()
			d := r.set.Limiter("file_result").Acquire(context.Background(), "")
			if took := time.Since(start); took > time.Second {
				t.Errorf("replica %d: a decision with Redis down took %v", i, took)
			}
			switch d.Outcome {
			case limiter.Allowed:
				allowed++
			case limiter.Rejected:
			default:
				t.Errorf("replica %d: outcome %v with Redis down, want allowed or rejected", i, d.Outcome)
			}
		}
		if allowed != 5 {
			t.Errorf("replica %d allowed %d of 20 with Redis down, want its share of the burst, 10/2 = 5", i, allowed)
		}
		if m := r.shared.Mode(); m != limiter.ModeFallback {
			t.Errorf("replica %d mode = %v after 20 failed calls, want fallback", i, m)
		}
	}

	srv.Restart()
	// After RetryEvery (200 ms here) one request tries Redis again; Redis, restarted
	// empty, holds a full bucket of 10 for the two replicas together.
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range reps {
		for r.shared.Mode() != limiter.ModeRedis {
			if time.Now().After(deadline) {
				t.Fatalf("mode = %v 10 s after Redis came back, want redis", r.shared.Mode())
			}
			r.set.Limiter("file_result").Acquire(context.Background(), "")
			time.Sleep(20 * time.Millisecond) // the breaker's retry period, not a bucket's
		}
	}
	rdb := srv.Client(t)
	if keys, err := rdb.Keys(context.Background(), "mdproxy:limit:file_result:*").Result(); err != nil || len(keys) != 1 {
		t.Errorf("KEYS mdproxy:limit:file_result:* = %q, %v after Redis came back, want one key", keys, err)
	}
}

// TestRedisKeysExpire checks that the keys of the route's bucket and of a client's
// share expire once the bucket has been full again for as long as it takes to empty
// (so that a replica's view of a key never outlives the key but by its loss: see
// gcraScript), and that no key holds the apikey.
func TestRedisKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"file_result": {Rate: 2, Burst: 4, ClientLimit: 3, ClientWindow: time.Minute}}
	r := newReplica(t, srv, limits, limiter.RedisOptions{Prefix: "test:"}, nil)
	if d := r.set.Limiter("file_result").Acquire(context.Background(), "secret-apikey"); d.Outcome != limiter.Allowed {
		t.Fatalf("first request: %v, want allowed", d.Outcome)
	}
	ctx := context.Background()
	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("keys = %q, want the route's and the client's", keys)
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, "test:") {
			t.Errorf("key %q, want it under the prefix test:", k)
		}
		if strings.Contains(k, "secret-apikey") {
			t.Errorf("key %q holds the client's apikey", k)
		}
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The route: one token used at 2/s refills in 0.5 s, and 4 take 2 s; the
		// client: one of 3 a minute, 20 s, and 3 take a minute. A millisecond more for
		// the rounding up to whole milliseconds.
		want := 2500 * time.Millisecond
		if strings.Contains(k, ":client:") {
			want = 80 * time.Second
		}
		if ttl <= want-time.Second || ttl > want+time.Millisecond {
			t.Errorf("PTTL %s = %v, want about %v", k, ttl, want)
		}
	}
}

// TestRedisWaitOnClock checks a request that must wait for its token: Redis gives the
// wait, the bucket's clock times it (a fake one here, so the test does not wait), and
// a request that gives up waiting gives its token back. A token comes every 10 s, so
// that the real time the steps take on Redis's clock (far less, even on a loaded
// machine) changes no outcome.
func TestRedisWaitOnClock(t *testing.T) {
	const interval = 10 * time.Second
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClockAt(time.Now())
	limits := map[string]limiter.Limit{"hash_lookup": {Rate: 0.1, Burst: 1, MaxWait: 10 * interval}}
	r := newReplica(t, srv, limits, limiter.RedisOptions{}, clock)
	l := r.set.Limiter("hash_lookup")
	ctx := context.Background()
	start := time.Now()
	if d := l.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
		t.Fatalf("first request: %v, want allowed", d.Outcome)
	}
	got := make(chan limiter.Decision, 1)
	go func() { got <- l.Acquire(ctx, "") }()
	untilWaiting(t, clock)
	// Redis counts the second request's wait on its own clock: the interval less the
	// real time since the first request's token, which is less than the time since start.
	least := interval - time.Since(start) - time.Millisecond
	clock.Advance(interval)
	d := <-got
	if d.Outcome != limiter.Delayed || d.Waited < least || d.Waited > interval {
		t.Errorf("second request: %v after %v, want delayed between %v and %v", d.Outcome, d.Waited, least, interval)
	}

	// A third waits about two intervals (its turn after the second's); it gives up,
	// and its token goes back: a fourth waits no longer than the third would have.
	cctx, cancel := context.WithCancel(ctx)
	go func() { got <- l.Acquire(cctx, "") }()
	untilWaiting(t, clock)
	cancel()
	if d := <-got; d.Outcome != limiter.Canceled {
		t.Errorf("third request, canceled: %v, want canceled", d.Outcome)
	}
	go func() { got <- l.Acquire(ctx, "") }()
	untilWaiting(t, clock)
	clock.Advance(2 * interval)
	if d := <-got; d.Outcome != limiter.Delayed || d.Waited > 2*interval {
		t.Errorf("fourth request: %v after %v, want delayed at most %v (the third's token given back)", d.Outcome, d.Waited, 2*interval)
	}
}

// TestRedisWithMaxWait: on Redis as in a local bucket, a request whose token is within
// MaxWait but beyond the bound of WithMaxWait is rejected at once with the time until
// its token, and gives its token back: the next request waits no longer than it would
// have; one within the bound waits. A token comes every 10 s and the bound is half
// that, so that the real time the steps take on Redis's clock changes no outcome.
func TestRedisWithMaxWait(t *testing.T) {
	const interval = 10 * time.Second
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClockAt(time.Now())
	limits := map[string]limiter.Limit{"hash_lookup": {Rate: 0.1, Burst: 1, MaxWait: 10 * interval}}
	r := newReplica(t, srv, limits, limiter.RedisOptions{}, clock)
	l := r.set.Limiter("hash_lookup")
	ctx := context.Background()
	start := time.Now()
	if d := l.Acquire(limiter.WithMaxWait(ctx, 0), ""); d.Outcome != limiter.Allowed {
		t.Fatalf("first request, bound 0, token free: %+v, want allowed", d)
	}
	for range 3 {
		d := l.Acquire(limiter.WithMaxWait(ctx, interval/2), "")
		// Redis's clock moved on since the first token, by less than since start.
		least := max(interval-time.Since(start)-time.Millisecond, interval/2)
		if d.Outcome != limiter.Rejected || d.RetryAfter < least || d.RetryAfter > interval {
			t.Errorf("request, bound %v, token in %v: %+v, want rejected with RetryAfter between %v and %v", interval/2, interval, d, least, interval)
		}
	}
	got := make(chan limiter.Decision, 1)
	go func() { got <- l.Acquire(limiter.WithMaxWait(ctx, 2*interval), "") }()
	untilWaiting(t, clock)
	clock.Advance(interval)
	if d := <-got; d.Outcome != limiter.Delayed || d.Waited > interval {
		t.Errorf("request, bound %v, after three refused: %+v, want delayed at most %v (the refused took nothing)", 2*interval, d, interval)
	}
}

// TestRedisRejectsBeyondMaxWait checks that a request whose token is further away than
// MaxWait is rejected at once, with the time until a token is free.
func TestRedisRejectsBeyondMaxWait(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"hash_lookup": {Rate: 0.01, Burst: 1, MaxWait: 50 * time.Second}}
	r := newReplica(t, srv, limits, limiter.RedisOptions{}, clockwork.NewFakeClock())
	l := r.set.Limiter("hash_lookup")
	if d := l.Acquire(context.Background(), ""); d.Outcome != limiter.Allowed {
		t.Fatalf("first request: %v, want allowed", d.Outcome)
	}
	d := l.Acquire(context.Background(), "")
	if d.Outcome != limiter.Rejected || d.RetryAfter < 99*time.Second || d.RetryAfter > 100*time.Second {
		t.Errorf("second request: %v, RetryAfter %v; want rejected, about 100s (a token every 100 s, MaxWait 50 s)", d.Outcome, d.RetryAfter)
	}
}

// TestRedisClientShare checks the per-client share in Redis, shared by the replicas:
// a client's third request of a 2-a-minute share is refused whichever replica takes
// it; another client is not affected; and a request the route refuses is given back to
// its client's share.
func TestRedisClientShare(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"file_result": {Rate: 1000, Burst: 1000, ClientLimit: 2, ClientWindow: time.Minute}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{}, nil)
	b := newReplica(t, srv, limits, limiter.RedisOptions{}, nil)
	ctx := context.Background()
	for i, r := range []replica{a, b} {
		if d := r.set.Limiter("file_result").Acquire(ctx, "k1"); d.Outcome != limiter.Allowed {
			t.Errorf("k1's request %d: %v, want allowed", i+1, d.Outcome)
		}
	}
	d := a.set.Limiter("file_result").Acquire(ctx, "k1")
	if d.Outcome != limiter.RejectedClient || d.RetryAfter <= 0 || d.RetryAfter > 30*time.Second {
		t.Errorf("k1's third request: %v, RetryAfter %v; want rejected_client within 30s", d.Outcome, d.RetryAfter)
	}
	if d := b.set.Limiter("file_result").Acquire(ctx, "k2"); d.Outcome != limiter.Allowed {
		t.Errorf("k2's first request: %v, want allowed", d.Outcome)
	}

	// The route refuses: the client's count is given back.
	tight := newReplica(t, srv, map[string]limiter.Limit{"hash_lookup": {Rate: 0.001, Burst: 1, ClientLimit: 2, ClientWindow: time.Minute}}, limiter.RedisOptions{}, nil)
	l := tight.set.Limiter("hash_lookup")
	outcomes := []limiter.Outcome{}
	for range 4 {
		outcomes = append(outcomes, l.Acquire(ctx, "k3").Outcome)
	}
	want := []limiter.Outcome{limiter.Allowed, limiter.Rejected, limiter.Rejected, limiter.Rejected}
	if !equalOutcomes(outcomes, want) {
		t.Errorf("k3 on a route with one token: %v, want %v (the route's refusals not counted against k3's share of 2)", outcomes, want)
	}
}

// TestRedisDryRun checks a dry run on Redis: what would be refused is let through and
// counted as would_reject, and takes no token.
func TestRedisDryRun(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 2, DryRun: true}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{}, nil)
	var got []limiter.Outcome
	for range 5 {
		d := a.set.Limiter("file_result").Acquire(context.Background(), "")
		if !d.Pass() {
			t.Errorf("dry run: %v does not pass", d.Outcome)
		}
		got = append(got, d.Outcome)
	}
	want := []limiter.Outcome{limiter.Allowed, limiter.Allowed, limiter.WouldReject, limiter.WouldReject, limiter.WouldReject}
	if !equalOutcomes(got, want) {
		t.Errorf("dry run outcomes %v, want %v", got, want)
	}
}

func equalOutcomes(a, b []limiter.Outcome) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// BenchmarkRedisDecision measures a decision in Redis (loopback redis-server, one
// round trip: EVALSHA of the GCRA script) beside the same decision by a local
// bucket.
func BenchmarkRedisDecision(b *testing.B) {
	srv := redistest.Start(b)
	limits := map[string]limiter.Limit{"file_result": {Rate: 1e9, Burst: 1 << 30}}
	ctx := context.Background()
	b.Run("redis", func(b *testing.B) {
		r := newReplica(b, srv, limits, limiter.RedisOptions{Timeout: time.Second}, nil)
		l := r.set.Limiter("file_result")
		b.ReportAllocs()
		for b.Loop() {
			if d := l.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
				b.Fatalf("outcome %v, want allowed", d.Outcome)
			}
		}
	})
	b.Run("local", func(b *testing.B) {
		set, err := limiter.NewSet(limits, nil)
		if err != nil {
			b.Fatal(err)
		}
		l := set.Limiter("file_result")
		b.ReportAllocs()
		for b.Loop() {
			if d := l.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
				b.Fatalf("outcome %v, want allowed", d.Outcome)
			}
		}
	})
}

// TestRedisUpdateNewBucket: a changed limit starts from a new, full bucket on Redis, as
// a local one does, for the route and for each client's share: loosening a tight limit
// never leaves its debt (the old limit's refill time) in force; an unchanged limit
// keeps its state.
func TestRedisUpdateNewBucket(t *testing.T) {
	srv := redistest.Start(t)
	tight := map[string]limiter.Limit{
		"hash_lookup": {Rate: 0.001, Burst: 3},
		"file_result": {Rate: 100, Burst: 100, ClientLimit: 1, ClientWindow: time.Hour},
	}
	r := newReplica(t, srv, tight, limiter.RedisOptions{}, nil)
	ctx := context.Background()
	drain := func(s *limiter.Set, route, client string) {
		t.Helper()
		for i := 0; s.Limiter(route).Acquire(ctx, client).Pass(); i++ {
			if i > 10 {
				t.Fatalf("%s: more than 10 requests allowed under a tight limit", route)
			}
		}
	}
	drain(r.set, "hash_lookup", "")
	drain(r.set, "file_result", "k1")

	// Unchanged: the same state (still refused), on another replica too.
	other := newReplica(t, srv, tight, limiter.RedisOptions{}, nil)
	if d := other.set.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Rejected {
		t.Errorf("hash_lookup on another replica with the same limit: %v, want rejected (one shared bucket)", d.Outcome)
	}
	same, _, err := r.set.Update(tight)
	if err != nil {
		t.Fatal(err)
	}
	if d := same.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Rejected {
		t.Errorf("hash_lookup after a reload of the same limit: %v, want rejected", d.Outcome)
	}

	// Loosened: allowed at once.
	loose, changed, err := r.set.Update(map[string]limiter.Limit{
		"hash_lookup": {Rate: 100, Burst: 200},
		"file_result": {Rate: 100, Burst: 100, ClientLimit: 100, ClientWindow: time.Second},
	})
	if err != nil || len(changed) != 2 {
		t.Fatalf("Update = %v, %v; want both routes changed", changed, err)
	}
	if d := loose.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Allowed {
		t.Errorf("hash_lookup after loosening its limit: %v (retry after %v), want allowed", d.Outcome, d.RetryAfter)
	}
	if d := loose.Limiter("file_result").Acquire(ctx, "k1"); d.Outcome != limiter.Allowed {
		t.Errorf("file_result for k1 after loosening its share: %v (retry after %v), want allowed", d.Outcome, d.RetryAfter)
	}
}

// TestRedisFallbackSaysWhy: limits that go to fallback because Redis refuses (a key of
// another type at the route's key) say Redis's error in the log line, not only that
// Redis does not answer.
func TestRedisFallbackSaysWhy(t *testing.T) {
	srv := redistest.Start(t)
	var logs sidecartest.LogBuffer
	r := newReplica(t, srv, map[string]limiter.Limit{"file_result": {Rate: 1, Burst: 1}},
		limiter.RedisOptions{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, nil)
	ctx := context.Background()
	r.set.Limiter("file_result").Acquire(ctx, "")
	rdb := srv.Client(t)
	keys, err := rdb.Keys(ctx, "*limit:file_result:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("KEYS = %q, %v; want the route's key", keys, err)
	}
	if err := rdb.Del(ctx, keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.LPush(ctx, keys[0], "x").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r.set.Limiter("file_result").Acquire(ctx, "")
	}
	if r.shared.Mode() != limiter.ModeFallback {
		t.Fatalf("mode = %v after WRONGTYPE answers, want fallback", r.shared.Mode())
	}
	if got := logs.String(); !strings.Contains(got, "limits in fallback") || !strings.Contains(got, "WRONGTYPE") {
		t.Errorf("logs = %s, want the fallback line with Redis's WRONGTYPE error", got)
	}
}
