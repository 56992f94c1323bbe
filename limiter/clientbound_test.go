package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// Issue 29: the per-client share's bound, as Limit.ClientLimit and the README state it:
// among the requests of one client let through, any that lie less than a window apart
// number at most 2*limit-1, and less than n windows apart at most (n+1)*limit-1. These
// property tests drive the local share on a fake clock with adversarial and random
// arrivals and check every window; TestRedisClientShareBound checks the share on Redis.

// mostWithin returns the most of the instants at (sorted, ns) that lie less than span
// apart.
func mostWithin(at []int64, span time.Duration) int {
	most, j := 0, 0
	for i := range at {
		for j < len(at) && at[j]-at[i] < int64(span) {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// checkBound fails t when the instants at of one client's passes break the share's
// bound for windows of window at limit, over spans of one to three windows.
func checkBound(t *testing.T, name string, at []int64, limit int, window time.Duration) {
	t.Helper()
	for n := 1; n <= 3; n++ {
		if got, bound := mostWithin(at, time.Duration(n)*window), (n+1)*limit-1; got > bound {
			t.Fatalf("%s: %d of %d passes less than %d window(s) of %v apart, want at most %d", name, got, len(at), n, window, bound)
		}
	}
}

// TestClientShareBoundGreedy: a client that asks again exactly when its RetryAfter says
// (the most a share lets through), after a quiet time fills its bucket, reaches the
// bound and never passes it: the bound is exact.
func TestClientShareBoundGreedy(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 5, 7, 100} {
		for _, window := range []time.Duration{time.Second, 999 * time.Millisecond, 7 * time.Millisecond, time.Hour + 1} {
			name := fmt.Sprintf("%d per %v", limit, window)
			clock := newClock()
			b := mustBucket(t, limiter.Limit{ClientLimit: limit, ClientWindow: window}, clock)
			var at []int64
			for len(at) < 4*limit+10 {
				d := acquire(b, "a")
				switch d.Outcome {
				case limiter.Allowed:
					at = append(at, int64(clock.Since(epoch)))
				case limiter.RejectedClient:
					if d.RetryAfter <= 0 || d.RetryAfter > (window+time.Duration(limit)-1)/time.Duration(limit) {
						t.Fatalf("%s: RetryAfter %v, want above 0 and at most a token's interval, window/limit rounded up", name, d.RetryAfter)
					}
					clock.Advance(d.RetryAfter)
				default:
					t.Fatalf("%s: %v, want allowed or rejected_client", name, d.Outcome)
				}
			}
			checkBound(t, name, at, limit, window)
			if got := mostWithin(at, window); got != 2*limit-1 {
				t.Errorf("%s: greedy client got %d passes within a window, want the bound itself, %d", name, got, 2*limit-1)
			}
		}
	}
}

// TestClientShareBoundRandom: random arrivals of several clients (bursts, gaps around
// the token interval and the window, instants on and off window boundaries, requests
// the route's own bucket refuses) never break any client's bound.
func TestClientShareBoundRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 3))
	for trial := range 400 {
		limit := 1 + rng.IntN(8)
		window := time.Duration(1 + rng.Int64N(int64(5*time.Second)))
		l := limiter.Limit{ClientLimit: limit, ClientWindow: window}
		if rng.IntN(2) == 0 {
			// The route's bucket refuses some requests, which take nothing of a share.
			l.Rate = float64(limit) / window.Seconds() * (0.5 + rng.Float64())
			l.Rate = min(max(l.Rate, limiter.MinRate), limiter.MaxRate)
			l.Burst = 1 + rng.IntN(2*limit)
		}
		clock := newClock()
		b := mustBucket(t, l, clock)
		clients := []string{"a", "b", "c"}
		passes := map[string][]int64{}
		interval := window / time.Duration(limit)
		for range 600 {
			switch rng.IntN(5) {
			case 0: // a burst at one instant
			case 1:
				clock.Advance(time.Duration(rng.Int64N(int64(interval) + 1)))
			case 2:
				clock.Advance(interval + time.Duration(rng.Int64N(3)) - 1)
			case 3:
				clock.Advance(time.Duration(rng.Int64N(int64(2*window) + 1)))
			case 4: // to the next window boundary of the clock, or just before it
				left := window - clock.Since(epoch)%window
				clock.Advance(left - time.Duration(rng.Int64N(2)))
			}
			for range 1 + rng.IntN(limit+2) {
				c := clients[rng.IntN(len(clients))]
				if d := acquire(b, c); d.Outcome == limiter.Allowed {
					passes[c] = append(passes[c], int64(clock.Since(epoch)))
				}
			}
		}
		for c, at := range passes {
			checkBound(t, fmt.Sprintf("trial %d (%+v), client %s", trial, l, c), at, limit, window)
		}
	}
}
