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
