package bench

import (
	"encoding/csv"
	"fmt"
	"io"
	"maps"
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
	// CoreFetchesPerFile is the number of polls (GET /file/{data_id}) that reached
	// Core, answered or refused, from the client or from mdproxy, divided by the
	// submissions: 0 for Webhook. Counted at the emulator; with a real Core, the
	// client's own fetches when no mdproxy stands between, else nil (not counted).
	CoreFetchesPerFile *float64 `json:"core_fetches_per_file"`
	// PeakQueueShare is the emulated Core's scan queue at its longest, as a share of its
	// size (CORESIM_QUEUE_SIZE), and QueueOverTargetMin the minutes (virtual) it spent
	// above 0.8 of it, mdproxy's default MDPROXY_ADAPTIVE_TARGET; nil with a real Core.
	PeakQueueShare     *float64 `json:"peak_queue_share,omitempty"`
	QueueOverTargetMin *float64 `json:"queue_over_target_min,omitempty"`
	// AdaptiveRateMean is, in the Adaptive case, file_result's mean rate in force in
	// mdproxy, in requests per virtual second, and AdaptiveBelowCeilingMin the minutes
	// (virtual) it spent under its configured rate; nil in other cases.
	AdaptiveRateMean        *float64 `json:"adaptive_rate_mean_per_s,omitempty"`
	AdaptiveBelowCeilingMin *float64 `json:"adaptive_below_ceiling_min,omitempty"`
	// VerdictsVsNoLimit compares Verdicts with the No-limit case's of the same run
	// (CompareVerdicts): "identical (N files)" or which files differ. Empty when the
	// run has no No-limit case.
	VerdictsVsNoLimit string `json:"verdicts_vs_no_limit,omitempty"`
	// Verdicts is each file's final verdict (scan_all_result_i of its complete result,
	// -1 for a result without one), by file name, when every submission of the file
	// got the same one; VerdictsMixed lists the files whose submissions got different
	// verdicts, with those verdicts in increasing order.
	Verdicts      map[string]int   `json:"verdicts"`
	VerdictsMixed map[string][]int `json:"verdicts_mixed,omitempty"`
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
	if o.CorePolls >= 0 {
		var per float64
		if len(o.Submissions) > 0 {
			per = float64(o.CorePolls) / float64(len(o.Submissions))
		}
		f.CoreFetchesPerFile = &per
	}
	f.Verdicts, f.VerdictsMixed = verdictsByFile(o.Submissions)
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

// verdictsByFile returns each file's verdict over subs, and apart the verdicts of the
// files whose submissions got different ones (nil when none did).
func verdictsByFile(subs []*Submission) (map[string]int, map[string][]int) {
	seen := map[string][]int{}
	for _, s := range subs {
		if v := seen[s.File]; !slices.Contains(v, s.Verdict) {
			seen[s.File] = append(v, s.Verdict)
		}
	}
	one := make(map[string]int, len(seen))
	var mixed map[string][]int
	for f, v := range seen {
		if len(v) == 1 {
			one[f] = v[0]
			continue
		}
		if mixed == nil {
			mixed = map[string][]int{}
		}
		slices.Sort(v)
		mixed[f] = v
	}
	return one, mixed
}

// verdictsOf returns the verdicts f holds for file (none, one, or the mixed ones).
func (f Figures) verdictsOf(file string) []int {
	if v, ok := f.Verdicts[file]; ok {
		return []int{v}
	}
	return f.VerdictsMixed[file]
}

// CompareVerdicts compares f's verdicts with base's file by file, and returns one line
// per file that differs, in file order: a file with another verdict, a file with
// verdicts in one case only, or a file whose submissions got different verdicts in
// either. None: every verdict is identical.
func CompareVerdicts(base, f Figures) []string {
	files := map[string]bool{}
	for _, x := range []Figures{base, f} {
		for k := range x.Verdicts {
			files[k] = true
		}
		for k := range x.VerdictsMixed {
			files[k] = true
		}
	}
	var diffs []string
	for _, file := range slices.Sorted(maps.Keys(files)) {
		b, v := base.verdictsOf(file), f.verdictsOf(file)
		if len(b) == 1 && slices.Equal(b, v) {
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s: %s in %s, %s in %s", file, verdictText(v), f.Case, verdictText(b), base.Case))
	}
	return diffs
}

func verdictText(v []int) string {
	if len(v) == 0 {
		return "no result"
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, " and ")
}

// CompareAllVerdicts fills every case's VerdictsVsNoLimit with the comparison of its
// verdicts with the No-limit case's (the No-limit case's own included), and returns
// one line per case, for the run's summary. Nothing when figs has no No-limit case.
func CompareAllVerdicts(figs []Figures) []string {
	i := slices.IndexFunc(figs, func(f Figures) bool { return f.Case == "No-limit" })
	if i < 0 {
		return nil
	}
	base := figs[i]
	var out []string
	for j := range figs {
		diffs := CompareVerdicts(base, figs[j])
		switch {
		case len(diffs) == 0:
			figs[j].VerdictsVsNoLimit = fmt.Sprintf("identical (%d files)", len(base.Verdicts))
		default:
			const shown = 5
			more := ""
			if len(diffs) > shown {
				more = fmt.Sprintf("; and %d more", len(diffs)-shown)
			}
			figs[j].VerdictsVsNoLimit = fmt.Sprintf("%d files differ: %s%s", len(diffs), strings.Join(diffs[:min(shown, len(diffs))], "; "), more)
		}
		out = append(out, fmt.Sprintf("%s: verdicts %s", figs[j].Case, figs[j].VerdictsVsNoLimit))
	}
	return out
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

// PublishedColumns are the columns of a published table's CSV, in order, as its header
// names them (testdata/published.csv).
var PublishedColumns = []string{"case", "limit_per_s", "duration_min", "processed_files_per_hour", "fetch_requests_per_s", "fetch_error_rate_pct"}

// LoadPublished reads a published table from the CSV file at path: a header naming
// PublishedColumns, then one row a case. Every cell but the case may be empty (no
// figure); one that is not must be a finite number >= 0. A file that cannot be read, is
// empty, has another header or a row that breaks these rules is an error naming the
// file and, for a row, its record number (the header is record 1).
func LoadPublished(path string) (map[string]Published, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	r := csv.NewReader(fh)
	r.FieldsPerRecord = len(PublishedColumns)
	rows, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w (want the columns %s)", path, err, strings.Join(PublishedColumns, ","))
	}
	if len(rows) < 2 {
		return nil, fmt.Errorf("reading %s: want a header (%s) and a row a case", path, strings.Join(PublishedColumns, ","))
	}
	for i, name := range rows[0] {
		if !strings.EqualFold(strings.TrimSpace(name), PublishedColumns[i]) {
			return nil, fmt.Errorf("reading %s: header column %d is %q, want %q (columns %s)", path, i+1, name, PublishedColumns[i], strings.Join(PublishedColumns, ","))
		}
	}
	out := map[string]Published{}
	for i, row := range rows[1:] {
		rec := i + 2 // the header is record 1
		var nums [5]*float64
		for j, cell := range row[1:] {
			cell = strings.TrimSpace(cell)
			if cell == "" {
				continue
			}
			v, err := strconv.ParseFloat(cell, 64)
			if err != nil || math.IsInf(v, 0) || math.IsNaN(v) || v < 0 {
				return nil, fmt.Errorf("reading %s: record %d, %s = %q: want a finite number >= 0 or nothing", path, rec, PublishedColumns[j+1], cell)
			}
			nums[j] = &v
		}
		name := strings.TrimSpace(row[0])
		if name == "" {
			return nil, fmt.Errorf("reading %s: record %d has no case", path, rec)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("reading %s: record %d repeats the case %s", path, rec, name)
		}
		p := Published{Case: name, FetchRequestsPerS: nums[3], FetchErrorRatePct: nums[4]}
		for j, dst := range []*float64{&p.LimitPerS, &p.DurationMin, &p.ProcessedFilesPerHour} {
			if nums[j] != nil {
				*dst = *nums[j]
			}
		}
		out[name] = p
	}
	return out, nil
}

// publishedFor returns the published row a case is compared with: its own, or for a
// Proxy-N or Proxy-NxR case the Rate-N row.
func publishedFor(pub map[string]Published, name string) (Published, bool) {
	if p, ok := pub[name]; ok {
		return p, true
	}
	if n, ok := strings.CutPrefix(name, "Proxy-"); ok {
		n, _, _ = strings.Cut(n, "x") // Proxy-NxR: R replicas sharing N
		p, ok := pub["Rate-"+n]
		return p, ok
	}
	return Published{}, false
}

// WriteTable prints figures as a markdown table, each seed column followed by the
// published value and the ratio ours/published (for a Proxy-N or Proxy-NxR case,
// against Rate-N).
func WriteTable(w io.Writer, figs []Figures, pub map[string]Published) {
	fmt.Fprintln(w, "| case | duration_min | published | ratio | processed_files_per_hour | published | ratio | fetch_requests_per_s | published | ratio | fetch_error_rate_pct | published | diff (points) | offered_fetch_per_s | all_results_min | result_latency_p50_s | result_latency_p95_s | core_fetches_per_file | peak_queue_share | queue_over_target_min | adaptive_rate_mean_per_s | adaptive_below_ceiling_min |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
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
		fmt.Fprintf(w, "| %s | %.1f | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %.1f | %s | %s | %s | %s | %s |\n",
			f.Case, f.DurationMin, pd, ratio(f.DurationMin, p.DurationMin),
			f.ProcessedFilesPerHour, pp, ratio(f.ProcessedFilesPerHour, p.ProcessedFilesPerHour),
			opt(f.FetchRequestsPerS, "%.3f"), opt(pf, "%.3f"), fr,
			opt(f.FetchErrorRatePct, "%.2f"), opt(pe, "%.2f"), er,
			opt(f.OfferedFetchPerS, "%.1f"), f.AllResultsMin, f.ResultLatencyP50S, f.ResultLatencyP95S,
			opt(f.CoreFetchesPerFile, "%.3f"), opt(f.PeakQueueShare, "%.2f"), opt(f.QueueOverTargetMin, "%.1f"),
			opt(f.AdaptiveRateMean, "%.2f"), opt(f.AdaptiveBelowCeilingMin, "%.1f"))
	}
}

// ReplicasTolerance is how far a Proxy-NxR case's accepted fetch rate and duration may
// be from its Proxy-N case's: R replicas sharing the limit on Redis must let Core do
// what one does (issue 12).
const ReplicasTolerance = 0.10

// CompareReplicas returns a line for each Proxy-NxR case of figs whose Proxy-N case is
// there too: its accepted fetch rate and duration beside Proxy-N's, their ratios, and
// whether both are within ReplicasTolerance. Nothing when figs has no such pair.
func CompareReplicas(figs []Figures) []string {
	by := map[string]Figures{}
	for _, f := range figs {
		by[f.Case] = f
	}
	var out []string
	for _, f := range figs {
		rest, ok := strings.CutPrefix(f.Case, "Proxy-")
		n, _, ok2 := strings.Cut(rest, "x")
		if !ok || !ok2 {
			continue
		}
		one, ok := by["Proxy-"+n]
		if !ok || f.FetchRequestsPerS == nil || one.FetchRequestsPerS == nil || *one.FetchRequestsPerS == 0 || one.DurationMin == 0 {
			continue
		}
		fr, dr := *f.FetchRequestsPerS / *one.FetchRequestsPerS, f.DurationMin/one.DurationMin
		verdict := "within"
		if math.Abs(fr-1) > ReplicasTolerance || math.Abs(dr-1) > ReplicasTolerance {
			verdict = "NOT within"
		}
		out = append(out, fmt.Sprintf("%s against %s: accepted fetch rate %.3f against %.3f a second (ratio %.3f), duration %.3f against %.3f min (ratio %.3f): %s %.0f%%",
			f.Case, one.Case, *f.FetchRequestsPerS, *one.FetchRequestsPerS, fr, f.DurationMin, one.DurationMin, dr, verdict, 100*ReplicasTolerance))
	}
	return out
}
