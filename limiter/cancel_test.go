package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestCanceledWaiterSlotReused checks issue 9's second case: a request that leaves the
// queue gives its turn to the requests behind it, so that the route keeps its rate
// (x/time/rate alone restores no token while later reservations exist,
// golang/go#56924). The clock moves only when told, so every turn is exact.
func TestCanceledWaiterSlotReused(t *testing.T) {
	clock := newResetClock()
	b := mustBucket(t, limiter.Limit{Rate: 20, Burst: 1, MaxWait: time.Second}, clock)
	if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() A = %v, want allowed", d.Outcome)
	}

	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	resB := startAcquire(t, clock.FakeClock, 1, b, ctxB, "B")                 // turn at 50 ms
	resC := startAcquire(t, clock.FakeClock, 2, b, context.Background(), "C") // turn at 100 ms
	resD := startAcquire(t, clock.FakeClock, 3, b, context.Background(), "D") // turn at 150 ms
	if n := b.Waiting(); n != 3 {
		t.Fatalf("Waiting() with B, C and D queued = %d, want 3", n)
	}
	cancelB()
	if d := result(t, resB); decided(d) != (limiter.Decision{Outcome: limiter.Canceled}) {
		t.Errorf("Acquire() B = %+v, want canceled, Waited 0", d)
	}
	clock.waitResets(t, 2) // C and D moved up one turn each

	for _, w := range []struct {
		name string
		ch   <-chan limiter.Decision
		turn time.Duration
	}{
		{"C", resC, 50 * time.Millisecond},  // B's turn
		{"D", resD, 100 * time.Millisecond}, // C's turn
	} {
		clock.Advance(w.turn - clock.Since(epoch))
		d := result(t, w.ch)
		if d.Outcome != limiter.Delayed || !near(d.Waited, w.turn, time.Microsecond) {
			t.Errorf("Acquire() %s = %+v, want delayed %v", w.name, d, w.turn)
		}
	}
	if n := b.Waiting(); n != 0 {
		t.Errorf("Waiting() after every request left = %d, want 0", n)
	}
	// D's old turn, at 150 ms, was given back: the next request takes it (not 200 ms).
	resE := startAcquire(t, clock.FakeClock, 1, b, context.Background(), "E")
	clock.Advance(50 * time.Millisecond)
	if d := result(t, resE); d.Outcome != limiter.Delayed || !near(d.Waited, 50*time.Millisecond, time.Microsecond) {
		t.Errorf("Acquire() E at +100ms = %+v, want delayed 50ms (D's old turn at 150ms, not 200ms)", d)
	}
}

// TestCanceledWaitersKeepRate offers many waiting requests that each give up after a
// short while, as pollers with a client timeout do: the requests let through must still
// come at the configured rate. Before the fix each cancel wasted a slot and the rate
// fell to a fraction of the setting.
//
// Ten pollers each send a request, give up on it 60 ms later if it still waits, and
// send the next at once, over 2 s of the fake clock, which moves 5 ms at a time. At
// each instant the requests whose turn came are let through, then each poller in turn
// gives up on its request if its 60 ms ran out (the requests behind it re-arm their
// timers for their new turns) and sends the next one, which waits on the clock (or is
// decided) before the next poller acts, as goroutines on the real clock give up and
// send again a few microseconds apart.
func TestCanceledWaitersKeepRate(t *testing.T) {
	const (
		rate    = 20.0
		span    = 2 * time.Second
		timeout = 60 * time.Millisecond
		step    = 5 * time.Millisecond // divides the timeout and the 50 ms between turns
		pollers = 10
	)
	clock := newResetClock()
	b := mustBucket(t, limiter.Limit{Rate: rate, Burst: 1, MaxWait: 10 * time.Second}, clock)
	type request struct {
		cancel   context.CancelFunc
		deadline time.Time
	}
	type answer struct {
		poller int
		d      limiter.Decision
	}
	inflight := make([]*request, pollers) // nil: the poller has none
	answers := make(chan answer, pollers)
	var queue []int // the pollers whose request is unanswered, in the order sent
	waiting := 0    // len(queue)
	passed := 0
	take := func(a answer) {
		inflight[a.poller].cancel()
		inflight[a.poller] = nil
		queue = slices.DeleteFunc(queue, func(p int) bool { return p == a.poller })
		waiting--
		switch a.d.Outcome {
		case limiter.Allowed, limiter.Delayed:
			passed++
		case limiter.Canceled:
		default:
			t.Errorf("poller %d: Acquire() = %+v, want allowed, delayed or canceled", a.poller, a.d)
		}
	}
	next := func() answer {
		select {
		case a := <-answers:
			return a
		case <-time.After(blockTimeout):
			t.Fatalf("at +%v: no answer after %v", clock.Since(epoch), blockTimeout)
			return answer{}
		}
	}
	// settle takes the answers that come until each request still unanswered waits on
	// a timer of the clock: those whose timer fired have answered then.
	settle := func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
			blocked := make(chan error, 1)
			go func(n int) { blocked <- clock.BlockUntilContext(ctx, n) }(waiting)
			select {
			case a := <-answers:
				cancel()
				take(a)
			case err := <-blocked:
				cancel()
				if err != nil {
					t.Fatalf("at +%v: %d requests neither answered nor waiting on the clock after %v", clock.Since(epoch), waiting, blockTimeout)
				}
				return
			}
		}
	}
	for clock.Since(epoch) <= span+timeout {
		now := clock.Now()
		for p := range inflight {
			// A request whose time ran out gives up: wait for it to leave, and for
			// those behind it to re-arm their timers.
			if r := inflight[p]; r != nil && !now.Before(r.deadline) {
				behind := len(queue) - 1 - slices.Index(queue, p)
				r.cancel()
				if a := next(); a.poller != p {
					t.Fatalf("at +%v: poller %d answered %+v while %d gave up, want %d's answer", clock.Since(epoch), a.poller, a.d, p, p)
				} else {
					take(a)
				}
				clock.waitResets(t, behind)
			}
			// A poller without a request sends one at once, until the span ends.
			for inflight[p] == nil && clock.Since(epoch) < span {
				ctx, cancel := context.WithCancel(context.Background())
				inflight[p] = &request{cancel: cancel, deadline: now.Add(timeout)}
				queue = append(queue, p)
				waiting++
				go func() { answers <- answer{p, b.Acquire(ctx, "c")} }()
				settle()
			}
		}
		clock.Advance(step)
		settle()
	}
	if waiting != 0 {
		t.Fatalf("%d requests unanswered after the span and their timeout", waiting)
	}
	// burst + rate × span = 41 at most (a request sent before the end may pass after
	// it, within its 60 ms: one more); a slot lost per cancel gives far fewer.
	if want := int(rate*span.Seconds()) * 8 / 10; passed < want || passed > 41+1 {
		t.Errorf("requests let through in %v at %v/s with canceling waiters = %d, want %d to 42", span, rate, passed, want)
	}
	t.Logf("let through in %v at %v/s with canceling waiters: %d", span, rate, passed)
}

