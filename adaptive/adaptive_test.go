package adaptive

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestNext(t *testing.T) {
	r := Route{Name: "file_result", Floor: 1, Ceiling: 10}
	for _, tc := range []struct {
		rate, occupancy float64
		refused         bool
		want            float64
	}{
		{10, 0.5, false, 10},  // idle at the ceiling: stays
		{4, 0.5, false, 5},    // under the target: a tenth of the ceiling more
		{9.5, 0.1, false, 10}, // not over the ceiling
		{10, 0.9, false, 5},   // over the target: halved
		{1.5, 0.95, false, 1}, // not under the floor
		{10, 0.2, true, 5},    // Core answered 503: halved whatever the queue
		{10, 0.8, false, 10},  // at the target: not over it
		{6, 0.8001, false, 3}, // just over
	} {
		if got := Next(r, tc.rate, tc.occupancy, 0.8, tc.refused); got != tc.want {
			t.Errorf("Next(rate %v, occupancy %v, refused %t) = %v, want %v", tc.rate, tc.occupancy, tc.refused, got, tc.want)
		}
	}
}

// fakeCore answers the occupancies and errors of steps, in order.
type fakeCore struct {
	steps   []reading
	refused float64
}

type reading struct {
	occupancy float64
	err       error
}

func (c *fakeCore) Occupancy(context.Context) (float64, error) {
	r := c.steps[0]
	c.steps = c.steps[1:]
	return r.occupancy, r.err
}

func (c *fakeCore) Refused() float64 { return c.refused }

type fakeLimits struct {
	routes  []Route
	applied []float64
}

func (l *fakeLimits) Routes() []Route { return slices.Clone(l.routes) }

// Apply records rate and puts it in force on route.
func (l *fakeLimits) Apply(route string, rate float64) {
	l.applied = append(l.applied, rate)
	for i := range l.routes {
		if l.routes[i].Name == route {
			l.routes[i].InForce = rate
		}
	}
}

type fakeRecorder struct {
	failed     int
	directions []string
	leading    []bool
}

func (r *fakeRecorder) Leading(lead bool) { r.leading = append(r.leading, lead) }

func (r *fakeRecorder) Occupied(float64)           {}
func (r *fakeRecorder) Failed()                    { r.failed++ }
func (r *fakeRecorder) Rate(string, float64, bool) {}
func (r *fakeRecorder) Adjusted(_, d string)       { r.directions = append(r.directions, d) }

