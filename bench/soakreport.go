package bench

import (
	"fmt"
	"image/color"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// soakKeys returns the "route code" keys of the samples' request counts, sorted.
func soakKeys(samples []SoakSample) []string {
	set := map[string]bool{}
	for _, s := range samples {
		for k := range s.Requests {
			set[k] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// soakRate is the rate of requests of key between samples a and b, per second.
func soakRate(a, b SoakSample, key string) float64 {
	if b.T <= a.T {
		return 0
	}
	return (b.Requests[key] - a.Requests[key]) / (b.T - a.T)
}

// WriteSoakTable prints r's samples as a markdown table (mdproxy's requests by route
// and code as rates over each interval), then the client's counts, mdproxy's warnings
// and the verdict with each check.
func WriteSoakTable(w io.Writer, r *SoakResult) {
	keys := soakKeys(r.Samples)
	round := time.Second // of the times: to the interval's precision
	if r.IntervalS < 1 {
		round = 10 * time.Millisecond
	}
	fmt.Fprint(w, "| t | phase | rss_MiB | heap_inuse_MiB | goroutines | open_fds |")
	for _, k := range keys {
		fmt.Fprintf(w, " %s /s |", k)
	}
	fmt.Fprint(w, "\n|---|---|---|---|---|---|")
	fmt.Fprintln(w, strings.Repeat("---|", len(keys)))
	for i, s := range r.Samples {
		fmt.Fprintf(w, "| %v | %s | %.1f | %.1f | %.0f | %.0f |", time.Duration(s.T*float64(time.Second)).Round(round),
			s.Phase, s.RSSBytes/(1<<20), s.HeapInuseBytes/(1<<20), s.Goroutines, s.OpenFDs)
		for _, k := range keys {
			if i == 0 || s.Phase != "load" {
				fmt.Fprint(w, "  |")
				continue
			}
			fmt.Fprintf(w, " %.1f |", soakRate(r.Samples[i-1], s, k))
		}
		fmt.Fprintln(w)
	}
	c := r.Client
	fmt.Fprintf(w, "\nclients: %d uploads (%d refused with 503, %d failed), %d polls answered 200, %d limited (503), %d failed; "+
		"%d polls canceled by their timeout (%d answered before it), %d unknown data_ids answered 404 (%d otherwise), %d uploads aborted midway, %d requests skipped\n",
		c.Uploads, c.UploadsRefused, c.UploadErrors, c.Polls, c.PollsLimited, c.PollErrors,
		c.CanceledPolls, c.CanceledPollsAnswered, c.UnknownPolls, c.UnknownPollsOther, c.AbortedUploads, c.Skipped)
	fmt.Fprintf(w, "mdproxy: %s; settings %s\n", r.ProxyExit, strings.Join(r.ProxyEnv, " "))
	for _, k := range slices.Sorted(maps.Keys(r.ProxyLog)) {
		fmt.Fprintf(w, "mdproxy logged %d× %s\n", r.ProxyLog[k], k)
	}
	verdict := "flat"
	if !r.Verdict.Flat {
		verdict = "NOT flat"
	}
	fmt.Fprintf(w, "\nverdict: %s (load phase after a warm-up of %v, in thirds; idle against the baseline)\n",
		verdict, time.Duration(r.WarmupS*float64(time.Second)))
	if r.Verdict.Problem != "" {
		fmt.Fprintf(w, "- %s\n", r.Verdict.Problem)
	}
	for _, ck := range r.Verdict.Checks {
		f := func(v float64) string { return fmt.Sprintf("%.0f", v) }
		if strings.HasSuffix(ck.Metric, "_bytes") {
			f = func(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }
		}
		ref, got := "first third", "last third"
		if ck.Kind == "idle" {
			ref, got = "baseline", "idle"
		}
		ok := "ok"
		if !ck.OK {
			ok = "GROWS"
		}
		fmt.Fprintf(w, "- %s %s: %s %s, %s %s, limit %s: %s\n", ck.Metric, ck.Kind, ref, f(ck.Ref), got, f(ck.Got), f(ck.Limit), ok)
	}
}

// SoakChart draws r to path (.png or .svg), over minutes since the load started: RSS
// and heap in use (MiB), goroutines and open file descriptors, and mdproxy's answers
// a second by route and code over each interval of the load. A dashed line marks the
// end of the warm-up.
func SoakChart(path string, r *SoakResult) error {
	series := func(get func(SoakSample) float64) plotter.XYs {
		xy := make(plotter.XYs, len(r.Samples))
		for i, s := range r.Samples {
			xy[i].X, xy[i].Y = s.T/60, get(s)
		}
		return xy
	}
	verdict := "flat"
	if !r.Verdict.Flat {
		verdict = "NOT flat"
	}
	tmax := 0.0
	if len(r.Samples) > 0 {
		tmax = r.Samples[len(r.Samples)-1].T / 60
	}
	panel := func(title, ylabel string, names []string, data []plotter.XYs) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "minutes since the load started"
		p.Y.Label.Text = ylabel
		p.Y.Min = 0
		ymax := 0.0
		for i, xy := range data {
			l, err := plotter.NewLine(xy)
			if err != nil {
				return nil, err
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(names[i], l)
			for _, pt := range xy {
				ymax = math.Max(ymax, pt.Y)
			}
		}
		warm, err := plotter.NewLine(plotter.XYs{{X: r.WarmupS / 60, Y: 0}, {X: r.WarmupS / 60, Y: ymax * 1.05}})
		if err != nil {
			return nil, err
		}
		warm.Color = color.Gray{Y: 128}
		warm.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(warm)
		p.Legend.Add("end of the warm-up", warm)
		p.Legend.Top = true
		p.Legend.Left = true
		p.Add(plotter.NewGrid())
		// Room above the data for the legend; one time axis for every panel.
		p.Y.Max = max(1, ymax) * (1.15 + 0.1*float64(len(names)+1))
		p.X.Min, p.X.Max = 0, tmax
		return p, nil
	}
	mem, err := panel("mdproxy's memory (soak: "+verdict+")", "MiB", []string{"resident (RSS)", "heap in use"},
		[]plotter.XYs{series(func(s SoakSample) float64 { return s.RSSBytes / (1 << 20) }),
			series(func(s SoakSample) float64 { return s.HeapInuseBytes / (1 << 20) })})
	if err != nil {
		return err
	}
	gor, err := panel("mdproxy's goroutines and open file descriptors", "count", []string{"goroutines", "open fds"},
		[]plotter.XYs{series(func(s SoakSample) float64 { return s.Goroutines }),
			series(func(s SoakSample) float64 { return s.OpenFDs })})
	if err != nil {
		return err
	}
	keys := soakKeys(r.Samples)
	rates := make([]plotter.XYs, len(keys))
	for k, key := range keys {
		for i := 1; i < len(r.Samples) && r.Samples[i].Phase == "load"; i++ {
			rates[k] = append(rates[k], plotter.XY{X: r.Samples[i].T / 60, Y: soakRate(r.Samples[i-1], r.Samples[i], key)})
		}
	}
	req, err := panel("mdproxy's answers by route and code", "per second", keys, rates)
	if err != nil {
		return err
	}
	return writeStacked(path, 8*vg.Inch, 11*vg.Inch, mem, gor, req)
}
