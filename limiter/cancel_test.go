package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestCanceledWaiterSlotReused checks issue 9's second case: a request that leaves the
// queue gives its turn to the requests behind it, so that the route keeps its rate
// (x/time/rate alone restores no token while later reservations exist,
// golang/go#56924). The bucket clock is frozen, so every turn is exact.
func TestCanceledWaiterSlotReused(t *testing.T) {
	clock := newFakeClock()
	b := mustBucket(t, limiter.Limit{Rate: 20, Burst: 1, MaxWait: time.Second}, clock.Now)
	if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() A = %v, want allowed", d.Outcome)
	}

	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	results := make(chan struct {
		name string
		d    limiter.Decision
	}, 3)
	start := func(name string, ctx context.Context, queued int) {
		go func() {
			d := b.Acquire(ctx, newRequest(), name)
			results <- struct {
				name string
				d    limiter.Decision
			}{name, d}
		}()
		waitQueued(t, b, queued)
	}
	start("B", ctxB, 1)                 // turn at 50 ms
	start("C", context.Background(), 2) // turn at 100 ms
	start("D", context.Background(), 3) // turn at 150 ms
	cancelB()

	want := map[string]limiter.Decision{
		"B": {Outcome: limiter.Canceled},
		"C": {Outcome: limiter.Delayed, Waited: 50 * time.Millisecond},  // B's turn
		"D": {Outcome: limiter.Delayed, Waited: 100 * time.Millisecond}, // C's turn
	}
	for range 3 {
		r := <-results
		if w := want[r.name]; r.d.Outcome != w.Outcome || !near(r.d.Waited, w.Waited, time.Microsecond) {
			t.Errorf("Acquire() %s = %+v, want %+v", r.name, r.d, w)
		}
	}
	if n := b.Waiting(); n != 0 {
		t.Errorf("Waiting() after every request left = %d, want 0", n)
	}
	// D's old turn was given back: the next request at the same instant takes it.
	if d := acquire(b, "e"); d.Outcome != limiter.Delayed || !near(d.Waited, 150*time.Millisecond, time.Microsecond) {
		t.Errorf("Acquire() E = %+v, want delayed 150ms (D's old turn, not 200ms)", d)
	}
}

// TestCanceledWaitersKeepRate offers, on the real clock, many waiting requests that
// each give up after a short while, as pollers with a client timeout do: the requests
// let through must still come at the configured rate. Before the fix each cancel
// wasted a slot and the rate fell to a fraction of the setting.
func TestCanceledWaitersKeepRate(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s on the real clock")
	}
	const rate, period = 20.0, 2 * time.Second
	b := mustBucket(t, limiter.Limit{Rate: rate, Burst: 1, MaxWait: 10 * time.Second}, nil)
	deadline := time.Now().Add(period)
	passed := make(chan int, 10)
	for range 10 {
		go func() {
			n := 0
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
				if b.Acquire(ctx, newRequest(), "c").Pass() {
					n++
				}
				cancel()
			}
			passed <- n
		}()
	}
	total := 0
	for range 10 {
		total += <-passed
	}
	// burst + rate × period = 41 at most; a slot lost per cancel gives far fewer.
	if want := int(rate*period.Seconds()) * 8 / 10; total < want || total > 41+1 {
		t.Errorf("requests let through in %v at %v/s with canceling waiters = %d, want %d to 42", period, rate, total, want)
	}
}

// TestCanceledWaiterClientShareGivenBack checks the per-client sibling of the slot
// lost on cancel: a request that gave up while waiting never reached Core, so it must
// not use up its client's share either.
func TestCanceledWaiterClientShareGivenBack(t *testing.T) {
	clock := newFakeClock()
	// A share of 2 a minute: a window no test run crosses but at its very edge.
	b := mustBucket(t, limiter.Limit{Rate: 20, Burst: 1, MaxWait: time.Second, ClientLimit: 2, ClientWindow: time.Minute}, clock.Now)
	if d := acquire(b, "k"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() #1 = %v, want allowed", d.Outcome)
	}
	// The second request of k waits for its token, then gives up.
	if d := b.Acquire(canceledCtx(), newRequest(), "k"); d.Outcome != limiter.Canceled {
		t.Fatalf("Acquire(canceled) #2 = %v, want canceled", d.Outcome)
	}
	// Its share still has room for one: the wait is the outcome, not a share refusal.
	clock.Advance(time.Second)
	if d := acquire(b, "k"); d.Outcome != limiter.Allowed {
		t.Errorf("Acquire() #3 after a canceled wait = %+v, want allowed (the canceled request given back to the share)", d)
	}
	if d := acquire(b, "k"); d.Outcome != limiter.RejectedClient {
		t.Errorf("Acquire() #4 = %+v, want rejected_client (share of 2 used)", d)
	}
}
