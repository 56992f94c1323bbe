package limiter_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// Issue 29: the per-client share's bound, as Limit.ClientLimit and the README state it:
// among the requests of one client let through, any that lie less than a window apart
// number at most 2*limit-1, and less than n windows apart at most (n+1)*limit-1. These
// property tests drive the local share on a fake clock with adversarial and random
// arrivals and check every window; TestRedisClientShareBound checks the share on Redis.
// The share's other tests follow them.

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

// TestConcurrentClientShare releases many goroutines of two clients at once: each client
// gets exactly its share and the global bucket loses only the tokens of allowed requests.
func TestConcurrentClientShare(t *testing.T) {
	const (
		goroutines  = 200
		clientLimit = 3
		burst       = 50
	)
	clock := newClock()
	b := mustBucket(t, limiter.Limit{Rate: 1, Burst: burst, ClientLimit: clientLimit, ClientWindow: time.Hour}, clock)
	var allowed [2]atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			<-start
			client := i % 2
			if d := acquire(b, fmt.Sprint("client-", client)); d.Outcome == limiter.Allowed {
				allowed[client].Add(1)
			} else if d.Outcome != limiter.RejectedClient {
				t.Errorf("Acquire(client-%d) = %v, want allowed or rejected_client", client, d.Outcome)
			}
		})
	}
	close(start)
	wg.Wait()
	for c := range allowed {
		if got := allowed[c].Load(); got != clientLimit {
			t.Errorf("allowed of client-%d = %d, want %d", c, got, clientLimit)
		}
	}
	// The global bucket still holds burst - 2×clientLimit tokens at the same instant.
	for i := range burst - 2*clientLimit {
		if d := acquire(b, fmt.Sprint("other-", i)); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(other-%d) = %v, want allowed (global token left)", i, d.Outcome)
		}
	}
	if d := acquire(b, "last"); d.Outcome != limiter.Rejected {
		t.Errorf("Acquire(last) = %v, want rejected (global bucket empty)", d.Outcome)
	}
}

// TestClientShare checks the per-client share: clients are counted apart, and a client
// rejection takes no token of the global bucket.
func TestClientShare(t *testing.T) {
	const window = time.Hour // the clock stays in the first window unless told
	t.Run("clients are independent", func(t *testing.T) {
		b := mustBucket(t, limiter.Limit{ClientLimit: 3, ClientWindow: window}, newClock())
		for _, client := range []string{"apikey-a", "apikey-b", "10.0.0.7"} {
			for i := range 3 {
				if d := acquire(b, client); d.Outcome != limiter.Allowed {
					t.Fatalf("Acquire(%s) #%d = %v, want allowed", client, i+1, d.Outcome)
				}
			}
			for i := range 2 {
				d := acquire(b, client)
				if d.Outcome != limiter.RejectedClient {
					t.Fatalf("Acquire(%s) #%d = %v, want rejected_client", client, 4+i, d.Outcome)
				}
				// A token of 3 an hour comes back every 20 minutes.
				if want := 20 * time.Minute; d.RetryAfter != want {
					t.Errorf("Acquire(%s).RetryAfter = %v, want %v", client, d.RetryAfter, want)
				}
				if got, want := d.RetryAfterSeconds(), 1200; got != want {
					t.Errorf("Acquire(%s).RetryAfterSeconds() = %d, want %d", client, got, want)
				}
			}
		}
	})

	t.Run("default window is one second", func(t *testing.T) {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{ClientLimit: 1}, clock)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(a) #1 = %v, want allowed", d.Outcome)
		}
		d := acquire(b, "a")
		if d.Outcome != limiter.RejectedClient || d.RetryAfter != time.Second {
			t.Errorf("Acquire(a) #2 = %+v, want rejected_client with RetryAfter 1s (its token back a window later)", d)
		}
		clock.Advance(time.Second - 1)
		if d := acquire(b, "a"); d.Outcome != limiter.RejectedClient {
			t.Errorf("Acquire(a) a nanosecond before a second later = %+v, want rejected_client", d)
		}
		clock.Advance(1)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Errorf("Acquire(a) a second later = %+v, want allowed (a window of 1s)", d)
		}
		if got := b.Limit().ClientWindow; got != 0 {
			t.Errorf("Limit().ClientWindow = %v, want 0 as configured", got)
		}
	})

	t.Run("client rejection takes no global token", func(t *testing.T) {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 5, ClientLimit: 2, ClientWindow: window}, clock)
		steps := []struct {
			client string
			want   limiter.Outcome
		}{
			{"a", limiter.Allowed},
			{"a", limiter.Allowed},
			{"a", limiter.RejectedClient},
			{"a", limiter.RejectedClient},
			{"a", limiter.RejectedClient},
			{"b", limiter.Allowed},
			{"b", limiter.Allowed},
			{"b", limiter.RejectedClient},
			{"c", limiter.Allowed},  // the fifth and last global token
			{"d", limiter.Rejected}, // the global bucket is empty
			{"d", limiter.Rejected},
		}
		for i, s := range steps {
			if d := acquire(b, s.client); d.Outcome != s.want {
				t.Fatalf("step %d: Acquire(%s) = %v, want %v", i+1, s.client, d.Outcome, s.want)
			}
		}
	})

	t.Run("global rejection takes no client slot", func(t *testing.T) {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 1, ClientLimit: 2, ClientWindow: window}, clock)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(a) #1 = %v, want allowed", d.Outcome)
		}
		for i := range 5 {
			if d := acquire(b, "a"); d.Outcome != limiter.Rejected {
				t.Fatalf("Acquire(a) #%d = %v, want rejected (global)", i+2, d.Outcome)
			}
		}
		clock.Advance(time.Second)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(a) one second later = %v, want allowed (its second slot)", d.Outcome)
		}
	})
}

