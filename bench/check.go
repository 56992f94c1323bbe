package bench

import (
	"errors"
	"fmt"
)

// CheckQuick verifies what a quick run must show: No-limit slower than Rate-1, Rate-1
// within 10% of Webhook (for the cases present), and every submission's result
// received.
func CheckQuick(figs []Figures, submissions int) error {
	by := map[string]Figures{}
	var errs []error
	for _, f := range figs {
		by[f.Case] = f
		if f.Submissions != submissions {
			errs = append(errs, fmt.Errorf("%s: %d of %d submissions answered", f.Case, f.Submissions, submissions))
		}
	}
	nl, okNL := by["No-limit"]
	r1, okR1 := by["Rate-1"]
	wh, okWH := by["Webhook"]
	if okNL && okR1 && !(nl.DurationMin > r1.DurationMin) {
		errs = append(errs, fmt.Errorf("No-limit took %.2f min, not longer than Rate-1's %.2f", nl.DurationMin, r1.DurationMin))
	}
	if okR1 && okWH && (r1.DurationMin > 1.1*wh.DurationMin || r1.DurationMin < 0.9*wh.DurationMin) {
		errs = append(errs, fmt.Errorf("Rate-1 took %.2f min, not within 10%% of Webhook's %.2f", r1.DurationMin, wh.DurationMin))
	}
	return errors.Join(errs...)
}
