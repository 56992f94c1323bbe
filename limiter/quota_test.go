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

// TestSetRate: SetRate changes a bucket's rate in place, clamped to the route's floor
// and configured rate: the tokens missing stay missing, the refill follows the new
// rate, and Configured still gives the configured limit.
func TestSetRate(t *testing.T) {
	clock := newClock()
	set, err := limiter.NewSet(map[string]limiter.Limit{"r": {Rate: 10, Burst: 10, RateMin: 2}}, clock)
	if err != nil {
		t.Fatal(err)
	}
	b := set.Limiter("r")
	for range 10 {
		acquire(b, "")
	}
	if err := set.SetRate("r", 1); err != nil { // under the floor: 2
		t.Fatalf("SetRate = %v", err)
	}
	if got := b.Limit().Rate; got != 2 {
		t.Errorf("rate after SetRate(1) with RateMin 2 = %v, want 2", got)
	}
	if d := acquire(b, ""); d.Outcome != limiter.Rejected || d.RetryAfter != 500*time.Millisecond {
		t.Errorf("an empty bucket at 2/s = %+v, want rejected, a token in 500ms", d)
	}
	clock.Advance(500 * time.Millisecond)
	if d := acquire(b, ""); d.Outcome != limiter.Allowed {
		t.Errorf("after 500ms at 2/s = %+v, want allowed", d)
	}
	if err := set.SetRate("r", 50); err != nil || b.Limit().Rate != 10 {
		t.Errorf("SetRate(50) = %v, rate %v; want nil, 10 (the configured rate)", err, b.Limit().Rate)
	}
	if l, ok := set.Configured("r"); !ok || l.Rate != 10 || l.Floor() != 2 {
		t.Errorf("Configured(r) = %+v, %t; want rate 10, floor 2", l, ok)
	}
	if err := set.SetRate("none", 1); err == nil {
		t.Error("SetRate of a route without a limit = nil, want an error")
	}
}
