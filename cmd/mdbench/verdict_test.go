package main

import (
	"strings"
	"testing"

	"github.com/mdproxy/mdproxy/bench"
)

// TestVerdict: the demo's last line says whether the published order and calibration
// hold, an error (exit 1) when they do not, naming a loaded machine when the load
// before the run was high.
func TestVerdict(t *testing.T) {
	zero := 0.0
	good := []bench.Figures{
		{Case: "No-limit", DurationMin: 45, Submissions: 200},
		{Case: "Rate-1", DurationMin: 27.7, Submissions: 200},
		{Case: "Webhook", DurationMin: 26.9, Submissions: 200},
		{Case: "Bridge", DurationMin: 27, Submissions: 200, FetchErrorRatePct: &zero, CoreFetchesPerFile: &zero},
	}
	line, err := verdict(good, 200, 0.1, 2)
	if err != nil || !strings.HasPrefix(line, "verdict: the published order and calibration hold") {
		t.Errorf("verdict(good) = %q, %v; want it to hold", line, err)
	}
	// Webhook slowest, as in a loaded run: Rate-1 not within 10% of it.
	bad := append([]bench.Figures(nil), good...)
	bad[2].DurationMin = 60
	for _, tc := range []struct {
		load  float64
		cause string
	}{
		{3.5, "load average 3.50 on 2 CPUs): a loaded machine is the likely cause"},
		{0.2, "the machine was idle at the start"},
		{-1, "a loaded machine may be the cause"},
	} {
		line, err := verdict(bad, 200, tc.load, 2)
		if err == nil || line != "" {
			t.Fatalf("verdict(Webhook slowest, load %v) = %q, nil; want an error", tc.load, line)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "verdict: the published order and calibration do NOT hold: ") ||
			!strings.Contains(msg, "Rate-1 took 27.70 min, not within 10% of Webhook's 60.00") || !strings.Contains(msg, tc.cause) || strings.Contains(msg, "\n") {
			t.Errorf("verdict(Webhook slowest, load %v) = %q, want the failed check and %q on one line", tc.load, msg, tc.cause)
		}
	}
	if line, err := verdict([]bench.Figures{{Case: "Proxy-10", Submissions: 200}}, 200, 0, 2); err != nil || !strings.Contains(line, "no published order to judge") {
		t.Errorf("verdict(Proxy-10 only) = %q, %v; want nothing to judge", line, err)
	}
}
