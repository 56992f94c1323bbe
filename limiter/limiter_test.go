package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/limiter"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestBucketFlood offers requests far faster than the rate over a simulated minute and
// checks that the bucket lets through its burst plus rate × elapsed, within one request.
func TestBucketFlood(t *testing.T) {
	const (
		span = 60 * time.Second
		// step divides the refill period of every rate (20 ms at 50/s, 50 ms at 20/s),
		// so that a token never waits for the next request in a full bucket, where the
		// burst cap would drop the refill of the rest of the step.
		step    = 10 * time.Millisecond
		perStep = 5 // 500 requests a second, ten times the highest rate
	)
	tests := []struct {
		rate  float64
		burst int
	}{
		{0.5, 1},
		{0.5, 5},
		{1, 1},
		{1, 10},
		{20, 1},
		{20, 5},
		{50, 1},
		{50, 10},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("rate=%v/burst=%d", tt.rate, tt.burst), func(t *testing.T) {
			t.Parallel()
			clock := newClock()
			l := limiter.Limit{Rate: tt.rate, Burst: tt.burst}
			b := mustBucket(t, l, clock)
			var accepted, offered int
			for elapsed := time.Duration(0); elapsed <= span; elapsed += step {
				for range perStep {
					offered++
					switch d := acquire(b, "c"); d.Outcome {
					case limiter.Allowed:
						accepted++
					case limiter.Rejected:
						if d.RetryAfter <= 0 {
							t.Fatalf("at %v: Acquire() = %+v, want RetryAfter > 0 on Rejected", elapsed, d)
						}
					default:
						t.Fatalf("at %v: Acquire().Outcome = %v, want allowed or rejected (MaxWait is 0)", elapsed, d.Outcome)
					}
				}
				clock.Advance(step)
			}
			want := float64(tt.burst) + tt.rate*span.Seconds()
			if math.Abs(float64(accepted)-want) > 1 {
				t.Errorf("accepted of %d offered over %v = %d, want %v ± 1", offered, span, accepted, want)
			}
		})
	}
}

// TestBucketConcurrentFlood floods a bucket from many goroutines on a clock that moves
// forward on every reading, so that the simulated span is exactly known.
func TestBucketConcurrentFlood(t *testing.T) {
	const (
		goroutines = 8
		perG       = 2000
		tick       = time.Millisecond // the clock moves this much per reading
		rate       = 10.0
		burst      = 5
	)
	clock := &tickingClock{FakeClock: newClock(), tick: tick}
	b := mustBucket(t, limiter.Limit{Rate: rate, Burst: burst}, clock)
	built := clock.ticks.Load() // the bucket's own first reading, its time's origin
	var accepted atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			<-start
			for range perG {
				if acquire(b, "c").Outcome == limiter.Allowed {
					accepted.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	elapsed := time.Duration(clock.ticks.Load()-built) * tick
	want := burst + rate*elapsed.Seconds()
	if got := float64(accepted.Load()); math.Abs(got-want) > 1 {
		t.Errorf("accepted over %v from %d goroutines = %v, want %v ± 1", elapsed, goroutines, got, want)
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		name        string
		rate        float64
		burst       int
		advance     time.Duration // after the burst is consumed
		wantRetry   time.Duration
		wantSeconds int
	}{
		{"rate 0.1", 0.1, 1, 0, 10 * time.Second, 10},
		{"rate 2 rounds up to min 1", 2, 1, 0, 500 * time.Millisecond, 1},
		{"rate 0.3 rounds 3.33 up", 0.3, 1, 0, 3333333333 * time.Nanosecond, 4},
		{"rate 0.1 partial refill after 5s", 0.1, 1, 5 * time.Second, 5 * time.Second, 5},
		{"rate 0.5 burst 3", 0.5, 3, 0, 2 * time.Second, 2},
		{"rate 1 almost refilled", 1, 1, 999 * time.Millisecond, time.Millisecond, 1},
		{"rate 0.25 partial refill 1.5s", 0.25, 2, 1500 * time.Millisecond, 2500 * time.Millisecond, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			b := mustBucket(t, limiter.Limit{Rate: tt.rate, Burst: tt.burst}, clock)
			for i := range tt.burst {
				if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
					t.Fatalf("Acquire() #%d in burst %d = %v, want allowed", i+1, tt.burst, d.Outcome)
				}
			}
			clock.Advance(tt.advance)
			d := acquire(b, "c")
			if d.Outcome != limiter.Rejected {
				t.Fatalf("Acquire() after burst + %v = %v, want rejected", tt.advance, d.Outcome)
			}
			if !near(d.RetryAfter, tt.wantRetry, time.Microsecond) {
				t.Errorf("Acquire().RetryAfter = %v, want %v", d.RetryAfter, tt.wantRetry)
			}
			if got := d.RetryAfterSeconds(); got != tt.wantSeconds {
				t.Errorf("RetryAfterSeconds() with RetryAfter %v = %d, want %d", d.RetryAfter, got, tt.wantSeconds)
			}
		})
	}
}

func TestDecisionRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want int
	}{
		{0, 1},
		{time.Nanosecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Millisecond, 2},
		{2500 * time.Millisecond, 3},
		{10*time.Second - time.Nanosecond, 10},
		{10 * time.Second, 10},
		{10*time.Second + 100*time.Nanosecond, 10}, // floating-point noise
		{time.Minute, 60},
	}
	for _, tt := range tests {
		d := limiter.Decision{Outcome: limiter.Rejected, RetryAfter: tt.in}
		if got := d.RetryAfterSeconds(); got != tt.want {
			t.Errorf("Decision{RetryAfter: %v}.RetryAfterSeconds() = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestDecisionPass(t *testing.T) {
	tests := []struct {
		o    limiter.Outcome
		want bool
	}{
		{limiter.Allowed, true},
		{limiter.Delayed, true},
		{limiter.Rejected, false},
		{limiter.RejectedClient, false},
		{limiter.Canceled, false},
		{limiter.WouldReject, true}, // a dry run lets it go on
		{limiter.Exempt, true},
	}
	for _, tt := range tests {
		if got := (limiter.Decision{Outcome: tt.o}).Pass(); got != tt.want {
			t.Errorf("Decision{Outcome: %v}.Pass() = %v, want %v", tt.o, got, tt.want)
		}
	}
}

// TestRejectedConsumesNoToken rejects many requests while the bucket is empty and checks
// that the next token is still free exactly one refill period after the burst was spent.
func TestRejectedConsumesNoToken(t *testing.T) {
	tests := []struct {
		rate     float64
		burst    int
		rejected int // requests offered, all rejected, before the next token
	}{
		{1, 1, 100},
		{0.5, 2, 50},
		{20, 3, 200},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("rate=%v/burst=%d", tt.rate, tt.burst), func(t *testing.T) {
			clock := newClock()
			b := mustBucket(t, limiter.Limit{Rate: tt.rate, Burst: tt.burst}, clock)
			for i := range tt.burst {
				if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
					t.Fatalf("Acquire() #%d in burst = %v, want allowed", i+1, d.Outcome)
				}
			}
			period := time.Duration(float64(time.Second) / tt.rate)
			almost := period - time.Millisecond
			for i := range tt.rejected {
				at := almost * time.Duration(i) / time.Duration(tt.rejected-1)
				clock.Advance(at - (clock.Now().Sub(epoch)))
				d := acquire(b, "c")
				if d.Outcome != limiter.Rejected {
					t.Fatalf("Acquire() at +%v = %v, want rejected", at, d.Outcome)
				}
				if want := period - at; !near(d.RetryAfter, want, time.Microsecond) {
					t.Fatalf("Acquire() at +%v: RetryAfter = %v, want %v", at, d.RetryAfter, want)
				}
			}
			clock.Advance(period - clock.Now().Sub(epoch))
			if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
				t.Fatalf("Acquire() at +%v after %d rejections = %+v, want allowed", period, tt.rejected, d)
			}
			// The token just taken was the only one: the next is a whole period away.
			d := acquire(b, "c")
			if d.Outcome != limiter.Rejected || !near(d.RetryAfter, period, time.Microsecond) {
				t.Errorf("Acquire() right after = %+v, want rejected with RetryAfter %v", d, period)
			}
		})
	}
}

// TestMaxWaitFrozenClock queues requests on a frozen clock, so that each delay is exact:
// the delayed requests wait on the clock's timers, each until the clock reaches its
// turn, and not a moment less.
func TestMaxWaitFrozenClock(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{Rate: 20, Burst: 2, MaxWait: 100 * time.Millisecond}, clock)
	ctx := context.Background()
	for i := range 2 {
		if d := acquireAtOnce(t, clock, 0, b, ctx, "c"); decided(d) != (limiter.Decision{Outcome: limiter.Allowed}) {
			t.Fatalf("Acquire() #%d = %+v, want allowed", i+1, d)
		}
	}
	third := startAcquire(t, clock, 1, b, ctx, "c")  // turn at 50 ms
	fourth := startAcquire(t, clock, 2, b, ctx, "c") // turn at 100 ms
	for i := range 2 {
		// Beyond MaxWait (150 ms); the first rejection took nothing.
		d := acquireAtOnce(t, clock, 2, b, ctx, "c")
		if d.Outcome != limiter.Rejected || d.Waited != 0 || !near(d.RetryAfter, 150*time.Millisecond, time.Microsecond) {
			t.Fatalf("Acquire() #%d = %+v, want rejected with RetryAfter 150ms", 5+i, d)
		}
	}
	for i, w := range []struct {
		ch      <-chan limiter.Decision
		waited  time.Duration
		waiting int // timers on the clock until its turn, its own included
	}{
		{third, 50 * time.Millisecond, 2},
		{fourth, 100 * time.Millisecond, 1},
	} {
		// A timer never fires early: a millisecond before its turn the request waits.
		clock.Advance(w.waited - 1*time.Millisecond - clock.Since(epoch))
		if !timersAtLeast(clock, w.waiting) {
			t.Errorf("Acquire() #%d: gone from the clock at %v, before its turn at %v", 3+i, clock.Since(epoch), w.waited)
		}
		clock.Advance(time.Millisecond)
		d := result(t, w.ch)
		if d.Outcome != limiter.Delayed || !near(d.Waited, w.waited, time.Microsecond) {
			t.Errorf("Acquire() #%d = %+v, want delayed %v", 3+i, d, w.waited)
		}
	}
}