// TestCanceledWaitersTogether has several waiting requests give up at the same
// instant, as the polls of a burst whose clients share a timeout do: each gives its
// turn to the requests behind it, so that the one left takes the first turn and a new
// request the turn after it, as if the others had never come.
//
// x/time/rate's Reservation.CancelAt, which the bucket used before, restored a token in
// full only for the reservation whose turn was the limiter's lastEvent, then moved
// lastEvent back by exactly 1/rate; turns taken while the tokens were fractional are
// 1/rate apart only to a nanosecond, so every later cancel of a run restored (nearly)
// nothing: with 6 of 7 waiters (sent 2 ms apart at 20/s) giving up together, 4 tokens
// were lost and the new request waited 286 ms instead of 86 ms. The bucket's GCRA gives
// back exactly.
func TestCanceledWaitersTogether(t *testing.T) {
	const (
		rate = 20.0 // a turn every 50 ms
		gap  = 2 * time.Millisecond
	)
	for _, n := range []int{2, 4, 6, 9} { // requests that give up, of n+1 waiting
		t.Run(fmt.Sprintf("%d of %d", n, n+1), func(t *testing.T) {
			clock := newResetClock()
			b := mustBucket(t, limiter.Limit{Rate: rate, Burst: 1, MaxWait: 10 * time.Second}, clock)
			if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
				t.Fatalf("Acquire() A = %v, want allowed", d.Outcome)
			}
			var leaving []<-chan limiter.Decision
			var giveUp []context.CancelFunc
			for i := range n {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				giveUp = append(giveUp, cancel)
				leaving = append(leaving, startAcquire(t, clock.FakeClock, i+1, b, ctx, "w"))
				clock.Advance(gap)
			}
			sentLast := clock.Since(epoch)
			last := startAcquire(t, clock.FakeClock, n+1, b, context.Background(), "last") // turn at (n+1) × 50 ms
			clock.Advance(gap)
			// They give up at one instant, first to last, with no request between.
			for i, ch := range leaving {
				giveUp[i]()
				if d := result(t, ch); d.Outcome != limiter.Canceled {
					t.Fatalf("Acquire() #%d = %+v, want canceled", i+1, d)
				}
				clock.waitResets(t, n-i) // the requests behind it moved up
			}
			// The one left has the first turn, 50 ms; a new request the next, 100 ms.
			now := clock.Since(epoch)
			probe := startAcquire(t, clock.FakeClock, 2, b, context.Background(), "new")
			clock.Advance(time.Second)
			if d := result(t, last); d.Outcome != limiter.Delayed || !near(d.Waited, 50*time.Millisecond-sentLast, time.Microsecond) {
				t.Errorf("Acquire() of the one left = %+v, want delayed %v (the first turn, 50ms)", d, 50*time.Millisecond-sentLast)
			}
			if d := result(t, probe); d.Outcome != limiter.Delayed || !near(d.Waited, 100*time.Millisecond-now, time.Microsecond) {
				t.Errorf("Acquire() of a new request at +%v = %+v, want delayed %v (the turn at 100ms): %.1f tokens lost",
					now, d, 100*time.Millisecond-now, float64(d.Waited-(100*time.Millisecond-now))*rate/float64(time.Second))
			}
		})
	}
}

// TestCanceledWaiterClientShareGivenBack checks the per-client sibling of the slot
// lost on cancel: a request that gave up while waiting never reached Core, so it must
// not use up its client's share either.
func TestCanceledWaiterClientShareGivenBack(t *testing.T) {
	clock := newClock()
	// A share of 2 a minute: a window the test never leaves.
	b := mustBucket(t, limiter.Limit{Rate: 20, Burst: 1, MaxWait: time.Second, ClientLimit: 2, ClientWindow: time.Minute}, clock)
	if d := acquire(b, "k"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() #1 = %v, want allowed", d.Outcome)
	}
	// The second request of k waits for its token, then gives up.
	if d := b.Acquire(canceledCtx(), "k"); d.Outcome != limiter.Canceled {
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
