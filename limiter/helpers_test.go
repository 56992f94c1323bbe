package limiter_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/mdproxy/mdproxy/limiter"
)

// epoch is the first instant of every fake clock: the start of a second, a minute and
// an hour, so that the per-client windows start there too.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// newClock returns a fake clock at epoch. It moves only by Advance; a request waiting
// for its token waits on one of its timers, which Advance fires.
func newClock() *clockwork.FakeClock { return clockwork.NewFakeClockAt(epoch) }

// mustBucket returns limiter.NewBucket(l, clock, opts...), failing t on an error.
func mustBucket(t testing.TB, l limiter.Limit, clock clockwork.Clock, opts ...limiter.Option) *limiter.Bucket {
	t.Helper()
	b, err := limiter.NewBucket(l, clock, opts...)
	if err != nil {
		t.Fatalf("NewBucket(%+v) = %v, want no error", l, err)
	}
	return b
}

// acquire calls l.Acquire with a background context.
func acquire(l limiter.Limiter, client string) limiter.Decision {
	return l.Acquire(context.Background(), client)
}

// canceledCtx returns a context that is already done.
func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// near reports whether got is within tol of want.
func near(got, want, tol time.Duration) bool {
	d := got - want
	return d >= -tol && d <= tol
}

// blockTimeout bounds every wait for a goroutine to reach the fake clock. It is a
// safety net that only a broken limiter reaches, never a wait for a bucket or a window.
const blockTimeout = 10 * time.Second

// result returns the decision sent on ch, failing t after blockTimeout.
func result(t testing.TB, ch <-chan limiter.Decision) limiter.Decision {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(blockTimeout):
		t.Fatalf("no decision after %v", blockTimeout)
		return limiter.Decision{}
	}
}

// timersAtLeast reports, without waiting, whether clock holds at least n timers.
func timersAtLeast(clock *clockwork.FakeClock, n int) bool {
	return clock.BlockUntilContext(canceledCtx(), n) == nil
}

// startAcquire starts l.Acquire(ctx, client) in a goroutine and returns the channel of
// its decision once the request waits on the clock, that is once clock holds timers
// timers, the request's included. It fails t if the request is decided at once.
func startAcquire(t testing.TB, clock *clockwork.FakeClock, timers int, l limiter.Limiter, ctx context.Context, client string) <-chan limiter.Decision {
	t.Helper()
	done := make(chan limiter.Decision, 1)
	go func() { done <- l.Acquire(ctx, client) }()
	bctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	blocked := make(chan error, 1)
	go func() { blocked <- clock.BlockUntilContext(bctx, timers) }()
	select {
	case d := <-done:
		t.Fatalf("Acquire(%s) = %+v at once, want it waiting on the clock's timer", client, d)
	case err := <-blocked:
		if err != nil {
			t.Fatalf("Acquire(%s): fewer than %d timers on the clock after %v, want the request waiting: %v", client, timers, blockTimeout, err)
		}
	}
	return done
}

// acquireAtOnce returns l.Acquire(ctx, client), failing t if the request waits on the
// clock instead of being decided at once; timers is how many timers clock holds before.
func acquireAtOnce(t testing.TB, clock *clockwork.FakeClock, timers int, l limiter.Limiter, ctx context.Context, client string) limiter.Decision {
	t.Helper()
	done := make(chan limiter.Decision, 1)
	go func() { done <- l.Acquire(ctx, client) }()
	bctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	blocked := make(chan error, 1)
	go func() { blocked <- clock.BlockUntilContext(bctx, timers+1) }()
	select {
	case d := <-done:
		return d
	case <-blocked:
		// Let the request go, so that it leaves no goroutine behind.
		clock.Advance(time.Hour)
		d := <-done
		t.Fatalf("Acquire(%s) waited on the clock (then %+v), want a decision at once", client, d)
		return d
	}
}

// resetClock is a fake clock whose timers report each Reset, once done, on resets. A
// request moved up the queue (one before it gave up) re-arms its timer from its own
// goroutine, reading the clock then resetting the timer by the time left: a test waits
// for that Reset before it moves the clock, or the timer would be armed from an instant
// the clock has already left.
type resetClock struct {
	*clockwork.FakeClock
	resets chan struct{}
}

func newResetClock() *resetClock {
	return &resetClock{FakeClock: newClock(), resets: make(chan struct{}, 64)}
}

func (c *resetClock) NewTimer(d time.Duration) clockwork.Timer {
	return resetTimer{c.FakeClock.NewTimer(d), c.resets}
}

type resetTimer struct {
	clockwork.Timer
	resets chan<- struct{}
}

func (t resetTimer) Reset(d time.Duration) bool {
	active := t.Timer.Reset(d)
	t.resets <- struct{}{}
	return active
}

// waitResets waits for n timers of c to have been Reset, failing t after blockTimeout.
func (c *resetClock) waitResets(t testing.TB, n int) {
	t.Helper()
	for i := range n {
		select {
		case <-c.resets:
		case <-time.After(blockTimeout):
			t.Fatalf("%d of %d timers reset after %v, want all: a request moved up the queue did not re-arm its timer", i, n, blockTimeout)
		}
	}
}

// tickingClock is a fake clock that moves forward by tick on every reading, for
// floods whose simulated span must be exactly known. Only Now ticks.
type tickingClock struct {
	*clockwork.FakeClock
	tick  time.Duration
	ticks atomic.Int64
}

func (c *tickingClock) Now() time.Time {
	return epoch.Add(time.Duration(c.ticks.Add(1)) * c.tick)
}

// benchAcquire measures Acquire on b, serially and from parallel goroutines, and fails
// if a decision is not want. client gives the client key of the i-th request.
func benchAcquire(b *testing.B, bucket *limiter.Bucket, want limiter.Outcome, client func(i int) string) {
	b.Helper()
	ctx := context.Background()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if d := bucket.Acquire(ctx, client(i)); d.Outcome != want {
				b.Fatalf("Acquire() = %v, want %v", d.Outcome, want)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1)) * 1_000_000 // each goroutine its own run of keys
			for pb.Next() {
				if d := bucket.Acquire(ctx, client(i)); d.Outcome != want {
					b.Errorf("Acquire() = %v, want %v", d.Outcome, want)
					return
				}
				i++
			}
		})
	})
}

func oneClient(int) string { return "client" }

// clientKeys are the client keys the per-client benchmarks cycle through.
var clientKeys = func() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "apikey-" + strconv.Itoa(i)
	}
	return keys
}()

func cycleClients(i int) string { return clientKeys[i%len(clientKeys)] }

// decided returns d without its quota (QuotaKnown, Remaining, Full), for tests of the
// outcome, the wait and RetryAfter alone.
func decided(d limiter.Decision) limiter.Decision {
	d.QuotaKnown, d.Remaining, d.Full = false, 0, 0
	return d
}