// TestMaxWait runs the decisions of MaxWait alone: a request within it waits for its
// token on the clock, one beyond it (or with MaxWait 0) is rejected at once.
func TestMaxWait(t *testing.T) {
	tests := []struct {
		name   string
		limit  limiter.Limit
		want   limiter.Outcome
		waited time.Duration // Waited, for Delayed: the clock must reach it
		retry  time.Duration // RetryAfter, for Rejected
	}{
		{
			name:   "within MaxWait is delayed",
			limit:  limiter.Limit{Rate: 10, Burst: 1, MaxWait: time.Second},
			want:   limiter.Delayed,
			waited: 100 * time.Millisecond,
		},
		{
			name:  "beyond MaxWait is rejected at once",
			limit: limiter.Limit{Rate: 0.5, Burst: 1, MaxWait: 50 * time.Millisecond},
			want:  limiter.Rejected,
			retry: 2 * time.Second,
		},
		{
			name:  "zero MaxWait rejects at once",
			limit: limiter.Limit{Rate: 0.5, Burst: 1},
			want:  limiter.Rejected,
			retry: 2 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newClock()
			b := mustBucket(t, tt.limit, clock)
			ctx := context.Background()
			if d := acquireAtOnce(t, clock, 0, b, ctx, "c"); d.Outcome != limiter.Allowed {
				t.Fatalf("first Acquire() = %v, want allowed", d.Outcome)
			}
			if tt.want == limiter.Rejected {
				d := acquireAtOnce(t, clock, 0, b, ctx, "c")
				if d.Outcome != limiter.Rejected || d.Waited != 0 || !near(d.RetryAfter, tt.retry, time.Microsecond) {
					t.Errorf("second Acquire() = %+v, want rejected at once, RetryAfter %v", d, tt.retry)
				}
				return
			}
			ch := startAcquire(t, clock, 1, b, ctx, "c")
			clock.Advance(tt.waited - time.Millisecond)
			if !timersAtLeast(clock, 1) {
				t.Errorf("second Acquire() gone from the clock %v before its turn at %v", time.Millisecond, tt.waited)
			}
			clock.Advance(time.Millisecond)
			if d := result(t, ch); d.Outcome != tt.want || !near(d.Waited, tt.waited, time.Microsecond) {
				t.Errorf("second Acquire() = %+v, want delayed %v", d, tt.waited)
			}
		})
	}
}

// TestCanceled checks that a request whose context ends while it waits is Canceled and
// gives its token back, so that the next request at the same instant can take it.
func TestCanceled(t *testing.T) {
	clock := newClock()
	// Without the token given back, the third request would wait 2 s > MaxWait.
	b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 1, MaxWait: 1500 * time.Millisecond}, clock)
	if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() #1 = %v, want allowed", d.Outcome)
	}

	// The context ends while the request waits on the clock's timer (1 s), which the
	// clock never reaches.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := startAcquire(t, clock, 1, b, ctx, "c")
	cancel()
	d := result(t, ch)
	if d.Outcome != limiter.Canceled {
		t.Fatalf("Acquire(ctx canceled while waiting) #2 = %+v, want canceled", d)
	}
	if d.Waited != 0 {
		t.Errorf("Acquire(ctx canceled while waiting).Waited = %v, want 0 (the clock did not move)", d.Waited)
	}
	if timersAtLeast(clock, 1) {
		t.Errorf("after the canceled request left, its timer is still on the clock, want it stopped")
	}

	// Same instant: the token given back is reserved again (delay 1 s, not 2 s).
	if d := b.Acquire(canceledCtx(), "c"); d.Outcome != limiter.Canceled {
		t.Fatalf("Acquire(canceled ctx) #3 at the same instant = %+v, want canceled (not rejected: token given back)", d)
	}

	// One period later the token is free at once: Allowed returns before looking at ctx.
	clock.Advance(time.Second)
	if d := b.Acquire(canceledCtx(), "c"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire(canceled ctx) #4 one second later = %+v, want allowed", d)
	}
}