// TestControllerSteps: rates fall while Core's queue is over the target, rise back to
// the ceiling while it is not, hold while Core's statistics cannot be read and return
// to the ceiling after HoldIntervals failures in a row, never rising on a failure.
func TestControllerSteps(t *testing.T) {
	over, under, fail := reading{occupancy: 0.95}, reading{occupancy: 0.1}, reading{err: errors.New("403")}
	steps := []reading{over, over, under, fail, fail}
	for range HoldIntervals - 2 {
		steps = append(steps, fail)
	}
	steps = append(steps, under)
	core := &fakeCore{steps: steps}
	limits := &fakeLimits{routes: []Route{{Name: "file_result", Floor: 1, Ceiling: 10}}}
	rec := &fakeRecorder{}
	c := &Controller{Core: core, Limits: limits, Recorder: rec, Target: 0.8, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for range len(steps) {
		c.Step(context.Background())
	}
	want := []float64{5, 2.5, 3.5, 10} // down, down, up, then held through failures and reset
	if !slices.Equal(limits.applied, want) {
		t.Errorf("rates applied = %v, want %v", limits.applied, want)
	}
	if rec.failed != HoldIntervals {
		t.Errorf("failed readings counted = %d, want %d", rec.failed, HoldIntervals)
	}
	if got := strings.Join(rec.directions, ","); got != "down,down,up,reset" {
		t.Errorf("adjustments = %s, want down,down,up,reset", got)
	}
	if c.rates["file_result"] != 10 {
		t.Errorf("rate after the reset and an idle reading = %v, want 10", c.rates["file_result"])
	}
}

// TestControllerDryRun: a dry run records the rates it would set and applies none.
func TestControllerDryRun(t *testing.T) {
	limits := &fakeLimits{routes: []Route{{Name: "hash_lookup", Floor: 0.5, Ceiling: 10}}}
	rec := &fakeRecorder{}
	c := &Controller{Core: &fakeCore{steps: []reading{{occupancy: 1}}}, Limits: limits, Recorder: rec, Target: 0.8, DryRun: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.Step(context.Background())
	if len(limits.applied) != 0 || len(rec.directions) != 1 || c.rates["hash_lookup"] != 5 {
		t.Errorf("dry run: applied %v, adjustments %v, rate %v; want none, one, 5", limits.applied, rec.directions, c.rates["hash_lookup"])
	}
}

// TestControllerCoreRefused: Core's 503 answers since the last step lower the rates even
// with an empty queue.
func TestControllerCoreRefused(t *testing.T) {
	core := &fakeCore{steps: []reading{{occupancy: 0}, {occupancy: 0}}}
	limits := &fakeLimits{routes: []Route{{Name: "file_result", Floor: 1, Ceiling: 10}}}
	c := &Controller{Core: core, Limits: limits, Recorder: &fakeRecorder{}, Target: 0.8, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	c.Step(context.Background()) // at the ceiling, nothing to do
	core.refused = 3
	c.Step(context.Background())
	if len(limits.applied) != 1 || limits.applied[0] != 5 {
		t.Errorf("rates applied after Core's 503s = %v, want [5]", limits.applied)
	}
}

// TestControllerAfterReload: a route whose bucket was built anew at its ceiling (a
// reload that changed its limit) gets the controller's rate put in force again at the
// next step, though the rate does not move; a dry run puts none in force.
func TestControllerAfterReload(t *testing.T) {
	for _, dry := range []bool{false, true} {
		core := &fakeCore{steps: []reading{{occupancy: 1}, {occupancy: 1}, {occupancy: 1}, {occupancy: 1}}}
		limits := &fakeLimits{routes: []Route{{Name: "file_result", Floor: 4, Ceiling: 10, InForce: 10}}}
		c := &Controller{Core: core, Limits: limits, Recorder: &fakeRecorder{}, Target: 0.8, DryRun: dry,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		c.Step(context.Background()) // 10 -> 5
		c.Step(context.Background()) // 5 -> the floor, 4
		c.Step(context.Background()) // at the floor: nothing to put in force
		limits.routes[0].InForce = 10
		c.Step(context.Background()) // still 4, in force again
		want := []float64{5, 4, 4}
		if dry {
			want = nil
		}
		if !slices.Equal(limits.applied, want) {
			t.Errorf("dry run %t: rates applied = %v, want %v", dry, limits.applied, want)
		}
	}
}

// TestStatsOccupancy reads /stat/nodes answers of a stand-in Core.
func TestStatsOccupancy(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		status     int
		want       float64
		wantErr    bool
	}{
		{"details", `[{"statuses":[{"scan_queue":3,"load":50,"scan_queue_details":{"total_scan_queue":30,"available_slots":70}}]}]`, 200, 0.3, false},
		{"two nodes", `[{"statuses":[{"scan_queue_details":{"total_scan_queue":10,"available_slots":0}},{"scan_queue_details":{"total_scan_queue":0,"available_slots":30}}]}]`, 200, 0.25, false},
		{"no details: the load", `[{"statuses":[{"scan_queue":3,"load":40}]}]`, 200, 0.4, false},
		{"wrong apikey", `{"err":"Access denied"}`, 403, 0, true},
		{"not JSON", `<html>`, 200, 0, true},
		{"no node", `[]`, 200, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/stat/nodes" || r.Header.Get("apikey") != "key" {
					http.Error(w, "unexpected request", http.StatusTeapot)
					return
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			got, err := Stats{Client: srv.Client(), URL: srv.URL, APIKey: "key"}.Occupancy(context.Background())
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("Occupancy() = %v, %v; want %v, error %t", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
