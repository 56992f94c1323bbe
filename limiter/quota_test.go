package limiter_test

import (
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestDecisionQuota: a Bucket's decisions carry the route's bucket after them: the
// whole tokens left and the time until it is full, on refusals as on admissions, and
// the refill shows; a route without a rate knows no quota.
func TestDecisionQuota(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 3}, clock)
	type quota struct {
		o         limiter.Outcome
		known     bool
		remaining int
		full      time.Duration
	}
	got := func() quota {
		d := acquire(b, "")
		return quota{d.Outcome, d.QuotaKnown, d.Remaining, d.Full}
	}
	for i, want := range []quota{
		{limiter.Allowed, true, 2, time.Second},
		{limiter.Allowed, true, 1, 2 * time.Second},
		{limiter.Allowed, true, 0, 3 * time.Second},
		{limiter.Rejected, true, 0, 3 * time.Second},
	} {
		if q := got(); q != want {
			t.Errorf("decision %d = %+v, want %+v", i+1, q, want)
		}
	}
	clock.Advance(1500 * time.Millisecond) // one token and a half back
	if q, want := got(), (quota{limiter.Allowed, true, 0, 2500 * time.Millisecond}); q != want {
		t.Errorf("after 1.5 s = %+v, want %+v", q, want)
	}
	unlimited := mustBucket(t, limiter.Limit{ClientLimit: 2}, clock)
	if d := acquire(unlimited, "a"); d.QuotaKnown {
		t.Errorf("a decision of a route without a rate = %+v, want QuotaKnown false", d)
	}
}