// TestCanceledRace cancels a request's context as it starts: the goroutine may see the
// canceled context before or after it starts waiting, and either way it reserved a
// token and must give it back.
func TestCanceledRace(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 1, MaxWait: 1500 * time.Millisecond}, clock)
	if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire() #1 = %v, want allowed", d.Outcome)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan limiter.Decision, 1)
	go func() { done <- b.Acquire(ctx, "c") }()
	cancel()
	d := result(t, done)
	if d.Outcome != limiter.Canceled {
		t.Fatalf("Acquire(ctx canceled while waiting) = %+v, want canceled", d)
	}
	if d.Waited != 0 {
		t.Errorf("Acquire(ctx canceled while waiting).Waited = %v, want 0 (the clock did not move)", d.Waited)
	}
	// Without the token given back the next wait would be 2 s > MaxWait: rejected.
	if d := b.Acquire(canceledCtx(), "c"); d.Outcome != limiter.Canceled {
		t.Fatalf("Acquire(canceled ctx) after a canceled wait = %+v, want canceled (token given back)", d)
	}
}

// TestConcurrentBurst releases many goroutines at once against a bucket whose rate is
// tiny: exactly its burst must pass.
func TestConcurrentBurst(t *testing.T) {
	tests := []struct {
		goroutines, burst int
	}{
		{50, 1},
		{100, 10},
		{100, 100},
		{300, 100},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("n=%d/burst=%d", tt.goroutines, tt.burst), func(t *testing.T) {
			// One token every 1000 s, on a clock that does not move.
			b := mustBucket(t, limiter.Limit{Rate: 0.001, Burst: tt.burst}, newClock())
			var allowed, rejected atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range tt.goroutines {
				wg.Go(func() {
					<-start
					switch acquire(b, "c").Outcome {
					case limiter.Allowed:
						allowed.Add(1)
					case limiter.Rejected:
						rejected.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if got := allowed.Load(); got != int64(tt.burst) {
				t.Errorf("allowed of %d concurrent = %d, want %d", tt.goroutines, got, tt.burst)
			}
			if got, want := rejected.Load(), int64(tt.goroutines-tt.burst); got != want {
				t.Errorf("rejected of %d concurrent = %d, want %d", tt.goroutines, got, want)
			}
		})
	}
}

func TestUnlimited(t *testing.T) {
	t.Run("nil bucket", func(t *testing.T) {
		var b *limiter.Bucket
		for i := range 1000 {
			if d := b.Acquire(context.Background(), "c"); decided(d) != (limiter.Decision{Outcome: limiter.Allowed}) {
				t.Fatalf("(*Bucket)(nil).Acquire() #%d = %+v, want allowed", i+1, d)
			}
		}
		if got := b.Limit(); got != (limiter.Limit{}) {
			t.Errorf("(*Bucket)(nil).Limit() = %+v, want the zero Limit", got)
		}
	})
	t.Run("zero limit", func(t *testing.T) {
		b := mustBucket(t, limiter.Limit{}, nil)
		for i := range 1000 {
			if d := b.Acquire(canceledCtx(), "c"); decided(d) != (limiter.Decision{Outcome: limiter.Allowed}) {
				t.Fatalf("Acquire() #%d on the zero Limit = %+v, want allowed", i+1, d)
			}
		}
	})
	t.Run("Limit.Unlimited", func(t *testing.T) {
		tests := []struct {
			l    limiter.Limit
			want bool
		}{
			{limiter.Limit{}, true},
			{limiter.Limit{Burst: 5, MaxWait: time.Second, ClientWindow: time.Minute}, true},
			{limiter.Limit{Rate: 0.5}, false},
			{limiter.Limit{ClientLimit: 1}, false},
		}
		for _, tt := range tests {
			if got := tt.l.Unlimited(); got != tt.want {
				t.Errorf("%+v.Unlimited() = %v, want %v", tt.l, got, tt.want)
			}
		}
	})
}

func TestDefaultBurst(t *testing.T) {
	tests := []struct {
		rate      float64
		burst     int
		wantBurst int
	}{
		{0.1, 0, 1},
		{0.5, 0, 1},
		{1, 0, 1},
		{2.5, 0, 3},
		{20, 0, 20},
		{50, 0, 50},
		{20, 7, 7},
		{0, 0, 0}, // no global bucket: nothing to fill in
	}
	for _, tt := range tests {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{Rate: tt.rate, Burst: tt.burst}, clock)
		if got := b.Limit().Burst; got != tt.wantBurst {
			t.Errorf("NewBucket(Rate %v, Burst %d).Limit().Burst = %d, want %d", tt.rate, tt.burst, got, tt.wantBurst)
		}
		if tt.rate == 0 {
			continue
		}
		// The bucket really holds that many tokens at once.
		var allowed int
		for range tt.wantBurst + 5 {
			if acquire(b, "c").Outcome == limiter.Allowed {
				allowed++
			}
		}
		if allowed != tt.wantBurst {
			t.Errorf("allowed at once by NewBucket(Rate %v, Burst %d) = %d, want %d", tt.rate, tt.burst, allowed, tt.wantBurst)
		}
	}
}

func TestNewBucketInvalid(t *testing.T) {
	tests := []struct {
		name  string
		l     limiter.Limit
		field string // named in the error
	}{
		{"negative rate", limiter.Limit{Rate: -1}, "rate"},
		{"NaN rate", limiter.Limit{Rate: math.NaN()}, "rate"},
		{"infinite rate", limiter.Limit{Rate: math.Inf(1)}, "rate"},
		{"negative infinite rate", limiter.Limit{Rate: math.Inf(-1)}, "rate"},
		{"negative burst", limiter.Limit{Rate: 1, Burst: -1}, "burst"},
		{"negative burst, no rate", limiter.Limit{Burst: -1}, "burst"},
		{"negative max wait", limiter.Limit{Rate: 1, MaxWait: -time.Second}, "max wait"},
		{"negative client limit", limiter.Limit{ClientLimit: -1}, "client limit"},
		{"negative client window", limiter.Limit{ClientLimit: 1, ClientWindow: -time.Second}, "client window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := limiter.NewBucket(tt.l, nil)
			if err == nil {
				t.Fatalf("NewBucket(%+v) = %v, nil, want an error naming %q", tt.l, b, tt.field)
			}
			if !strings.HasPrefix(err.Error(), tt.field+" ") {
				t.Errorf("NewBucket(%+v) error = %q, want it to start with %q", tt.l, err, tt.field)
			}
			if b != nil {
				t.Errorf("NewBucket(%+v) bucket = %v, want nil with the error", tt.l, b)
			}
		})
	}
}

// TestValidate: Validate joins one *FieldError for each field out of range, in field
// order, naming the field, and nil for a valid Limit, the bounds included.
func TestValidate(t *testing.T) {
	bad := limiter.Limit{Rate: limiter.MaxRate * 2, Burst: -1, MaxWait: limiter.MaxMaxWait + 1,
		ClientLimit: -1, ClientWindow: limiter.MaxClientWindow + 1}
	err := bad.Validate()
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		t.Fatalf("Limit%+v.Validate() = %T %v, want errors joined", bad, err, err)
	}
	var fields []string
	for _, e := range joined.Unwrap() {
		var fe *limiter.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("Limit%+v.Validate() holds %T %v, want only *limiter.FieldError", bad, e, e)
		}
		fields = append(fields, fe.Field)
	}
	if want := []string{"Rate", "Burst", "MaxWait", "ClientLimit", "ClientWindow"}; !slices.Equal(fields, want) {
		t.Errorf("Limit%+v.Validate() names %v, want %v", bad, fields, want)
	}
	for _, l := range []limiter.Limit{
		{},
		{Rate: limiter.MinRate, MaxWait: limiter.MaxMaxWait},
		{Rate: limiter.MaxRate, Burst: math.MaxInt32, ClientLimit: 1, ClientWindow: limiter.MaxClientWindow, DryRun: true},
	} {
		if err := l.Validate(); err != nil {
			t.Errorf("Limit%+v.Validate() = %v, want nil", l, err)
		}
	}
}

