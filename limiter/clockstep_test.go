package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// Issue 29: a clock stepped back never locks a bucket beyond one refill of it (burst/
// rate) and its MaxWait, nor a client's share beyond one token's interval; a clock
// stepped forward finds them full. The real clock's readings carry the monotonic clock,
// which a bucket counts on, so that only a fake clock (or one without monotonic
// readings) steps back at all; these tests step the fake one.

// TestClockStepBackRoute: a route's emptied bucket, its clock stepped back an hour,
// refuses for one token's interval, not an hour and that; stepped forward, it is full.
func TestClockStepBackRoute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit limiter.Limit
		retry time.Duration // the Retry-After after the step back: at most burst/rate + MaxWait
	}{
		{"no wait", limiter.Limit{Rate: 2, Burst: 2}, 500 * time.Millisecond},
		{"with MaxWait", limiter.Limit{Rate: 1, Burst: 1, MaxWait: 2 * time.Second}, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			b := mustBucket(t, tc.limit, clock)
			ctx := limiter.WithMaxWait(context.Background(), 0) // decide at once: never wait
			for i := range tc.limit.Burst {
				if d := b.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
					t.Fatalf("request %d: %+v, want allowed", i+1, d)
				}
			}
			clock.Advance(-time.Hour)
			d := b.Acquire(ctx, "")
			if d.Outcome != limiter.Rejected || d.RetryAfter != tc.retry {
				t.Fatalf("after the clock stepped back an hour: %+v, want rejected with RetryAfter %v", d, tc.retry)
			}
			clock.Advance(tc.retry)
			if d := b.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
				t.Errorf("its RetryAfter later: %+v, want allowed", d)
			}
			clock.Advance(2 * time.Hour)
			for i := range tc.limit.Burst {
				if d := b.Acquire(ctx, ""); d.Outcome != limiter.Allowed {
					t.Errorf("after the clock stepped forward, request %d: %+v, want allowed (full)", i+1, d)
				}
			}
			if d := b.Acquire(ctx, ""); d.Outcome != limiter.Rejected || d.RetryAfter > time.Second {
				t.Errorf("beyond the burst: %+v, want rejected within a token's interval", d)
			}
		})
	}
}

// TestClockStepBackClient: a client's emptied share, its clock stepped back an hour,
// refuses for one token's interval; stepped forward, it is full.
func TestClockStepBackClient(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{ClientLimit: 2, ClientWindow: time.Second}, clock)
	for range 2 {
		acquire(b, "a")
	}
	clock.Advance(-time.Hour)
	if d := acquire(b, "a"); d.Outcome != limiter.RejectedClient || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("after the clock stepped back an hour: %+v, want rejected_client with RetryAfter 500ms", d)
	}
	clock.Advance(500 * time.Millisecond)
	if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
		t.Errorf("its RetryAfter later: %+v, want allowed", d)
	}
	clock.Advance(2 * time.Hour)
	for i := range 2 {
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Errorf("after the clock stepped forward, request %d: %+v, want allowed", i+1, d)
		}
	}
}

// TestClockStepBackWaiter: a request that waits for its turn and is moved up the queue
// after the clock stepped back (the one before it gave up) waits at most MaxWait from
// then, not the step.
func TestClockStepBackWaiter(t *testing.T) {
	clock := newResetClock()
	b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 1, MaxWait: 5 * time.Second}, clock)
	ctx := context.Background()
	if d := acquire(b, ""); d.Outcome != limiter.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	bctx, cancel := context.WithCancel(ctx)
	second := startAcquire(t, clock.FakeClock, 1, b, bctx, "") // turn at +1 s
	third := startAcquire(t, clock.FakeClock, 2, b, ctx, "")   // turn at +2 s
	clock.Advance(-time.Hour)
	cancel()
	if d := result(t, second); d.Outcome != limiter.Canceled {
		t.Fatalf("second request: %+v, want canceled", d)
	}
	clock.waitResets(t, 1) // the third re-armed its timer for its new turn
	clock.Advance(5 * time.Second)
	if d := result(t, third); d.Outcome != limiter.Delayed {
		t.Errorf("third request, MaxWait after it was moved up: %+v, want delayed", d)
	}
}
