package adaptive

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// replica is one mdproxy's adaptive limit on the fleet's Redis, with its own Core view
// (a fakeCore: a follower that read it would run out of readings and panic), limits and
// metrics.
type replica struct {
	c      *Controller
	core   *fakeCore
	limits *fakeLimits
	rec    *fakeRecorder
}

// newReplica returns replica id of a fleet on srv stepping every interval, with a Redis
// client of its own that does not retry, as mdproxy's (sidecar's newRedisClient).
func newReplica(srv *redistest.Server, t *testing.T, id string, interval time.Duration) replica {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1, DisableIdentity: true})
	t.Cleanup(func() { _ = rdb.Close() })
	r := replica{core: &fakeCore{}, limits: &fakeLimits{routes: []Route{{Name: "file_result", Floor: 1, Ceiling: 10}}}, rec: &fakeRecorder{}}
	r.c = &Controller{Core: r.core, Limits: r.limits, Recorder: r.rec, Target: 0.8,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Fleet: NewFleet(rdb, "t:", id, interval, 10*time.Second)}
	return r
}

// step runs one step of r after giving its Core the readings (none: r must not read it).
func (r replica) step(readings ...reading) {
	r.core.steps = append(r.core.steps, readings...)
	r.c.Step(context.Background())
}

// lastLeading is whether r recorded itself leading at its last step.
func (r replica) lastLeading() bool { return r.rec.leading[len(r.rec.leading)-1] }

var over, under = reading{occupancy: 0.95}, reading{occupancy: 0.1}

// TestFleetOneRate: replicas on one Redis hold one rate: the leader reads Core and
// publishes, the follower puts the rate in force without reading Core; the 503s Core
// gave the follower lower the leader's rate; the lease moves when its holder resigns;
// with Redis down neither reads Core nor counts as leading, and each holds its rates,
// then returns them to the configured ones.
func TestFleetOneRate(t *testing.T) {
	srv := redistest.Start(t)
	a, b := newReplica(srv, t, "a", time.Minute), newReplica(srv, t, "b", time.Minute)

	a.step(over) // leads: 10 -> 5
	b.step()     // follows
	if !slices.Equal(a.limits.applied, []float64{5}) || !slices.Equal(b.limits.applied, []float64{5}) {
		t.Fatalf("after the leader's step over the target: leader applied %v, follower %v; want [5] each", a.limits.applied, b.limits.applied)
	}
	if !slices.Equal(a.rec.leading, []bool{true}) || !slices.Equal(b.rec.leading, []bool{false}) {
		t.Errorf("leading: a %v, b %v; want a leading, b following", a.rec.leading, b.rec.leading)
	}

	b.core.refused = 2 // Core answered the follower 503 twice
	b.step()
	a.step(under) // an idle queue, but the follower's 503s: 5 -> 2.5
	b.step()
	if !slices.Equal(a.limits.applied, []float64{5, 2.5}) || !slices.Equal(b.limits.applied, []float64{5, 2.5}) {
		t.Errorf("after the follower's 503s: leader applied %v, follower %v; want [5 2.5] each", a.limits.applied, b.limits.applied)
	}
	a.step(under) // the 503s were counted once: 2.5 -> 3.5
	if !slices.Equal(a.limits.applied, []float64{5, 2.5, 3.5}) {
		t.Errorf("the leader's next step: applied %v, want [5 2.5 3.5]", a.limits.applied)
	}

	if err := a.c.Fleet.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.step(under) // b leads now, from the rate it followed, 2.5: 3.5
	a.step()      // a follows
	if !slices.Equal(b.limits.applied, []float64{5, 2.5, 3.5}) || !slices.Equal(a.limits.applied, []float64{5, 2.5, 3.5}) {
		t.Errorf("after a resigned: b applied %v, a %v; want [5 2.5 3.5] each", b.limits.applied, a.limits.applied)
	}
	if !b.lastLeading() || a.lastLeading() {
		t.Errorf("leading after a resigned: a %v, b %v; want b leading", a.rec.leading, b.rec.leading)
	}

	srv.Stop()
	for range HoldIntervals - 1 {
		a.step()
		b.step()
	}
	if a.lastLeading() || b.lastLeading() || !slices.Equal(b.limits.applied, []float64{5, 2.5, 3.5}) {
		t.Errorf("Redis down for %d steps: leading a %t, b %t, b applied %v; want neither leading, the rates held",
			HoldIntervals-1, a.lastLeading(), b.lastLeading(), b.limits.applied)
	}
	a.step()
	b.step()
	for _, r := range []replica{a, b} {
		if r.rec.failed != HoldIntervals || !slices.Equal(r.limits.applied, []float64{5, 2.5, 3.5, 10}) {
			t.Errorf("Redis down for %d steps: %d without a reading, applied %v; want %d, then back to the configured 10",
				HoldIntervals, r.rec.failed, r.limits.applied, HoldIntervals)
		}
	}
}