func TestNewSet(t *testing.T) {
	clock := newClock()
	s, err := limiter.NewSet(map[string]limiter.Limit{
		"file_result": {Rate: 2, Burst: 4},
		"hash_lookup": {ClientLimit: 3},
		"file_submit": {}, // unlimited
	}, clock)
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	tests := []struct {
		route   string
		wantNil bool
		want    limiter.Limit
	}{
		{"file_result", false, limiter.Limit{Rate: 2, Burst: 4}},
		{"hash_lookup", false, limiter.Limit{ClientLimit: 3}},
		{"file_submit", true, limiter.Limit{}},
		{"no_such_route", true, limiter.Limit{}},
		{"", true, limiter.Limit{}},
	}
	for _, tt := range tests {
		l := s.Limiter(tt.route)
		if (l == nil) != tt.wantNil {
			t.Errorf("Set.Limiter(%q) = %v, want nil: %v", tt.route, l, tt.wantNil)
		}
		if l != nil {
			if _, ok := l.(*limiter.Bucket); !ok {
				t.Errorf("Set.Limiter(%q) = %T, want a *limiter.Bucket (no WithRedis)", tt.route, l)
			}
			if got := l.Limit(); got != tt.want {
				t.Errorf("Set.Limiter(%q).Limit() = %+v, want %+v", tt.route, got, tt.want)
			}
		}
		if got := s.Limit(tt.route); got != tt.want {
			t.Errorf("Set.Limit(%q) = %+v, want %+v", tt.route, got, tt.want)
		}
	}
	// The buckets share the clock given to NewSet.
	b := s.Limiter("file_result")
	for i := range 4 {
		if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(file_result) #%d = %v, want allowed", i+1, d.Outcome)
		}
	}
	if d := acquire(b, "c"); d.Outcome != limiter.Rejected {
		t.Fatalf("Acquire(file_result) #5 = %v, want rejected", d.Outcome)
	}
	clock.Advance(500 * time.Millisecond)
	if d := acquire(b, "c"); d.Outcome != limiter.Allowed {
		t.Fatalf("Acquire(file_result) 500ms later = %v, want allowed", d.Outcome)
	}

	var nilSet *limiter.Set
	if l := nilSet.Limiter("file_result"); l != nil {
		t.Errorf("(*Set)(nil).Limiter(file_result) = %v, want nil", l)
	}
	if got := nilSet.Limit("file_result"); got != (limiter.Limit{}) {
		t.Errorf("(*Set)(nil).Limit(file_result) = %+v, want the zero Limit", got)
	}
}

