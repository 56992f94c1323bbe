package bench

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Figures are one scenario's results, in the published benchmark's units and virtual
// time. The JSON keys of the first four are the published table's columns
// (bench/PUBLISHED.md, testdata/published.csv).
type Figures struct {
	Case string `json:"case"`
	// DurationMin is how long Core took to process every submission: from the first
	// upload to the last completion, as Core reports them (upload_timestamp +
	// queue_time + processing_time), in minutes.
	DurationMin float64 `json:"duration_min"`
	// ProcessedFilesPerHour counts every object Core scanned (each file and each part
	// extracted from it) per hour of DurationMin.
	ProcessedFilesPerHour float64 `json:"processed_files_per_hour"`
	// FetchRequestsPerS is the rate of accepted fetches over the fetching period (first
	// to last fetch); nil in the Webhook case.
	FetchRequestsPerS *float64 `json:"fetch_requests_per_s"`
	// FetchErrorRatePct is the percentage of fetches answered 503; nil for Webhook.
	FetchErrorRatePct *float64 `json:"fetch_error_rate_pct"`
	// OfferedFetchPerS is the rate of all fetches, accepted or not.
	OfferedFetchPerS *float64 `json:"offered_fetch_per_s"`
	// AllResultsMin is the time from the first submission until the client held every
	// result, in minutes.
	AllResultsMin float64 `json:"all_results_min"`
	// ResultLatencyP50S and ResultLatencyP95S are quantiles of the time from sending a
	// file to holding its result, in seconds.
	ResultLatencyP50S float64 `json:"result_latency_p50_s"`
	ResultLatencyP95S float64 `json:"result_latency_p95_s"`
	Submissions       int     `json:"submissions"`
}

// Summarize turns a run's outcome into figures. Client-side times are scaled by the
// run's speed-up into virtual time; Core-side times are Core's own.
func Summarize(name string, o *Outcome, fetching bool) Figures {
	f := Figures{Case: name, Submissions: len(o.Submissions)}
	virt := func(d time.Duration) float64 { return d.Seconds() * o.Speedup }
	var first, last time.Time
	objects := 0
	lat := make([]float64, 0, len(o.Submissions))
	for _, s := range o.Submissions {
		objects += s.Objects
		if first.IsZero() || s.Uploaded.Before(first) {
			first = s.Uploaded
		}
		if s.Completed.After(last) {
			last = s.Completed
		}
		lat = append(lat, virt(s.Received.Sub(s.Sent)))
	}
	dur := last.Sub(first)
	f.DurationMin = dur.Minutes()
	if dur > 0 {
		f.ProcessedFilesPerHour = float64(objects) / dur.Hours()
	}
	f.AllResultsMin = virt(o.End.Sub(o.Start)) / 60
	slices.Sort(lat)
	f.ResultLatencyP50S = quantile(lat, 0.50)
	f.ResultLatencyP95S = quantile(lat, 0.95)
	if fetching {
		period := virt(o.LastFetch.Sub(o.FirstFetch))
		all := float64(o.FetchOK + o.FetchErrors)
		var ok, errPct, offered float64
		if period > 0 {
			ok, offered = float64(o.FetchOK)/period, all/period
		}
		if all > 0 {
			errPct = 100 * float64(o.FetchErrors) / all
		}
		f.FetchRequestsPerS, f.FetchErrorRatePct, f.OfferedFetchPerS = &ok, &errPct, &offered
	}
	return f
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Published is one row of the published table (bench/PUBLISHED.md).
type Published struct {
	Case                  string
	LimitPerS             float64
	DurationMin           float64
	ProcessedFilesPerHour float64
	FetchRequestsPerS     *float64
	FetchErrorRatePct     *float64
}

// LoadPublished reads the published table (benchmark.csv).
func LoadPublished(path string) (map[string]Published, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	rows, err := csv.NewReader(fh).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	out := map[string]Published{}
	num := func(s string) *float64 {
		if s == "" {
			return nil
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil
		}
		return &v
	}
	for _, r := range rows[1:] {
		if len(r) < 6 {
			continue
		}
		p := Published{Case: r[0]}
		if v := num(r[1]); v != nil {
			p.LimitPerS = *v
		}
		if v := num(r[2]); v != nil {
			p.DurationMin = *v
		}
		if v := num(r[3]); v != nil {
			p.ProcessedFilesPerHour = *v
		}
		p.FetchRequestsPerS, p.FetchErrorRatePct = num(r[4]), num(r[5])
		out[p.Case] = p
	}
	return out, nil
}

// publishedFor returns the published row a case is compared with: its own, or for a
// Proxy-N case the Rate-N row.
func publishedFor(pub map[string]Published, name string) (Published, bool) {
	if p, ok := pub[name]; ok {
		return p, true
	}
	if n, ok := strings.CutPrefix(name, "Proxy-"); ok {
		p, ok := pub["Rate-"+n]
		return p, ok
	}
	return Published{}, false
}

// WriteTable prints figures as a markdown table, each seed column followed by the
// published value and the ratio ours/published (for a Proxy-N case, against Rate-N).
func WriteTable(w io.Writer, figs []Figures, pub map[string]Published) {
	fmt.Fprintln(w, "| case | duration_min | published | ratio | processed_files_per_hour | published | ratio | fetch_requests_per_s | published | ratio | fetch_error_rate_pct | published | diff (points) | offered_fetch_per_s | all_results_min | result_latency_p50_s | result_latency_p95_s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, f := range figs {
		p, ok := publishedFor(pub, f.Case)
		cell := func(v float64, format string) string { return fmt.Sprintf(format, v) }
		ratio := func(ours, theirs float64) string {
			if !ok || theirs == 0 {
				return ""
			}
			return fmt.Sprintf("%.2f", ours/theirs)
		}
		opt := func(v *float64, format string) string {
			if v == nil {
				return ""
			}
			return fmt.Sprintf(format, *v)
		}
		var pd, pp string
		var pf, pe *float64
		if ok {
			pd, pp = cell(p.DurationMin, "%.1f"), cell(p.ProcessedFilesPerHour, "%.0f")
			pf, pe = p.FetchRequestsPerS, p.FetchErrorRatePct
		}
		fr, er := "", ""
		if f.FetchRequestsPerS != nil && pf != nil {
			fr = ratio(*f.FetchRequestsPerS, *pf)
		}
		if f.FetchErrorRatePct != nil && pe != nil {
			er = fmt.Sprintf("%+.1f", *f.FetchErrorRatePct-*pe)
		}
		fmt.Fprintf(w, "| %s | %.1f | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %.1f |\n",
			f.Case, f.DurationMin, pd, ratio(f.DurationMin, p.DurationMin),
			f.ProcessedFilesPerHour, pp, ratio(f.ProcessedFilesPerHour, p.ProcessedFilesPerHour),
			opt(f.FetchRequestsPerS, "%.3f"), opt(pf, "%.3f"), fr,
			opt(f.FetchErrorRatePct, "%.2f"), opt(pe, "%.2f"), er,
			opt(f.OfferedFetchPerS, "%.1f"), f.AllResultsMin, f.ResultLatencyP50S, f.ResultLatencyP95S)
	}
}
