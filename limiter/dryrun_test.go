package limiter_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestDryRunFlood floods a dry-run bucket and its twin, the same limit enforced, in
// lockstep on one clock: the dry run decides as the limit does, each rejection of the
// twin a WouldReject of the dry run, each request the twin lets through one the dry
// run lets through, so that a flood in dry run admits burst + rate × elapsed, as the
// limit would, and would reject the rest.
func TestDryRunFlood(t *testing.T) {
	const (
		span    = 10 * time.Second
		step    = 10 * time.Millisecond
		perStep = 5
	)
	for _, tt := range []struct {
		rate  float64
		burst int
	}{{0.5, 1}, {1, 10}, {20, 5}, {50, 1}} {
		t.Run(fmt.Sprintf("rate=%v/burst=%d", tt.rate, tt.burst), func(t *testing.T) {
			t.Parallel()
			clock := newClock()
			l := limiter.Limit{Rate: tt.rate, Burst: tt.burst}
			enforced := mustBucket(t, l, clock)
			l.DryRun = true
			dry := mustBucket(t, l, clock)
			var allowed, wouldReject int
			for elapsed := time.Duration(0); elapsed <= span; elapsed += step {
				for range perStep {
					r, d := acquire(enforced, "c"), acquire(dry, "c")
					switch {
					case r.Outcome == limiter.Allowed && decided(d) == limiter.Decision{Outcome: limiter.Allowed}:
						allowed++
					case r.Outcome == limiter.Rejected && decided(d) == limiter.Decision{Outcome: limiter.WouldReject}:
						wouldReject++
					default:
						t.Fatalf("at +%v: enforced %+v, dry run %+v; want allowed and allowed, or rejected and would_reject (no RetryAfter)", elapsed, r, d)
					}
					if !d.Pass() {
						t.Fatalf("at +%v: dry run %+v: Pass() = false, want true", elapsed, d)
					}
				}
				clock.Advance(step)
			}
			offered := int(span/step+1) * perStep
			want := float64(tt.burst) + tt.rate*span.Seconds()
			if math.Abs(float64(allowed)-want) > 1 || allowed+wouldReject != offered {
				t.Errorf("dry run of %d offered over %v: allowed %d, would_reject %d; want %v ± 1 allowed, the rest would_reject",
					offered, span, allowed, wouldReject, want)
			}
		})
	}
}

// TestDryRunWait checks a dry run with MaxWait beside its twin, the same limit
// enforced: a request the twin holds for its token the dry run lets through at once,
// taking the same turn (so that the requests after it see the same bucket), and one the
// twin rejects the dry run counts would_reject, taking no token.
func TestDryRunWait(t *testing.T) {
	l := limiter.Limit{Rate: 10, Burst: 2, MaxWait: 250 * time.Millisecond}
	realClock, dryClock := newClock(), newClock()
	enforced := mustBucket(t, l, realClock)
	l.DryRun = true
	dry := mustBucket(t, l, dryClock)
	if got := dry.Limit(); !got.DryRun {
		t.Errorf("Limit() of a dry-run bucket = %+v, want DryRun true", got)
	}
	ctx := context.Background()
	waiting := map[int]<-chan limiter.Decision{} // the twin's held requests, by step
	steps := []struct {
		at     time.Duration
		real   limiter.Decision // the twin's; Waited for a held request
		dryOut limiter.Outcome
	}{
		{0, limiter.Decision{Outcome: limiter.Allowed}, limiter.Allowed},
		{0, limiter.Decision{Outcome: limiter.Allowed}, limiter.Allowed}, // the burst
		{0, limiter.Decision{Outcome: limiter.Delayed, Waited: 100 * time.Millisecond}, limiter.Allowed},
		{0, limiter.Decision{Outcome: limiter.Delayed, Waited: 200 * time.Millisecond}, limiter.Allowed},
		{0, limiter.Decision{Outcome: limiter.Rejected, RetryAfter: 300 * time.Millisecond}, limiter.WouldReject},
		{0, limiter.Decision{Outcome: limiter.Rejected, RetryAfter: 300 * time.Millisecond}, limiter.WouldReject},
		// Had the would-be rejections taken tokens, this one would wait 400 ms.
		{100 * time.Millisecond, limiter.Decision{Outcome: limiter.Delayed, Waited: 200 * time.Millisecond}, limiter.Allowed},
		{100 * time.Millisecond, limiter.Decision{Outcome: limiter.Rejected, RetryAfter: 300 * time.Millisecond}, limiter.WouldReject},
		{400 * time.Millisecond, limiter.Decision{Outcome: limiter.Allowed}, limiter.Allowed},
		{400 * time.Millisecond, limiter.Decision{Outcome: limiter.Delayed, Waited: 100 * time.Millisecond}, limiter.Allowed},
	}
	held := 0 // the twin's requests waiting on realClock
	for i, s := range steps {
		if adv := s.at - realClock.Since(epoch); adv > 0 {
			realClock.Advance(adv)
			dryClock.Advance(adv)
			held = 0
			for j, ch := range waiting {
				if steps[j].at+steps[j].real.Waited > s.at {
					held++
					continue
				}
				d := result(t, ch)
				delete(waiting, j)
				if !sameDecision(d, steps[j].real) {
					t.Errorf("step %d enforced = %+v, want %+v", j+1, d, steps[j].real)
				}
			}
		}
		if s.real.Outcome == limiter.Delayed {
			waiting[i] = startAcquire(t, realClock, held+1, enforced, ctx, "c")
			held++
		} else if d := acquireAtOnce(t, realClock, held, enforced, ctx, "c"); !sameDecision(d, s.real) {
			t.Fatalf("step %d at +%v: enforced Acquire() = %+v, want %+v", i+1, s.at, d, s.real)
		}
		// The dry run never waits: no timer on its clock, a decision at once.
		d := acquireAtOnce(t, dryClock, 0, dry, ctx, "c")
		if decided(d) != (limiter.Decision{Outcome: s.dryOut}) {
			t.Fatalf("step %d at +%v: dry-run Acquire() = %+v, want %v at once, with no Waited nor RetryAfter (enforced: %+v)",
				i+1, s.at, d, s.dryOut, s.real)
		}
	}
	realClock.Advance(time.Second)
	for j, ch := range waiting {
		if d := result(t, ch); !sameDecision(d, steps[j].real) {
			t.Errorf("step %d enforced = %+v, want %+v", j+1, d, steps[j].real)
		}
	}
}