func TestSetUpdate(t *testing.T) {
	clock := newClock()
	s, err := limiter.NewSet(map[string]limiter.Limit{
		"file_result":  {Rate: 1, Burst: 1},
		"batch_status": {Rate: 2, Burst: 2},
		"hash_lookup":  {Rate: 1, Burst: 1},
		"stat":         {MaxWait: time.Second}, // unlimited
	}, clock)
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	// Empty the buckets, so that whether a bucket was kept or built anew shows.
	for _, route := range []string{"file_result", "batch_status", "hash_lookup"} {
		b := s.Limiter(route)
		for acquire(b, "c").Pass() {
		}
	}

	next, changed, err := s.Update(map[string]limiter.Limit{
		"file_result":  {Rate: 1, Burst: 1},   // unchanged: kept
		"batch_status": {Rate: 10, Burst: 10}, // changed: new and full
		"file_submit":  {Rate: 3},             // new
		"stat":         {},                    // no MaxWait: it had no effect without a rate
		// hash_lookup removed: unlimited
	})
	if err != nil {
		t.Fatalf("Update() = %v, want no error", err)
	}
	if want := []string{"batch_status", "file_submit", "hash_lookup"}; !slices.Equal(changed, want) {
		t.Errorf("Update() changed = %v, want %v", changed, want)
	}
	if got, old := next.Limiter("file_result"), s.Limiter("file_result"); got != old {
		t.Errorf("Update().Limiter(file_result) = %p, want the old bucket %p: its limit did not change", got, old)
	}
	if d := acquire(next.Limiter("file_result"), "c"); d.Outcome != limiter.Rejected {
		t.Errorf("Acquire(file_result) after Update = %v, want rejected: a kept bucket keeps its tokens", d.Outcome)
	}
	nb := next.Limiter("batch_status")
	if nb == s.Limiter("batch_status") || nb.Limit() != (limiter.Limit{Rate: 10, Burst: 10}) {
		t.Fatalf("Update().Limiter(batch_status) = %p with %+v, want a new bucket with rate 10, burst 10", nb, nb.Limit())
	}
	for i := range 10 {
		if d := acquire(nb, "c"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(batch_status) #%d after Update = %v, want allowed: a new bucket starts full", i+1, d.Outcome)
		}
	}
	if d := acquire(nb, "c"); d.Outcome != limiter.Rejected {
		t.Errorf("Acquire(batch_status) #11 after Update = %v, want rejected", d.Outcome)
	}
	// A new bucket runs on the Set's clock.
	clock.Advance(100 * time.Millisecond)
	if d := acquire(nb, "c"); d.Outcome != limiter.Allowed {
		t.Errorf("Acquire(batch_status) 100ms later = %v, want allowed on the Set's clock", d.Outcome)
	}
	if got := next.Limiter("file_submit").Limit(); got != (limiter.Limit{Rate: 3, Burst: 3}) {
		t.Errorf("Update().Limiter(file_submit).Limit() = %+v, want rate 3, burst 3", got)
	}
	for _, route := range []string{"hash_lookup", "stat"} {
		if b := next.Limiter(route); b != nil {
			t.Errorf("Update().Limiter(%s) = %p, want nil (unlimited)", route, b)
		}
	}
	// The old Set is untouched: requests holding its buckets finish there.
	if got := s.Limiter("batch_status").Limit().Rate; got != 2 {
		t.Errorf("old Set's Limiter(batch_status) rate after Update = %v, want 2", got)
	}
	if s.Limiter("hash_lookup") == nil {
		t.Error("old Set's Limiter(hash_lookup) after Update = nil, want its bucket")
	}

	// Nothing changed (burst 0 is ceil(rate); a client window without a client limit,
	// a max wait without a rate, have no effect): every bucket is kept.
	again, changed, err := next.Update(map[string]limiter.Limit{
		"file_result": {Rate: 1, Burst: 1, ClientWindow: 5 * time.Second}, "batch_status": {Rate: 10},
		"file_submit": {Rate: 3}, "stat": {MaxWait: 2 * time.Second, ClientWindow: time.Minute},
	})
	if err != nil || len(changed) != 0 {
		t.Errorf("Update(same limits) = %v, %v; want no change, no error", changed, err)
	}
	for _, route := range []string{"file_result", "batch_status", "file_submit"} {
		if again.Limiter(route) != next.Limiter(route) {
			t.Errorf("Update(same limits).Limiter(%s) is a new bucket, want the old one", route)
		}
	}

	// An invalid limit changes nothing.
	bad, changed, err := next.Update(map[string]limiter.Limit{"file_result": {Rate: -1}})
	if err == nil || bad != nil || changed != nil || !strings.HasPrefix(err.Error(), "route file_result: rate ") {
		t.Errorf("Update(rate -1) = %v, %v, %v; want nil, nil and an error naming route file_result's rate", bad, changed, err)
	}

	// Update of a nil Set builds every bucket.
	var nilSet *limiter.Set
	fresh, changed, err := nilSet.Update(map[string]limiter.Limit{"file_result": {Rate: 1}})
	if err != nil || fresh.Limiter("file_result") == nil || !slices.Equal(changed, []string{"file_result"}) {
		t.Errorf("(*Set)(nil).Update(file_result rate 1) = %v, %v, %v; want a Set with its bucket, [file_result], nil", fresh, changed, err)
	}
}

