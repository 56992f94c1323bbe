package limiter_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
)

// Issue 29: a key that Redis loses (evicted under maxmemory, flushed) is restored from
// the replicas' views of it, instead of coming back as a full bucket; Redis's clock
// stepped back never locks a bucket for longer than one refill. Keys are dropped here
// by DEL or FLUSHALL, which Redis cannot tell from an eviction; cmd/mdproxy's
// TestRedisEvictionKeepsLimit has Redis evict them under maxmemory.

// restores returns what r's Redis reports of route: its bucket's restores and its
// clients'.
func restores(r replica, route string) (bucket, client uint64) {
	r.shared.Restores(func(rt, kind string, n uint64) {
		if rt != route {
			return
		}
		switch kind {
		case "route":
			bucket = n
		case "client":
			client = n
		}
	})
	return bucket, client
}

// onlyKey returns the one key of srv matching pattern, failing t otherwise.
func onlyKey(t *testing.T, rdb *redis.Client, pattern string) string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), pattern).Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("KEYS %s = %q, %v; want one key", pattern, keys, err)
	}
	return keys[0]
}

// TestRedisLostKeyRestored: a route's bucket and a client's share, used up, are
// refused again after their keys were dropped (a DEL, and a FLUSHALL), as before the
// loss, with the same Retry-After; each loss is counted once, by kind, and logged once;
// the restored key holds the state it had.
func TestRedisLostKeyRestored(t *testing.T) {
	srv := redistest.Start(t)
	var logs sidecartest.LogBuffer
	limits := map[string]limiter.Limit{
		"hash_lookup": {Rate: 0.001, Burst: 3},
		"file_result": {ClientLimit: 2, ClientWindow: time.Hour},
	}
	r := newReplica(t, srv, limits, limiter.RedisOptions{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, nil)
	ctx := context.Background()
	rdb := srv.Client(t)
	route := r.set.Limiter("hash_lookup")
	for i := range 3 {
		if d := route.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
			t.Fatalf("hash_lookup request %d: %+v, want allowed (burst 3)", i+1, d)
		}
	}
	before := route.Acquire(ctx, "")
	if before.Outcome != limiter.Rejected {
		t.Fatalf("hash_lookup's 4th request: %+v, want rejected", before)
	}
	key := onlyKey(t, rdb, "mdproxy:limit:hash_lookup:*")
	state, err := rdb.Get(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	after := route.Acquire(ctx, "")
	if after.Outcome != limiter.Rejected || after.RetryAfter > before.RetryAfter || before.RetryAfter-after.RetryAfter > time.Second {
		t.Errorf("hash_lookup after its key was deleted: %+v, want rejected as before (%+v), not a full bucket", after, before)
	}
	got, err := rdb.Get(ctx, key).Result()
	if tat, _, _ := strings.Cut(got, ":"); err != nil || tat != state[:strings.IndexByte(state, ':')] {
		t.Errorf("hash_lookup's key after the restore = %q, %v; want the tat it held, %q", got, err, state)
	}
	if b, c := restores(r, "hash_lookup"); b != 1 || c != 0 {
		t.Errorf("Restores(hash_lookup) = route %d, client %d; want 1, 0", b, c)
	}

	share := r.set.Limiter("file_result")
	for i := range 2 {
		if d := share.Acquire(ctx, "k1"); d.Outcome != limiter.Allowed {
			t.Fatalf("k1's request %d: %+v, want allowed", i+1, d)
		}
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d := share.Acquire(ctx, "k1")
	if d.Outcome != limiter.RejectedClient || d.RetryAfter < 29*time.Minute || d.RetryAfter > 30*time.Minute {
		t.Errorf("k1 after FLUSHALL: %+v, want rejected_client with its token 30 minutes away", d)
	}
	if d := share.Acquire(ctx, "k2"); d.Outcome != limiter.Allowed {
		t.Errorf("k2, never seen: %+v, want allowed", d)
	}
	if b, c := restores(r, "file_result"); b != 0 || c != 1 {
		t.Errorf("Restores(file_result) = route %d, client %d; want 0, 1", b, c)
	}
	// The flush took hash_lookup's key too, which its next request restores (the third
	// restore; the log line of the first stands for them all).
	if d := route.Acquire(ctx, ""); d.Outcome != limiter.Rejected {
		t.Errorf("hash_lookup after FLUSHALL: %+v, want rejected", d)
	}
	if b, _ := restores(r, "hash_lookup"); b != 2 {
		t.Errorf("Restores(hash_lookup) after FLUSHALL = %d, want 2", b)
	}
	if n := strings.Count(logs.String(), "limiter state lost in Redis"); n != 1 {
		t.Errorf("%d log lines of lost state, want 1 (at most one a minute): %s", n, logs.String())
	}
}

// TestRedisLostKeyRecreatedByAnother: after a loss, a replica that knew nothing of the
// key (just started) creates it anew, full; the replica that saw the bucket empty
// restores its view into that key at its next call: the replicas let through at most
// what the new key held before then, and the bucket is refused again for both.
func TestRedisLostKeyRecreatedByAnother(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"hash_lookup": {Rate: 0.001, Burst: 3}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	ctx := context.Background()
	for range 4 {
		a.set.Limiter("hash_lookup").Acquire(ctx, "")
	}
	rdb := srv.Client(t)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	if d := b.set.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Allowed {
		t.Fatalf("new replica after the flush: %+v, want allowed (it knows nothing: a full bucket)", d)
	}
	if d := a.set.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Rejected {
		t.Errorf("old replica after the flush: %+v, want rejected (its view restored)", d)
	}
	if d := b.set.Limiter("hash_lookup").Acquire(ctx, ""); d.Outcome != limiter.Rejected {
		t.Errorf("new replica after the old one's restore: %+v, want rejected", d)
	}
	if n, _ := restores(a, "hash_lookup"); n != 1 {
		t.Errorf("old replica's Restores = %d, want 1", n)
	}
	if n, _ := restores(b, "hash_lookup"); n != 0 {
		t.Errorf("new replica's Restores = %d, want 0", n)
	}
}

// TestRedisGiveBackAcrossReplicas: a token that a waiting request on one replica gives
// back stays given back, although another replica saw it taken: views never undo the
// key's own state while the key lives.
func TestRedisGiveBackAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClockAt(time.Now())
	limits := map[string]limiter.Limit{"hash_lookup": {Rate: 1, Burst: 1, MaxWait: 10 * time.Second}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{}, clock)
	b := newReplica(t, srv, limits, limiter.RedisOptions{}, clock)
	ctx := context.Background()
	la, lb := a.set.Limiter("hash_lookup"), b.set.Limiter("hash_lookup")
	if d := la.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
		t.Fatalf("a's first request: %+v, want allowed", d)
	}
	cctx, cancel := context.WithCancel(ctx)
	got := make(chan limiter.Decision, 1)
	go func() { got <- lb.Acquire(cctx, "") }()
	untilWaiting(t, clock)
	// a sees b's token taken: its turn is 2 s away.
	if d := la.Acquire(limiter.WithMaxWait(ctx, 0), ""); d.Outcome != limiter.Rejected || d.RetryAfter < 1500*time.Millisecond {
		t.Fatalf("a's request while b waits: %+v, want rejected about 2s from its token", d)
	}
	cancel()
	if d := <-got; d.Outcome != limiter.Canceled {
		t.Fatalf("b's request, canceled: %+v, want canceled", d)
	}
	// b gave its token back: a's next token is about 1 s away, not 2.
	d := la.Acquire(limiter.WithMaxWait(ctx, 500*time.Millisecond), "")
	if d.Outcome != limiter.Rejected || d.RetryAfter > time.Second {
		t.Errorf("a's request after b gave its token back, bound 0.5s: %+v, want rejected with RetryAfter at most 1s (not 2s)", d)
	}
	if n, _ := restores(a, "hash_lookup"); n != 0 {
		t.Errorf("a's Restores = %d, want 0: nothing was lost", n)
	}
}