// TestFleetLeaseExpires: a leader that stops without resigning (a crash) keeps the lease,
// and its rates stay published, for three intervals after its last step (their TTL in
// Redis); meanwhile the follower puts its rate in force and never leads; once Redis has
// dropped them, the follower leads at its next step, from the rate it followed.
func TestFleetLeaseExpires(t *testing.T) {
	srv := redistest.Start(t)
	const interval = time.Hour
	a, b := newReplica(srv, t, "a", interval), newReplica(srv, t, "b", interval)
	a.step(over) // leads: 10 -> 5, then stops
	ctx, rdb := context.Background(), srv.Client(t)
	for _, key := range []string{"t:adaptive:lease", "t:adaptive:rates"} {
		if ttl, err := rdb.PTTL(ctx, key).Result(); err != nil || ttl <= 3*interval-time.Minute || ttl > 3*interval {
			t.Errorf("PTTL %s = %v, %v; want three intervals (%v)", key, ttl, err, 3*interval)
		}
	}
	for range 3 {
		b.step()
	}
	if !slices.Equal(b.limits.applied, []float64{5}) || !slices.Equal(b.rec.leading, []bool{false, false, false}) {
		t.Errorf("follower while the lease lives: applied %v, leading %v; want [5], never leading", b.limits.applied, b.rec.leading)
	}
	// Redis drops the keys at their TTL (PX, on its own clock); here at once.
	if err := rdb.Del(ctx, "t:adaptive:lease", "t:adaptive:rates").Err(); err != nil {
		t.Fatal(err)
	}
	b.step(under) // leads: 5 -> 6
	if !b.lastLeading() || !slices.Equal(b.limits.applied, []float64{5, 6}) {
		t.Errorf("follower once the lease expired: leading %v, applied %v; want leading, [5 6]", b.rec.leading, b.limits.applied)
	}
}

// leadingSignal is a fakeRecorder that also says on a channel whether the step it is
// recording leads.
type leadingSignal struct {
	*fakeRecorder
	leading chan bool
}

func (r leadingSignal) Leading(lead bool) {
	r.fakeRecorder.Leading(lead)
	select {
	case r.leading <- lead:
	default:
	}
}

// TestFleetRunResigns: a leader whose Run ends (mdproxy stopping) gives the lease up, so
// that another replica leads at its next step rather than three intervals later.
func TestFleetRunResigns(t *testing.T) {
	srv := redistest.Start(t)
	const interval = time.Hour
	a, b := newReplica(srv, t, "a", interval), newReplica(srv, t, "b", interval)
	signal := leadingSignal{fakeRecorder: a.rec, leading: make(chan bool, 1)}
	a.c.Recorder = signal
	a.core.steps = []reading{over}
	clock := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.c.Run(ctx, clock, interval)
	}()
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // Run's ticker
		t.Fatal(err)
	}
	clock.Advance(interval)
	if lead := <-signal.leading; !lead {
		t.Fatal("a's first step in Run does not lead, with no other replica")
	}
	cancel()
	<-done
	if err := srv.Client(t).Get(context.Background(), "t:adaptive:lease").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET t:adaptive:lease after a's Run ended: %v, want no lease", err)
	}
	b.step(under)
	if !slices.Equal(b.rec.leading, []bool{true}) {
		t.Errorf("b's first step after a's Run ended: leading %v, want [true]", b.rec.leading)
	}
}