func TestNewSetInvalid(t *testing.T) {
	tests := []struct {
		name  string
		l     limiter.Limit
		field string
	}{
		{"negative rate", limiter.Limit{Rate: -0.5}, "rate"},
		{"NaN rate", limiter.Limit{Rate: math.NaN()}, "rate"},
		{"negative burst", limiter.Limit{Rate: 1, Burst: -3}, "burst"},
		{"negative burst, no rate", limiter.Limit{Burst: -3}, "burst"},
		{"negative max wait", limiter.Limit{Rate: 1, MaxWait: -time.Millisecond}, "max wait"},
		{"negative max wait, no rate", limiter.Limit{MaxWait: -time.Millisecond}, "max wait"},
		{"negative client limit", limiter.Limit{ClientLimit: -2}, "client limit"},
		{"negative client window", limiter.Limit{Rate: 1, ClientWindow: -time.Second}, "client window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits := map[string]limiter.Limit{
				"file_result": tt.l,
				"file_submit": {},
				"hash_lookup": {Rate: 1},
			}
			s, err := limiter.NewSet(limits, nil)
			if err == nil {
				t.Fatalf("NewSet(file_result: %+v) = %v, nil, want an error", tt.l, s)
			}
			if want := "route file_result: " + tt.field + " "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("NewSet(file_result: %+v) error = %q, want it to start with %q", tt.l, err, want)
			}
		})
	}
}

func TestOutcomeString(t *testing.T) {
	tests := []struct {
		o    limiter.Outcome
		want string
	}{
		{limiter.Allowed, "allowed"},
		{limiter.Delayed, "delayed"},
		{limiter.Rejected, "rejected"},
		{limiter.RejectedClient, "rejected_client"},
		{limiter.Canceled, "canceled"},
		{limiter.WouldReject, "would_reject"},
		{limiter.Exempt, "exempt"},
		{limiter.Outcome(-1), "unknown"},
		{limiter.Outcome(99), "unknown"},
	}
	for _, tt := range tests {
		if got := tt.o.String(); got != tt.want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(tt.o), got, tt.want)
		}
	}
}

// TestOutcomes checks that Outcomes counts every Outcome: each of 0 to Outcomes-1 has a
// label of its own, and Outcomes itself is none.
func TestOutcomes(t *testing.T) {
	if limiter.Outcomes != 7 {
		t.Errorf("Outcomes = %d, want 7 (allowed to exempt)", limiter.Outcomes)
	}
	seen := map[string]bool{}
	for o := range limiter.Outcomes {
		s := limiter.Outcome(o).String()
		if s == "unknown" || seen[s] {
			t.Errorf("Outcome(%d).String() = %q, want a label of its own", o, s)
		}
		seen[s] = true
	}
	if got := limiter.Outcome(limiter.Outcomes).String(); got != "unknown" {
		t.Errorf("Outcome(Outcomes).String() = %q, want unknown", got)
	}
}

