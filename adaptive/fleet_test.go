package adaptive

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/redistest"
)

// replica is one mdproxy's adaptive limit on the fleet's Redis, with its own Core view
// (a fakeCore: a follower that read it would run out of readings and panic), limits and
// metrics.
type replica struct {
	c      *Controller
	core   *fakeCore
	limits *fakeLimits
	rec    *fakeRecorder
}

func newReplica(srv *redistest.Server, t *testing.T, id string, interval time.Duration) replica {
	r := replica{core: &fakeCore{}, limits: &fakeLimits{routes: []Route{{Name: "file_result", Floor: 1, Ceiling: 10}}}, rec: &fakeRecorder{}}
	r.c = &Controller{Core: r.core, Limits: r.limits, Recorder: r.rec, Target: 0.8,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Fleet: NewFleet(srv.Client(t), "t:", id, interval, 5*time.Second)}
	return r
}

// step runs one step of r after giving its Core the readings (none: r must not read it).
func (r replica) step(readings ...reading) {
	r.core.steps = append(r.core.steps, readings...)
	r.c.Step(context.Background())
}

// TestFleetOneRate: replicas on one Redis hold one rate: the leader reads Core and
// publishes, the follower puts the rate in force without reading Core; the 503s Core
// gave the follower lower the leader's rate; the lease moves when its holder resigns
// (as Run does when it ends); without Redis each holds its rates, then returns them to
// the configured ones.
func TestFleetOneRate(t *testing.T) {
	srv := redistest.Start(t)
	a, b := newReplica(srv, t, "a", time.Minute), newReplica(srv, t, "b", time.Minute)
	over, under := reading{occupancy: 0.95}, reading{occupancy: 0.1}

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

	if err := a.c.Fleet.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.step(under) // b leads now, from the rate it followed: 2.5 -> 3.5
	a.step()      // a follows
	if !slices.Equal(b.limits.applied, []float64{5, 2.5, 3.5}) || !slices.Equal(a.limits.applied, []float64{5, 2.5, 3.5}) {
		t.Errorf("after a resigned: b applied %v, a %v; want [5 2.5 3.5] each", b.limits.applied, a.limits.applied)
	}
	if !slices.Equal(b.rec.leading[len(b.rec.leading)-1:], []bool{true}) || !slices.Equal(a.rec.leading[len(a.rec.leading)-1:], []bool{false}) {
		t.Errorf("leading after a resigned: a %v, b %v; want b leading", a.rec.leading, b.rec.leading)
	}

	srv.Stop()
	for range HoldIntervals {
		a.step()
	}
	if a.rec.failed != HoldIntervals || !slices.Equal(a.limits.applied, []float64{5, 2.5, 3.5, 10}) {
		t.Errorf("Redis down for %d steps: %d without a reading, applied %v; want %d, then back to the configured 10",
			HoldIntervals, a.rec.failed, a.limits.applied, HoldIntervals)
	}
}

// TestFleetLeaseExpires: a leader that stops without resigning (a crash) loses the lease
// three intervals after its last step, on Redis's clock, and a follower takes it; until
// then the follower puts the published rate in force.
func TestFleetLeaseExpires(t *testing.T) {
	srv := redistest.Start(t)
	const interval = time.Second // the lease lives 3 s
	a, b := newReplica(srv, t, "a", interval), newReplica(srv, t, "b", interval)
	a.step(reading{occupancy: 0.95})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the follower never led, 10 s after the leader's last step: leading %v", b.rec.leading)
		}
		b.core.steps = []reading{{occupancy: 0.1}} // read only once it leads
		b.c.Step(context.Background())
		if b.rec.leading[len(b.rec.leading)-1] {
			break
		}
		time.Sleep(50 * time.Millisecond) // the lease's expiry in Redis, 3 s after a's step
	}
	if len(b.limits.applied) == 0 || b.limits.applied[0] != 5 || b.c.rates["file_result"] != 6 {
		t.Errorf("the follower applied %v and holds %v once leading; want 5 first (followed), then 6 (5 and a tenth of 10)", b.limits.applied, b.c.rates["file_result"])
	}
}