// sameDecision reports whether got is want, its durations within a microsecond (the
// bucket computes them in floating point).
func sameDecision(got, want limiter.Decision) bool {
	return got.Outcome == want.Outcome && near(got.Waited, want.Waited, time.Microsecond) &&
		near(got.RetryAfter, want.RetryAfter, time.Microsecond)
}

// TestDryRunClientShare checks the per-client share in dry run: a request over its
// client's share is would_reject, counted neither in the share nor in the route's
// bucket; a would-be rejection of the route's bucket takes no slot of the share.
func TestDryRunClientShare(t *testing.T) {
	t.Run("client over its share", func(t *testing.T) {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 4, ClientLimit: 2, ClientWindow: time.Second, DryRun: true}, clock)
		steps := []struct {
			at     time.Duration
			client string
			want   limiter.Outcome
		}{
			{0, "a", limiter.Allowed},
			{0, "a", limiter.Allowed},
			{0, "a", limiter.WouldReject}, // over a's share
			{0, "a", limiter.WouldReject},
			{0, "a", limiter.WouldReject},
			{0, "b", limiter.Allowed}, // the would-be rejections took no token:
			{0, "c", limiter.Allowed}, // the fourth token is c's
			{0, "d", limiter.WouldReject},
			// Halfway through the next window a's 2 requests (not 5) weigh 1: room for
			// one more. The route's bucket has refilled 1.5 tokens.
			{1500 * time.Millisecond, "a", limiter.Allowed},
			{1500 * time.Millisecond, "a", limiter.WouldReject},
		}
		for i, s := range steps {
			clock.Advance(s.at - clock.Since(epoch))
			if d := acquire(b, s.client); decided(d) != (limiter.Decision{Outcome: s.want}) {
				t.Fatalf("step %d at +%v: Acquire(%s) = %+v, want %v", i+1, s.at, s.client, d, s.want)
			}
		}
	})
	t.Run("route's rejection takes no client slot", func(t *testing.T) {
		clock := newClock()
		b := mustBucket(t, limiter.Limit{Rate: 1, Burst: 1, ClientLimit: 2, ClientWindow: time.Hour, DryRun: true}, clock)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(a) #1 = %v, want allowed", d.Outcome)
		}
		for i := range 5 {
			if d := acquire(b, "a"); d.Outcome != limiter.WouldReject {
				t.Fatalf("Acquire(a) #%d = %v, want would_reject (route's bucket)", i+2, d.Outcome)
			}
		}
		clock.Advance(time.Second)
		if d := acquire(b, "a"); d.Outcome != limiter.Allowed {
			t.Fatalf("Acquire(a) one second later = %v, want allowed (its second slot)", d.Outcome)
		}
		if d := acquire(b, "a"); d.Outcome != limiter.WouldReject {
			t.Fatalf("Acquire(a) then = %v, want would_reject (its share of 2 used)", d.Outcome)
		}
	})
}

// TestDryRunUpdate checks that turning a route's dry run on or off is a change of its
// Limit: Update reports the route and builds its bucket anew.
func TestDryRunUpdate(t *testing.T) {
	s, err := limiter.NewSet(map[string]limiter.Limit{"file_result": {Rate: 1}}, newClock())
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	next, changed, err := s.Update(map[string]limiter.Limit{"file_result": {Rate: 1, DryRun: true}})
	if err != nil || !slices.Equal(changed, []string{"file_result"}) {
		t.Fatalf("Update(file_result dry run) = %v, %v; want [file_result], nil", changed, err)
	}
	if next.Limiter("file_result") == s.Limiter("file_result") || !next.Limit("file_result").DryRun {
		t.Errorf("Update(file_result dry run).Limit(file_result) = %+v, want a new bucket in dry run", next.Limit("file_result"))
	}
}
