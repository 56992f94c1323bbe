package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/redistest"
	"github.com/mdproxy/mdproxy/limiter"
)

// TestRedisDecisionQuota: a decision taken in Redis carries the shared bucket after it,
// as a Bucket's does (TestDecisionQuota): the whole tokens left and the time until it is
// full, on refusals as on admissions, whichever replica asks; a decision of the fallback
// knows no quota of the fleet's bucket. One token a 100 s, so that the real time the
// calls take (Redis's clock) never brings a token back.
func TestRedisDecisionQuota(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"r": {Rate: 0.01, Burst: 3}}
	a := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	b := newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2}, nil)
	const interval = 100 * time.Second
	for i, step := range []struct {
		r         replica
		o         limiter.Outcome
		remaining int
		debt      time.Duration // Full, to within the time the calls took
	}{
		{a, limiter.Allowed, 2, interval},
		{b, limiter.Allowed, 1, 2 * interval},
		{a, limiter.Allowed, 0, 3 * interval},
		{b, limiter.Rejected, 0, 3 * interval},
	} {
		d := step.r.set.Limiter("r").Acquire(context.Background(), "")
		if d.Outcome != step.o || !d.QuotaKnown || d.Remaining != step.remaining || d.Full > step.debt || d.Full < step.debt-10*time.Second {
			t.Errorf("decision %d = %v, quota known %t, %d left, full in %v; want %v, known, %d left, full in %v",
				i+1, d.Outcome, d.QuotaKnown, d.Remaining, d.Full, step.o, step.remaining, step.debt)
		}
	}
	srv.Stop()
	if d := a.set.Limiter("r").Acquire(context.Background(), ""); d.QuotaKnown {
		t.Errorf("a decision with Redis down = %+v, want the quota unknown (the replica's share decided)", d)
	}
}

// TestRedisSetRate: SetRate puts a rate in force on a RedisBucket, within the route's
// floor and configured rate, on the same shared bucket in Redis (one key), and on its
// fallback at the replica's share: a refused request is told the new rate's wait.
func TestRedisSetRate(t *testing.T) {
	srv := redistest.Start(t)
	limits := map[string]limiter.Limit{"r": {Rate: 10, Burst: 2, RateMin: 0.01}}
	reps := []replica{
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2, Timeout: 50 * time.Millisecond}, nil),
		newReplica(t, srv, limits, limiter.RedisOptions{Replicas: 2, Timeout: 50 * time.Millisecond}, nil),
	}
	for _, r := range reps {
		if err := r.set.SetRate("r", 0.0001); err != nil || r.set.Limiter("r").Limit().Rate != 0.01 {
			t.Fatalf("SetRate(0.0001) = %v, rate %v; want nil, the floor 0.01", err, r.set.Limiter("r").Limit().Rate)
		}
	}
	// A token each 100 s now: the burst of 2 between the replicas, then a refusal that
	// waits about 100 s, where 10/s would have said 0.1 s.
	var outcomes []limiter.Outcome
	var retry time.Duration
	for i := range 3 {
		d := reps[i%2].set.Limiter("r").Acquire(context.Background(), "")
		outcomes = append(outcomes, d.Outcome)
		retry = d.RetryAfter
	}
	if outcomes[0] != limiter.Allowed || outcomes[1] != limiter.Allowed || outcomes[2] != limiter.Rejected || retry < 90*time.Second || retry > 100*time.Second {
		t.Errorf("at 0.01/s, burst 2: %v, the refusal's Retry-After %v; want allowed, allowed, rejected after about 100 s", outcomes, retry)
	}
	if keys, err := srv.Client(t).Keys(context.Background(), "mdproxy:limit:r:*").Result(); err != nil || len(keys) != 1 {
		t.Errorf("KEYS mdproxy:limit:r:* = %q, %v; want the configured limit's one key", keys, err)
	}
	srv.Stop()
	// The fallback at the replica's share: 0.005/s, a burst of 1.
	b := reps[0].set.Limiter("r")
	if d := b.Acquire(context.Background(), ""); d.Outcome != limiter.Allowed {
		t.Fatalf("first request in fallback = %+v, want allowed", d)
	}
	if d := b.Acquire(context.Background(), ""); d.Outcome != limiter.Rejected || d.RetryAfter < 190*time.Second {
		t.Errorf("second request in fallback = %+v, want rejected for about 200 s (half of 0.01/s)", d)
	}
}