// TestClientShareGCRA checks the per-client share's token bucket on the fake clock, a
// share of 2 a second: two requests at once, then one each half second (its interval),
// and a refusal's RetryAfter is exactly the time until the client's next token.
func TestClientShareGCRA(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{ClientLimit: 2, ClientWindow: time.Second}, clock)
	steps := []struct {
		at     time.Duration // since epoch
		client string
		want   limiter.Outcome
		retry  time.Duration
	}{
		{0, "a", limiter.Allowed, 0},
		{0, "a", limiter.Allowed, 0},
		{0, "a", limiter.RejectedClient, 500 * time.Millisecond}, // the burst is used up
		{0, "b", limiter.Allowed, 0},                             // clients are counted apart
		{499 * time.Millisecond, "a", limiter.RejectedClient, time.Millisecond},
		{500 * time.Millisecond, "a", limiter.Allowed, 0}, // its first token back
		{500 * time.Millisecond, "a", limiter.RejectedClient, 500 * time.Millisecond},
		// Three within the second [0, 1s): 2*limit-1, the most any window holds.
		{time.Second, "a", limiter.Allowed, 0},
		{1200 * time.Millisecond, "b", limiter.Allowed, 0}, // b's bucket is full again
		{1200 * time.Millisecond, "b", limiter.Allowed, 0},
		{1200 * time.Millisecond, "b", limiter.RejectedClient, 500 * time.Millisecond},
		// A second after its last token was taken a client's bucket is full again.
		{2500 * time.Millisecond, "a", limiter.Allowed, 0},
		{2500 * time.Millisecond, "a", limiter.Allowed, 0},
		{2500 * time.Millisecond, "a", limiter.RejectedClient, 500 * time.Millisecond},
	}
	for i, s := range steps {
		clock.Advance(s.at - clock.Since(epoch))
		d := acquire(b, s.client)
		if d.Outcome != s.want {
			t.Fatalf("step %d at +%v: Acquire(%s) = %+v, want %v", i+1, s.at, s.client, d, s.want)
		}
		if s.want == limiter.RejectedClient && d.RetryAfter != s.retry {
			t.Errorf("step %d at +%v: Acquire(%s).RetryAfter = %v, want %v", i+1, s.at, s.client, d.RetryAfter, s.retry)
		}
	}
}

// TestClientRetryAfterHonoured: a client refused by its share that waits the
// Retry-After it got (whole seconds, as sent) gets through, wherever in the window its
// requests fell; one that waits a second less does not, when Retry-After is over a
// second.
func TestClientRetryAfterHonoured(t *testing.T) {
	for _, phase := range []time.Duration{0, 100 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 2500 * time.Millisecond, 2999 * time.Millisecond} {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{ClientLimit: 2, ClientWindow: 3 * time.Second}, clock)
		clock.Advance(phase)
		acquire(b, "a")
		acquire(b, "a")
		d := acquire(b, "a")
		if d.Outcome != limiter.RejectedClient {
			t.Fatalf("phase %v: third request %v, want rejected_client", phase, d.Outcome)
		}
		wait := time.Duration(d.RetryAfterSeconds()) * time.Second
		if wait > time.Second {
			clock.Advance(wait - time.Second)
			if e := acquire(b, "a"); e.Outcome != limiter.RejectedClient {
				t.Errorf("phase %v: a second before Retry-After %v: %v, want rejected_client (Retry-After not later than needed)", phase, wait, e.Outcome)
			}
			clock.Advance(time.Second)
		} else {
			clock.Advance(wait)
		}
		if e := acquire(b, "a"); e.Outcome != limiter.Allowed {
			t.Errorf("phase %v: after Retry-After %v: %v, want allowed", phase, wait, e.Outcome)
		}
	}
}

// TestClientRetryAfterExact: over random windows, limits and request times, a request
// refused by its share with RetryAfter r is refused again a nanosecond before r and let
// through at r: r is exactly when the next request first fits.
func TestClientRetryAfterExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		window := time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Second)))
		limit := 1 + rng.IntN(6)
		clock := newClock()
		b := mustBucket(t, limiter.Limit{ClientLimit: limit, ClientWindow: window}, clock)
		for range 40 {
			clock.Advance(time.Duration(rng.Int64N(int64(window / 2))))
			d := acquire(b, "a")
			if d.Outcome != limiter.RejectedClient {
				continue
			}
			if d.RetryAfter > 1 {
				clock.Advance(d.RetryAfter - 1)
				if e := acquire(b, "a"); e.Outcome != limiter.RejectedClient {
					t.Fatalf("trial %d (window %v, limit %d): a nanosecond before RetryAfter %v: %v, want rejected_client", trial, window, limit, d.RetryAfter, e.Outcome)
				}
				clock.Advance(1)
			} else {
				clock.Advance(d.RetryAfter)
			}
			if e := acquire(b, "a"); e.Outcome != limiter.Allowed {
				t.Fatalf("trial %d (window %v, limit %d): at RetryAfter %v: %v, want allowed", trial, window, limit, d.RetryAfter, e.Outcome)
			}
		}
	}
}
