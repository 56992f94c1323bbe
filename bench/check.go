package bench

import (
	"errors"
	"fmt"
	"strings"
)

// Bridge's bounds in a quick run: its duration within BridgeQuickDurationTolerance of
// Webhook's, no fetch refused, at most BridgeMaxCoreFetchesPerFile polls reaching Core
// per submission.
const (
	BridgeQuickDurationTolerance = 0.05
	BridgeMaxCoreFetchesPerFile  = 0.1
)

// CheckQuick verifies what a quick run must show, for the cases present: No-limit
// slower than Rate-1, Rate-1 within 10% of Webhook; Bridge within 5% of Webhook's
// duration, with no fetch refused (503) and at most 0.1 poll per submission reaching
// Core; every submission's result received; and every case's verdicts identical to
// No-limit's, file by file.
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
	br, okBR := by["Bridge"]
	if okNL && okR1 && !(nl.DurationMin > r1.DurationMin) {
		errs = append(errs, fmt.Errorf("No-limit took %.2f min, not longer than Rate-1's %.2f", nl.DurationMin, r1.DurationMin))
	}
	if okR1 && okWH && (r1.DurationMin > 1.1*wh.DurationMin || r1.DurationMin < 0.9*wh.DurationMin) {
		errs = append(errs, fmt.Errorf("Rate-1 took %.2f min, not within 10%% of Webhook's %.2f", r1.DurationMin, wh.DurationMin))
	}
	if okBR && okWH && (br.DurationMin > (1+BridgeQuickDurationTolerance)*wh.DurationMin || br.DurationMin < (1-BridgeQuickDurationTolerance)*wh.DurationMin) {
		errs = append(errs, fmt.Errorf("Bridge took %.2f min, not within %.0f%% of Webhook's %.2f", br.DurationMin, 100*BridgeQuickDurationTolerance, wh.DurationMin))
	}
	if okBR {
		if br.FetchErrorRatePct == nil || *br.FetchErrorRatePct != 0 {
			errs = append(errs, fmt.Errorf("Bridge: fetch error rate %s%%, want 0 (no poll answered 503)", optText(br.FetchErrorRatePct, "%.3f")))
		}
		if br.CoreFetchesPerFile == nil || *br.CoreFetchesPerFile > BridgeMaxCoreFetchesPerFile {
			errs = append(errs, fmt.Errorf("Bridge: %s polls a submission reached Core, want at most %g", optText(br.CoreFetchesPerFile, "%.3f"), BridgeMaxCoreFetchesPerFile))
		}
	}
	if okNL {
		for _, f := range figs {
			if diffs := CompareVerdicts(nl, f); len(diffs) > 0 {
				errs = append(errs, fmt.Errorf("%s: %d files' verdicts differ from No-limit's: %s", f.Case, len(diffs), strings.Join(diffs, "; ")))
			}
		}
	}
	return errors.Join(errs...)
}

// optText formats v, or "none" when nil.
func optText(v *float64, format string) string {
	if v == nil {
		return "none"
	}
	return fmt.Sprintf(format, *v)
}

// CheckAdaptive verifies issue 32's acceptance on one workload's figures: no fixed-rate
// case of the published trade-off (Rate-N, Core's own limit) is at least as good as
// Adaptive on both Core's duration (DurationMin) and the time the client holds its last
// result (AllResultsMin). It fails without an Adaptive case or a Rate-N one. mdproxy's
// own fixed rates (Proxy-N) are not on the published trade-off: AdaptiveBesideProxy
// compares them.
func CheckAdaptive(figs []Figures) error {
	adaptive, published, _ := adaptiveCases(figs)
	if adaptive == nil || len(published) == 0 {
		return errors.New("no Adaptive case beside a fixed-rate one of the published trade-off (Rate-N) to compare")
	}
	var errs []error
	for _, f := range published {
		if f.DurationMin <= adaptive.DurationMin && f.AllResultsMin <= adaptive.AllResultsMin {
			errs = append(errs, fmt.Errorf("%s is as good as Adaptive on both: Core %.2f min against %.2f, last result %.2f min against %.2f",
				f.Case, f.DurationMin, adaptive.DurationMin, f.AllResultsMin, adaptive.AllResultsMin))
		}
	}
	return errors.Join(errs...)
}

// AdaptiveBesideProxy returns a line for each Proxy-N case beside Adaptive: its Core's
// duration and last result against Adaptive's, and whether it is at least as good on
// both. Adaptive's ceiling is file_result's default rate, so beside the Proxy-N of that
// rate it can gain only while Core's queue is over its target, by refusing polls.
// Neither is part of issue 32's acceptance.
func AdaptiveBesideProxy(figs []Figures) []string {
	adaptive, _, own := adaptiveCases(figs)
	if adaptive == nil {
		return nil
	}
	var lines []string
	for _, f := range own {
		verdict := "not as good on both"
		if f.DurationMin <= adaptive.DurationMin && f.AllResultsMin <= adaptive.AllResultsMin {
			verdict = "as good on both"
		}
		lines = append(lines, fmt.Sprintf("%s (mdproxy's fixed rate): Core %.2f min against Adaptive's %.2f, last result %.2f against %.2f: %s",
			f.Case, f.DurationMin, adaptive.DurationMin, f.AllResultsMin, adaptive.AllResultsMin, verdict))
	}
	return lines
}

// adaptiveCases returns figs' Adaptive case (nil: none), its Rate-N cases and its
// Proxy-N ones (replicas included, bridged ones not).
func adaptiveCases(figs []Figures) (adaptive *Figures, published, own []Figures) {
	for i, f := range figs {
		sc, err := ParseScenario(f.Case)
		switch {
		case err != nil || sc.Bridge:
		case sc.Adaptive:
			adaptive = &figs[i]
		case sc.CoreLimit > 0:
			published = append(published, f)
		case sc.ProxyLimit > 0:
			own = append(own, f)
		}
	}
	return adaptive, published, own
}