// TestSetUpdateEffective: a reload changes a route's bucket only when its limit acts
// differently, not when only a setting without effect moved.
func TestSetUpdateEffective(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new limiter.Limit
		changed  bool
	}{
		{"client window without a client limit", limiter.Limit{Rate: 0.1, Burst: 1}, limiter.Limit{Rate: 0.1, Burst: 1, ClientWindow: 4 * time.Second}, false},
		{"client window 0 is one second", limiter.Limit{ClientLimit: 5}, limiter.Limit{ClientLimit: 5, ClientWindow: time.Second}, false},
		{"burst and max wait without a rate", limiter.Limit{ClientLimit: 5}, limiter.Limit{ClientLimit: 5, Burst: 9, MaxWait: time.Second}, false},
		{"client window with a client limit", limiter.Limit{ClientLimit: 5}, limiter.Limit{ClientLimit: 5, ClientWindow: 2 * time.Second}, true},
		{"max wait with a rate", limiter.Limit{Rate: 1}, limiter.Limit{Rate: 1, MaxWait: time.Second}, true},
		{"dry run", limiter.Limit{Rate: 1}, limiter.Limit{Rate: 1, DryRun: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := limiter.NewSet(map[string]limiter.Limit{"file_result": tc.old}, newClock())
			if err != nil {
				t.Fatal(err)
			}
			next, changed, err := s.Update(map[string]limiter.Limit{"file_result": tc.new})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(changed) == 1; got != tc.changed {
				t.Errorf("Update(%+v -> %+v) changed = %v, want changed %v", tc.old, tc.new, changed, tc.changed)
			}
			if kept := next.Limiter("file_result") == s.Limiter("file_result"); kept == tc.changed {
				t.Errorf("Update(%+v -> %+v): bucket kept %v, want %v", tc.old, tc.new, kept, !tc.changed)
			}
			// What the limit gauges show (rate, burst, max wait) is the limit as it
			// acts, the same for the kept bucket as for one built from the new settings.
			fresh, err := limiter.NewBucket(tc.new, newClock())
			if err != nil {
				t.Fatal(err)
			}
			got, want := next.Limit("file_result"), fresh.Limit()
			if !tc.changed && (got.Rate != want.Rate || got.Burst != want.Burst || got.MaxWait != want.MaxWait) {
				t.Errorf("Update(%+v -> %+v): Limit = %+v, want %+v (as a bucket of the new limit reports)", tc.old, tc.new, got, want)
			}
		})
	}
}

// TestWithMaxWait: a request decided under WithMaxWait waits for its token only within
// the shorter of that bound and MaxWait: one whose token is further away is rejected at
// once, with the time until its token, and takes nothing (the next request waits as
// long as it would have); one within the bound waits as under MaxWait alone; a free
// token is taken at once even under a bound of 0.
func TestWithMaxWait(t *testing.T) {
	clock := newClock()
	b := mustBucket(t, limiter.Limit{Rate: 10, Burst: 1, MaxWait: time.Second}, clock)
	ctx := context.Background()
	if d := acquireAtOnce(t, clock, 0, b, limiter.WithMaxWait(ctx, 0), "c"); d.Outcome != limiter.Allowed {
		t.Fatalf("first Acquire(), bound 0, token free = %+v, want allowed", d)
	}
	for _, bound := range []time.Duration{0, -time.Second, 50 * time.Millisecond, 99 * time.Millisecond} {
		d := acquireAtOnce(t, clock, 0, b, limiter.WithMaxWait(ctx, bound), "c")
		if d.Outcome != limiter.Rejected || d.Waited != 0 || !near(d.RetryAfter, 100*time.Millisecond, time.Microsecond) {
			t.Errorf("Acquire(), bound %v, token in 100ms = %+v, want rejected at once, RetryAfter 100ms", bound, d)
		}
	}
	// Nothing was taken: the next request's token is still 100 ms away, and a bound
	// longer than MaxWait leaves MaxWait in force.
	ch := startAcquire(t, clock, 1, b, limiter.WithMaxWait(ctx, 100*time.Millisecond), "c")
	clock.Advance(100 * time.Millisecond)
	if d := result(t, ch); d.Outcome != limiter.Delayed || !near(d.Waited, 100*time.Millisecond, time.Microsecond) {
		t.Errorf("Acquire(), bound 100ms, token in 100ms = %+v, want delayed 100ms", d)
	}
	// A bound beyond MaxWait leaves MaxWait in force: a token 1.1 s away (ten requests
	// queued) is refused under a bound of an hour.
	var queued []<-chan limiter.Decision
	for i := range 10 {
		queued = append(queued, startAcquire(t, clock, i+1, b, ctx, "c"))
	}
	if d := acquireAtOnce(t, clock, 10, b, limiter.WithMaxWait(ctx, time.Hour), "c"); d.Outcome != limiter.Rejected {
		t.Errorf("Acquire(), bound 1h, MaxWait 1s, token in 1.1s = %+v, want rejected", d)
	}
	clock.Advance(time.Second)
	for _, ch := range queued {
		if d := result(t, ch); d.Outcome != limiter.Delayed {
			t.Errorf("a queued request = %+v, want delayed", d)
		}
	}
}