// TestRedisClockSteppedBack: keys written while Redis's clock was an hour ahead of
// where it now stands (their tat an hour further than any request can put it) refuse
// for no longer than one refill of the bucket and its wait, and of the client's share,
// and let the next request through once that has passed.
func TestRedisClockSteppedBack(t *testing.T) {
	srv := redistest.Start(t)
	// The route: 2 tokens at 10/s and a wait of 0.1 s (one token): 0.3 s ahead at most.
	// The client: 3 tokens at 3 per 0.6 s: 0.6 s ahead at most.
	limits := map[string]limiter.Limit{"file_result": {Rate: 10, Burst: 2, MaxWait: 100 * time.Millisecond,
		ClientLimit: 3, ClientWindow: 600 * time.Millisecond}}
	r := newReplica(t, srv, limits, limiter.RedisOptions{}, nil)
	ctx := limiter.WithMaxWait(context.Background(), 0) // decide at once: never wait
	l := r.set.Limiter("file_result")
	if d := l.Acquire(ctx, "k"); d.Outcome != limiter.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	rdb := srv.Client(t)
	for _, pattern := range []string{"mdproxy:limit:file_result:*", "mdproxy:client:file_result:*"} {
		key := onlyKey(t, rdb, pattern)
		v, err := rdb.Get(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		tat, gen, _ := strings.Cut(v, ":")
		n, err := strconv.ParseInt(tat, 10, 64)
		if err != nil {
			t.Fatalf("key %s = %q, want <tat>:<generation>", key, v)
		}
		if err := rdb.Set(ctx, key, fmt.Sprintf("%d:%s", n+time.Hour.Microseconds(), gen), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The client's share, clamped to 0.6 s ahead: its next token 0.2 s away.
	d := l.Acquire(ctx, "k")
	if d.Outcome != limiter.RejectedClient || d.RetryAfter > 200*time.Millisecond {
		t.Fatalf("k after the step back: %+v, want rejected_client within one token's interval, 200ms", d)
	}
	time.Sleep(d.RetryAfter) // Redis's clock must pass it; any longer only adds tokens
	if d := l.Acquire(ctx, "k"); d.Outcome != limiter.Allowed && d.Outcome != limiter.Rejected {
		t.Errorf("k its RetryAfter later: %+v, want its share's token (allowed, or refused by the route)", d)
	}
	// The route's bucket, clamped to 0.3 s ahead: its next token 0.2 s away.
	d = l.Acquire(ctx, "other")
	if d.Outcome != limiter.Rejected || d.RetryAfter > 200*time.Millisecond {
		t.Fatalf("another client after the step back: %+v, want rejected within 200ms (one refill and the wait, not an hour)", d)
	}
	time.Sleep(d.RetryAfter)
	if d := l.Acquire(ctx, "third"); d.Outcome != limiter.Allowed {
		t.Errorf("a third client the route's RetryAfter later: %+v, want allowed", d)
	}
	if b, c := restores(r, "file_result"); b != 0 || c != 0 {
		t.Errorf("Restores = %d, %d; want 0, 0: a clamp is no restore", b, c)
	}
}

// TestRedisClientShareBound floods one client's share on a real Redis from two
// replicas and checks the share's bound: among the requests let through, any whose
// Redis instants lie less than a window apart number at most 2*limit-1. Redis's
// instant of a decision lies between the request's sending and its answer, so a run of
// requests whose first was sent and last answered less than a window apart is within
// a window: a check that cannot fail wrongly. At least limit requests pass at once
// (the burst), so the check has something to bite on.
func TestRedisClientShareBound(t *testing.T) {
	srv := redistest.Start(t)
	const limit, window = 3, 300 * time.Millisecond
	limits := map[string]limiter.Limit{"file_result": {ClientLimit: limit, ClientWindow: window}}
	reps := []replica{
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil),
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil),
	}
	type pass struct{ sent, answered time.Time }
	var mu sync.Mutex
	var passes []pass
	stop := make(chan struct{})
	time.AfterFunc(2*time.Second, func() { close(stop) })
	var wg sync.WaitGroup
	for _, r := range reps {
		for range 2 {
			wg.Go(func() {
				l := r.set.Limiter("file_result")
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent := time.Now()
					d := l.Acquire(context.Background(), "apikey")
					answered := time.Now()
					if d.Outcome == limiter.Allowed {
						mu.Lock()
						passes = append(passes, pass{sent, answered})
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	for _, r := range reps {
		if r.shared.Mode() != limiter.ModeRedis {
			t.Fatalf("mode %v, want redis: the bound is the shared share's", r.shared.Mode())
		}
	}
	if len(passes) < limit {
		t.Fatalf("%d requests passed, want at least the burst, %d", len(passes), limit)
	}
	// Ordered by sending: a request sent later can be decided earlier, so a run is
	// any set of requests, taken here as every one sent at or after the i-th and
	// answered less than a window after it was sent.
	most := 0
	for i := range passes {
		n := 0
		for j := range passes {
			if !passes[j].sent.Before(passes[i].sent) && passes[j].answered.Sub(passes[i].sent) < window {
				n++
			}
		}
		most = max(most, n)
	}
	t.Logf("%d passed in 2s (%d a window on average, bound %d); at most %d certainly within a window", len(passes), limit, 2*limit-1, most)
	if most > 2*limit-1 {
		t.Errorf("%d requests let through within one window of %v, want at most 2*%d-1 = %d", most, window, limit, 2*limit-1)
	}
}
