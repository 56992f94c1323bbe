package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunScenarios plays each kind of case end to end over loopback HTTP: every
// submission gets its result, fetches are counted, the figures are consistent.
func TestRunScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs six emulated cases")
	}
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	// The limited cases at 1 a second (50 a real second at x50), so that each round
	// of up to 30 fetches outruns the limit even when a loaded machine spreads it
	// out: at Proxy-2 a loaded run refused none.
	for _, name := range []string{"No-limit", "Rate-1", "Proxy-1", "Webhook", "Bridge", "Adaptive"} {
		t.Run(name, func(t *testing.T) {
			sc, err := ParseScenario(name)
			if err != nil {
				t.Fatal(err)
			}
			f, err := RunScenario(context.Background(), testEnv(), sc, testWorkload(30), files)
			if err != nil {
				t.Fatalf("RunScenario(%s) = %v", name, err)
			}
			if f.Submissions != 30 {
				t.Errorf("%s: %d submissions answered, want 30", name, f.Submissions)
			}
			if f.DurationMin <= 0 || f.ProcessedFilesPerHour <= 0 || f.AllResultsMin < f.DurationMin*0.9 {
				t.Errorf("%s: duration %.2f min, %.0f files/h, all results after %.2f min: want positive, results after the scans", name, f.DurationMin, f.ProcessedFilesPerHour, f.AllResultsMin)
			}
			if f.ResultLatencyP50S <= 0 || f.ResultLatencyP95S < f.ResultLatencyP50S {
				t.Errorf("%s: latency p50 %.1f s, p95 %.1f s, want 0 < p50 <= p95", name, f.ResultLatencyP50S, f.ResultLatencyP95S)
			}
			if f.CoreFetchesPerFile == nil {
				t.Fatalf("%s: no core_fetches_per_file, want the emulator's count", name)
			}
			if q := f.PeakQueueShare; q == nil || *q < 0 || *q > 1 || f.QueueOverTargetMin == nil {
				t.Errorf("%s: peak queue share %s, time over the target %s: want the watch's figures, the share within [0, 1]", name, optText(q, "%.3f"), optText(f.QueueOverTargetMin, "%.2f"))
			}
			if name != "Adaptive" && f.AdaptiveRateMean != nil {
				t.Errorf("%s: an adaptive rate %.3f, want none outside the Adaptive case", name, *f.AdaptiveRateMean)
			}
			if len(f.Verdicts) != len(files) || len(f.VerdictsMixed) != 0 {
				t.Errorf("%s: verdicts of %d files (%d mixed), want one for each of the %d files", name, len(f.Verdicts), len(f.VerdictsMixed), len(files))
			}
			for file, v := range f.Verdicts {
				if v != 0 {
					t.Errorf("%s: %s's verdict %d, want 0 (No Threat Detected: the data set is clean)", name, file, v)
				}
			}
			switch name {
			case "Webhook":
				if f.FetchRequestsPerS != nil || *f.CoreFetchesPerFile != 0 {
					t.Errorf("Webhook: fetch rate %v, %v Core polls a file, want none (no fetching)", f.FetchRequestsPerS, *f.CoreFetchesPerFile)
				}
			case "Bridge":
				// The client polls every 5 s; mdproxy answers from the callbacks.
				if f.FetchRequestsPerS == nil || *f.FetchRequestsPerS <= 0 || *f.FetchErrorRatePct != 0 || *f.CoreFetchesPerFile > BridgeMaxCoreFetchesPerFile {
					t.Errorf("Bridge: fetch rate %v, error rate %v, %v Core polls a file, want accepted fetches, no error, at most %g Core polls a file",
						f.FetchRequestsPerS, f.FetchErrorRatePct, *f.CoreFetchesPerFile, BridgeMaxCoreFetchesPerFile)
				}
			case "No-limit":
				if f.FetchRequestsPerS == nil || *f.FetchRequestsPerS <= 0 || *f.FetchErrorRatePct != 0 {
					t.Errorf("No-limit: fetch rate %v, error rate %v, want accepted fetches and no error", f.FetchRequestsPerS, f.FetchErrorRatePct)
				}
				// Every fetch of the client reached Core, at least one a file.
				if *f.CoreFetchesPerFile < 1 {
					t.Errorf("No-limit: %v Core polls a file, want at least 1", *f.CoreFetchesPerFile)
				}
			case "Adaptive":
				// At its ceiling, mdproxy's default 10 a second (500 a real second here)
				// and burst 20, 30 files may be fetched without a refusal.
				if f.FetchRequestsPerS == nil || *f.FetchRequestsPerS <= 0 || f.FetchErrorRatePct == nil {
					t.Errorf("Adaptive: fetch figures %+v, want accepted fetches", f)
				}
				// The watch read mdproxy's rate in force: within its floor and ceiling.
				if r := f.AdaptiveRateMean; r == nil || *r < bridgeFileResultRate/10.0*0.99 || *r > bridgeFileResultRate*1.01 {
					t.Errorf("Adaptive: mean rate in force %s a virtual second, want between 1 and %d", optText(r, "%.3f"), bridgeFileResultRate)
				}
			default:
				if f.FetchErrorRatePct == nil || *f.FetchErrorRatePct <= 0 || *f.FetchRequestsPerS <= 0 {
					t.Errorf("%s: fetch figures %+v, want fetches both accepted and refused", name, f)
				}
			}
		})
	}
}

// TestFetchRounds checks the client's polling loop against a Core that takes 20 ms
// to answer a fetch and completes each scan at its third fetch: a round fetches every
// outstanding data_id once, FetchConcurrency at a time, and the next round starts
// FetchInterval after the last answer of the previous one.
func TestFetchRounds(t *testing.T) {
	const submissions, concurrency, interval = 6, 2, 150 * time.Millisecond
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	type fetch struct{ start, end time.Time }
	var (
		mu                    sync.Mutex
		ids                   int
		fetches               = map[string][]fetch{}
		inFlight, maxInFlight int
	)
	core := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/file" {
			_, _ = io.Copy(io.Discard, r.Body)
			mu.Lock()
			ids++
			id := fmt.Sprintf("id%d", ids)
			mu.Unlock()
			fmt.Fprintf(w, `{"data_id":%q}`, id)
			return
		}
		id := strings.TrimPrefix(r.URL.Path, "/file/")
		start := time.Now()
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		n := len(fetches[id]) + 1
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		inFlight--
		fetches[id] = append(fetches[id], fetch{start, time.Now()})
		mu.Unlock()
		progress := 50
		if n >= 3 {
			progress = 100
		}
		fmt.Fprintf(w, `{"data_id":%q,"process_info":{"progress_percentage":%d}}`, id, progress)
	}))
	defer core.Close()

	w := Workload{Submissions: submissions, TurnSize: submissions, TurnInterval: time.Second,
		FetchInterval: interval, FetchConcurrency: concurrency, Speedup: 1, Deadline: time.Minute}
	out, err := w.Run(context.Background(), core.URL, files)
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	if out.FetchOK != 3*submissions || out.FetchErrors != 0 || len(out.Submissions) != submissions {
		t.Errorf("accepted fetches %d, errors %d, submissions %d, want %d, 0, %d", out.FetchOK, out.FetchErrors, len(out.Submissions), 3*submissions, submissions)
	}
	mu.Lock()
	defer mu.Unlock()
	if maxInFlight > concurrency {
		t.Errorf("fetches in flight at once: %d, want at most FetchConcurrency %d", maxInFlight, concurrency)
	}
	// Round k is every id's k-th fetch.
	for k := range 3 {
		var last time.Time
		for id, fs := range fetches {
			if len(fs) != 3 {
				t.Fatalf("%s fetched %d times, want 3 (once a round until complete)", id, len(fs))
			}
			if fs[k].end.After(last) {
				last = fs[k].end
			}
		}
		if k == 2 {
			break
		}
		var next time.Time
		for _, fs := range fetches {
			if next.IsZero() || fs[k+1].start.Before(next) {
				next = fs[k+1].start
			}
		}
		if gap := next.Sub(last); gap < interval {
			t.Errorf("round %d began %v after round %d's last answer, want at least FetchInterval %v", k+2, gap, k+1, interval)
		}
	}
}

// TestUnreachableCore checks that mdbench stops with a clear error, at once, when Core
// refuses connections or refuses the submissions.
func TestUnreachableCore(t *testing.T) {
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"err":"Access denied"}`))
	}))
	defer refusing.Close()
	for _, tc := range []struct{ name, url, want string }{
		{"connection refused", closed, "connection refused"},
		{"403", refusing.URL, "Access denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := RunScenario(context.Background(), Env{CoreURL: tc.url}, Scenario{Name: "No-limit"}, testWorkload(20), files)
			if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RunScenario against %s = %v, want ErrUnreachable mentioning %q", tc.name, err, tc.want)
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("RunScenario against %s took %v, want a prompt error", tc.name, d)
			}
		})
	}
}

func TestParseScenario(t *testing.T) {
	for _, tc := range []struct {
		name string
		want Scenario
		bad  bool
	}{
		{"No-limit", Scenario{Name: "No-limit"}, false},
		{"Webhook", Scenario{Name: "Webhook", Webhook: true}, false},
		{"Bridge", Scenario{Name: "Bridge", Bridge: true}, false},
		{"Adaptive", Scenario{Name: "Adaptive", Adaptive: true}, false},
		{"Rate-10", Scenario{Name: "Rate-10", CoreLimit: 10}, false},
		{"Proxy-0.5", Scenario{Name: "Proxy-0.5", ProxyLimit: 0.5}, false},
		{"Proxy-10x2", Scenario{Name: "Proxy-10x2", ProxyLimit: 10, Replicas: 2}, false},
		{"Proxy-2.5x3", Scenario{Name: "Proxy-2.5x3", ProxyLimit: 2.5, Replicas: 3}, false},
		{"Proxy-10x1", Scenario{Name: "Proxy-10x1", ProxyLimit: 10, Replicas: 1}, false},
		{"Rate-0", Scenario{}, true},
		{"Rate-x", Scenario{}, true},
		{"Rate-10x2", Scenario{}, true},
		{"Proxy-10x0", Scenario{}, true},
		{"Proxy-10x", Scenario{}, true},
		{"Proxy-10x1.5", Scenario{}, true},
		{"Proxy-x2", Scenario{}, true},
		{"Proxy-0x2", Scenario{}, true},
		{"Proxy-Inf", Scenario{}, true},
		{"Turbo", Scenario{}, true},
	} {
		got, err := ParseScenario(tc.name)
		if tc.bad != (err != nil) || (!tc.bad && got != tc.want) {
			t.Errorf("ParseScenario(%q) = %+v, %v, want %+v (error %t)", tc.name, got, err, tc.want, tc.bad)
		}
	}
	for _, n := range AllScenarios {
		if _, err := ParseScenario(n); err != nil {
			t.Errorf("ParseScenario(%q) = %v, want every listed case to parse", n, err)
		}
	}
}

// TestProxySettings checks what a Proxy-N case asks of mdproxy: file_result limited
// as the emulator limits Core itself (N a virtual second, burst FETCH_BURST, a wait of
// FETCH_WAIT virtual), on loopback, in front of the case's emulator; and that the
// case stops mdproxy, reporting how it ended, and fails without a way to start it.
func TestProxySettings(t *testing.T) {
	env := testEnv() // speed-up 50
	var got map[string]string
	stopErr := errors.New("cut at the shutdown timeout")
	env.StartProxy = func(_ context.Context, environ map[string]string) (string, func() error, error) {
		got = environ
		return "http://192.0.2.1:1", func() error { return stopErr }, nil
	}
	st, err := env.start(context.Background(), Scenario{Name: "Proxy-10", ProxyLimit: 10})
	if err != nil {
		t.Fatalf("start(Proxy-10) = %v", err)
	}
	if !slices.Equal(st.targets, []string{"http://192.0.2.1:1"}) {
		t.Errorf("Proxy-10 targets = %q, want mdproxy's URL", st.targets)
	}
	if err := st.stop(); !errors.Is(err, stopErr) {
		t.Errorf("stopping Proxy-10 = %v, want mdproxy's error %v", err, stopErr)
	}
	up, ok := got["MDPROXY_UPSTREAM_URL"]
	if !ok || !strings.HasPrefix(up, "http://127.0.0.1:") {
		t.Errorf("MDPROXY_UPSTREAM_URL = %q, want the emulator on loopback", up)
	}
	for name, want := range map[string]string{
		"MDPROXY_LISTEN_ADDR":          "127.0.0.1:0",
		"MDPROXY_ADMIN_ADDR":           "127.0.0.1:0",
		"MDPROXY_FILE_RESULT_RATE":     "500",  // 10 × 50
		"MDPROXY_FILE_RESULT_BURST":    "5",    // CORESIM_FETCH_BURST
		"MDPROXY_FILE_RESULT_MAX_WAIT": "40ms", // 2 s / 50
		"MDPROXY_SHUTDOWN_DELAY":       "0s",
		"MDPROXY_BRIDGE":               "false", // the limit alone
	} {
		if got[name] != want {
			t.Errorf("Proxy-10 at ×50: %s = %q, want %q", name, got[name], want)
		}
	}

	// Bridge: the bridge on, mdproxy's default limit and refresh scaled by the
	// speed-up, the callback listener on a free loopback port, the callback URL
	// derived from it unless Env.BridgeCallbackURL.
	for _, cbURL := range []string{"", "http://192.0.2.2:9"} {
		env.BridgeCallbackURL = cbURL
		st, err = env.start(context.Background(), Scenario{Name: "Bridge", Bridge: true})
		if err != nil {
			t.Fatalf("start(Bridge) = %v", err)
		}
		_ = st.stop()
		want := map[string]string{
			"MDPROXY_LISTEN_ADDR":        "127.0.0.1:0",
			"MDPROXY_ADMIN_ADDR":         "127.0.0.1:0",
			"MDPROXY_BRIDGE":             "true",
			"MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0",
			"MDPROXY_BRIDGE_REFRESH":     "1.2s", // 60 s / 50
			"MDPROXY_FILE_RESULT_RATE":   "500",  // 10 × 50
			"MDPROXY_FILE_RESULT_BURST":  "20",
			"MDPROXY_SHUTDOWN_DELAY":     "0s",
		}
		if cbURL != "" {
			want["MDPROXY_BRIDGE_CALLBACK_URL"] = cbURL
		}
		if !strings.HasPrefix(got["MDPROXY_UPSTREAM_URL"], "http://127.0.0.1:") {
			t.Errorf("Bridge: MDPROXY_UPSTREAM_URL = %q, want the emulator on loopback", got["MDPROXY_UPSTREAM_URL"])
		}
		delete(got, "MDPROXY_UPSTREAM_URL")
		if !maps.Equal(got, want) {
			t.Errorf("Bridge at ×50 (Env.BridgeCallbackURL %q): settings %v, want %v", cbURL, got, want)
		}
	}
	env.BridgeCallbackURL = ""

	env.StartProxy = nil
	if _, err := env.start(context.Background(), Scenario{Name: "Proxy-10", ProxyLimit: 10}); err == nil || !strings.Contains(err.Error(), "StartProxy") {
		t.Errorf("start(Proxy-10) without StartProxy = %v, want an error naming StartProxy", err)
	}
}

// TestSummarize checks the arithmetic of the figures on a made-up outcome.
func TestSummarize(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &Outcome{
		Start: t0, End: t0.Add(30 * time.Second), Speedup: 10,
		FirstFetch: t0.Add(time.Second), LastFetch: t0.Add(11 * time.Second),
		FetchOK: 50, FetchErrors: 150, CorePolls: 6,
	}
	for i := range 4 {
		o.Submissions = append(o.Submissions, &Submission{
			Sent: t0, Received: t0.Add(time.Duration(i+1) * 10 * time.Second), Objects: 10,
			Uploaded: t0.Add(time.Duration(i) * time.Minute), Completed: t0.Add(time.Duration(i+1) * 30 * time.Minute),
			File: []string{"a.docx", "b.docx", "a.docx", "c.docx"}[i], Verdict: []int{0, 1, 0, 3}[i],
		})
	}
	f := Summarize("Rate-1", o, true)
	check := func(name string, got, want float64) {
		t.Helper()
		if d := got - want; d < -1e-9 || d > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("DurationMin", f.DurationMin, 120)                    // first upload to last completion
	check("ProcessedFilesPerHour", f.ProcessedFilesPerHour, 20) // 40 objects in 2 h
	check("FetchRequestsPerS", *f.FetchRequestsPerS, 0.5)       // 50 in 10 s × 10
	check("OfferedFetchPerS", *f.OfferedFetchPerS, 2)
	check("FetchErrorRatePct", *f.FetchErrorRatePct, 75)
	check("AllResultsMin", f.AllResultsMin, 5)           // 30 s × 10
	check("ResultLatencyP50S", f.ResultLatencyP50S, 200) // 20 s × 10
	check("ResultLatencyP95S", f.ResultLatencyP95S, 400)
	check("CoreFetchesPerFile", *f.CoreFetchesPerFile, 1.5) // 6 polls, 4 submissions
	if want := map[string]int{"a.docx": 0, "b.docx": 1, "c.docx": 3}; !maps.Equal(f.Verdicts, want) || f.VerdictsMixed != nil {
		t.Errorf("Verdicts = %v, mixed %v, want %v, none mixed", f.Verdicts, f.VerdictsMixed, want)
	}
	o.Submissions[2].Verdict = 1 // a.docx's second submission: another verdict
	if f := Summarize("Rate-1", o, true); len(f.Verdicts) != 2 || !slices.Equal(f.VerdictsMixed["a.docx"], []int{0, 1}) {
		t.Errorf("Verdicts = %v, mixed %v, want a.docx mixed (0 and 1)", f.Verdicts, f.VerdictsMixed)
	}
	o.CorePolls = -1
	if f := Summarize("Proxy-1", o, true); f.CoreFetchesPerFile != nil {
		t.Errorf("Summarize with CorePolls -1: core_fetches_per_file %v, want nil (not counted)", *f.CoreFetchesPerFile)
	}
	o.CorePolls = 0
	if w := Summarize("Webhook", o, false); w.FetchRequestsPerS != nil || w.FetchErrorRatePct != nil || w.CoreFetchesPerFile == nil || *w.CoreFetchesPerFile != 0 {
		t.Errorf("Summarize(Webhook) has fetch figures or no core_fetches_per_file 0, want none and 0")
	}
}

// TestCompareVerdicts checks the comparison of two cases' verdicts file by file, and
// the summary lines of a run.
func TestCompareVerdicts(t *testing.T) {
	nl := Figures{Case: "No-limit", Verdicts: map[string]int{"a": 0, "b": 1, "c": 0}}
	same := Figures{Case: "Bridge", Verdicts: map[string]int{"a": 0, "b": 1, "c": 0}}
	if d := CompareVerdicts(nl, same); len(d) != 0 {
		t.Errorf("CompareVerdicts(identical) = %v, want none", d)
	}
	other := Figures{Case: "Proxy-1", Verdicts: map[string]int{"a": 0, "b": 0, "d": 1}, VerdictsMixed: map[string][]int{"c": {0, 255}}}
	want := []string{
		"b: 0 in Proxy-1, 1 in No-limit",
		"c: 0 and 255 in Proxy-1, 0 in No-limit",
		"d: 1 in Proxy-1, no result in No-limit",
	}
	if d := CompareVerdicts(nl, other); !slices.Equal(d, want) {
		t.Errorf("CompareVerdicts = %q, want %q", d, want)
	}
	figs := []Figures{nl, same, other}
	lines := CompareAllVerdicts(figs)
	if len(lines) != 3 || figs[1].VerdictsVsNoLimit != "identical (3 files)" || !strings.HasPrefix(figs[2].VerdictsVsNoLimit, "3 files differ: b: 0 in Proxy-1") {
		t.Errorf("CompareAllVerdicts = %q; Bridge %q, Proxy-1 %q", lines, figs[1].VerdictsVsNoLimit, figs[2].VerdictsVsNoLimit)
	}
	if lines := CompareAllVerdicts([]Figures{same}); lines != nil {
		t.Errorf("CompareAllVerdicts without No-limit = %q, want nothing", lines)
	}
}

func TestReport(t *testing.T) {
	one, zero := 1.0, 0.0
	figs := []Figures{
		{Case: "No-limit", DurationMin: 45, ProcessedFilesPerHour: 170000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10},
		{Case: "Proxy-10", DurationMin: 28.6, ProcessedFilesPerHour: 270000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10},
		{Case: "Webhook", DurationMin: 26.9, ProcessedFilesPerHour: 292389, Submissions: 10, CoreFetchesPerFile: &zero},
		{Case: "Bridge", DurationMin: 27.0, ProcessedFilesPerHour: 290000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10, CoreFetchesPerFile: &zero},
		{Case: "Adaptive", DurationMin: 28.0, ProcessedFilesPerHour: 280000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10,
			PeakQueueShare: ptr(0.95), QueueOverTargetMin: ptr(12.5), AdaptiveRateMean: ptr(4.2), AdaptiveBelowCeilingMin: ptr(11.0)},
	}
	pub := SeedTable()
	p, err := LoadPublished(filepath.Join("testdata", "published.csv"))
	if err != nil {
		t.Fatalf("LoadPublished(testdata/published.csv) = %v", err)
	}
	if !reflect.DeepEqual(p, pub) {
		t.Errorf("the built-in table differs from testdata/published.csv: %v against %v", pub, p)
	}
	var b bytes.Buffer
	WriteTable(&b, figs, pub)
	out := b.String()
	for _, want := range []string{"| case | duration_min |", "| core_fetches_per_file | peak_queue_share | queue_over_target_min | adaptive_rate_mean_per_s | adaptive_below_ceiling_min |\n",
		"| No-limit | 45.0 | 45.2 | 1.00 |", "| Proxy-10 | 28.6 | 28.6 | 1.00 |", "| Webhook | 26.9 | 26.9 | 1.00 |", "| 0.000 |  |  |  |  |\n", "| Bridge | 27.0 |  |  |",
		"| Adaptive | 28.0 |", "| 0.95 | 12.5 | 4.20 | 11.0 |\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteTable output lacks %q:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	for _, name := range []string{"c.png", "c.svg"} {
		path := filepath.Join(dir, name)
		if err := Chart(path, figs, pub); err != nil {
			t.Fatalf("Chart(%s) = %v", name, err)
		}
		b, err := os.ReadFile(path)
		if err != nil || len(b) < 1000 {
			t.Fatalf("Chart(%s) wrote %d bytes, %v", name, len(b), err)
		}
		if name == "c.png" {
			if _, err := png.Decode(bytes.NewReader(b)); err != nil {
				t.Errorf("Chart(%s) is not a PNG: %v", name, err)
			}
		} else if !bytes.Contains(b, []byte("<svg")) {
			t.Errorf("Chart(%s) is not an SVG", name)
		}
	}
	if err := Chart(filepath.Join(dir, "c.gif"), figs, pub); err == nil {
		t.Errorf("Chart(.gif) = nil error, want the format refused")
	}
	for path, ok := range map[string]bool{"c.png": true, "C.SVG": true, "c.gif": false, "c": false, "png": false, "c.png.txt": false} {
		if err := CheckChartPath(path); (err == nil) != ok {
			t.Errorf("CheckChartPath(%q) = %v, want it accepted: %v", path, err, ok)
		}
	}
}

// TestLoadPublished checks that a --seed-csv that cannot be read or is not a published
// table is an error naming the file (and what is wrong), never an empty or partial
// table, and that empty cells are no figure.
// TestBarPlot: a chart's bars are only the figures there are (Bridge has no published
// row: no bar of 0 for it), its Y axis starts at 0 with room above the tallest bar for
// the legend, 0 to 1 when every figure is 0, and its X axis keeps the outer bars and
// their names inside the plot.
func TestBarPlot(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	names := []string{"No-limit", "Webhook", "Bridge"}
	for _, tc := range []struct {
		name         string
		ours, theirs []*float64
		bars         int
		ymax         float64
	}{
		{"durations", []*float64{f(40), f(27), f(26)}, []*float64{f(45), f(26.9), nil}, 5, 54},
		{"all zero", []*float64{f(0), f(0), f(0)}, []*float64{f(0), f(0), nil}, 5, 1},
		{"no figures", []*float64{nil, nil, nil}, []*float64{nil, nil, nil}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := barPlot("title", "unit", names, tc.ours, tc.theirs)
			if err != nil {
				t.Fatal(err)
			}
			ours, _ := barsOf(tc.ours, 1, color.Black, 0)
			theirs, _ := barsOf(tc.theirs, 1, color.Black, 0)
			if bars := len(ours) + len(theirs); bars != tc.bars {
				t.Errorf("%d bars, want %d", bars, tc.bars)
			}
			for _, b := range append(ours, theirs...) {
				if i := int(b.XMin); b.XMin != float64(i) || i < 0 || i >= len(names) || (tc.ours[i] == nil && tc.theirs[i] == nil) {
					t.Errorf("a bar at %g, want one at the slot of a figure", b.XMin)
				}
			}
			if p.Y.Min != 0 || p.Y.Max != tc.ymax {
				t.Errorf("Y axis from %g to %g, want 0 to %g", p.Y.Min, p.Y.Max, tc.ymax)
			}
			if p.X.Min != -0.5 || p.X.Max != 2.5 {
				t.Errorf("X axis from %g to %g, want -0.5 to 2.5", p.X.Min, p.X.Max)
			}
			path := filepath.Join(t.TempDir(), "c.png")
			if err := writeStacked(path, 400, 300, p); err != nil {
				t.Errorf("drawing it: %v", err)
			}
		})
	}
}

func TestLoadPublished(t *testing.T) {
	dir := t.TempDir()
	const header = "case,limit_per_s,duration_min,processed_files_per_hour,fetch_requests_per_s,fetch_error_rate_pct\n"
	good := filepath.Join(dir, "good.csv")
	if err := os.WriteFile(good, []byte(header+"Rate-5,5,30,250000,4.5,97\nWebhook,,26.9,292389,,\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPublished(good)
	if err != nil {
		t.Fatalf("LoadPublished(a good table) = %v", err)
	}
	if len(p) != 2 || p["Rate-5"].LimitPerS != 5 || *p["Rate-5"].FetchErrorRatePct != 97 ||
		p["Webhook"].FetchRequestsPerS != nil || p["Webhook"].ProcessedFilesPerHour != 292389 {
		t.Errorf("LoadPublished(a good table) = %+v", p)
	}

	for _, tc := range []struct{ name, content, want string }{
		{"empty", "", "want a header"},
		{"header only", header, "want a header"},
		{"garbage", "this is not\na table at all\n", "want the columns"},
		{"binary", "\x00\x01\x02\n", "want the columns"},
		{"other header", "name,limit,duration,files,fetches,errors\nRate-1,1,27.7,283113,0.799,99.84\n", `header column 1 is "name"`},
		{"short row", header + "Rate-1,1,27.7\n", "want the columns"},
		{"not a number", header + "Rate-1,1,27.7,lots,0.799,99.84\n", "record 2, processed_files_per_hour"},
		{"NaN", header + "Rate-1,1,NaN,283113,0.799,99.84\n", "record 2, duration_min"},
		{"negative", header + "Rate-1,1,27.7,283113,0.799,-1\n", "record 2, fetch_error_rate_pct"},
		{"no case", header + "Rate-1,1,27.7,283113,0.799,99.84\n,,1,1,,\n", "record 3 has no case"},
		{"repeated case", header + "Rate-1,1,27.7,283113,0.799,99.84\nRate-1,1,27.7,283113,0.799,99.84\n", "record 3 repeats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".csv")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			p, err := LoadPublished(path)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadPublished(%s) = %v, %v; want an error naming the file and %q", tc.name, p, err, tc.want)
			}
		})
	}
	missing := filepath.Join(dir, "missing.csv")
	if _, err := LoadPublished(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("LoadPublished(a missing file) = %v, want fs.ErrNotExist naming it", err)
	}
}

func TestCheckQuick(t *testing.T) {
	verdicts := map[string]int{"a": 0, "b": 0}
	fig := func(name string, d float64, n int) Figures {
		return Figures{Case: name, DurationMin: d, Submissions: n, Verdicts: verdicts}
	}
	bridge := func(d, errPct, perFile float64, v map[string]int) Figures {
		f := fig("Bridge", d, 200)
		f.FetchErrorRatePct, f.CoreFetchesPerFile, f.Verdicts = &errPct, &perFile, v
		return f
	}
	good := bridge(3.0, 0, 0.1, verdicts) // 3.0 against Webhook's 2.9: within 5%
	if err := CheckQuick([]Figures{fig("No-limit", 4, 200), fig("Rate-1", 3, 200), fig("Webhook", 2.9, 200), good}, 200); err != nil {
		t.Errorf("CheckQuick(good run) = %v, want nil", err)
	}
	for _, tc := range []struct {
		figs []Figures
		want string
	}{
		{[]Figures{fig("No-limit", 3, 200), fig("Rate-1", 3, 200)}, "not longer than Rate-1"},
		{[]Figures{fig("Rate-1", 3.5, 200), fig("Webhook", 3, 200)}, "not within 10%"},
		{[]Figures{fig("Rate-1", 3, 199), fig("Webhook", 3, 200)}, "199 of 200"},
		{[]Figures{fig("Webhook", 2.8, 200), good}, "Bridge took 3.00 min, not within 5%"},
		{[]Figures{fig("Webhook", 2.9, 200), bridge(2.9, 0.5, 0, verdicts)}, "fetch error rate 0.500%"},
		{[]Figures{fig("Webhook", 2.9, 200), bridge(2.9, 0, 0.11, verdicts)}, "0.110 polls a submission reached Core"},
		{[]Figures{fig("No-limit", 4, 200), bridge(2.9, 0, 0, map[string]int{"a": 0, "b": 1})}, "Bridge: 1 files' verdicts differ from No-limit's: b: 1 in Bridge, 0 in No-limit"},
	} {
		if err := CheckQuick(tc.figs, 200); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckQuick(%+v) = %v, want an error saying %q", tc.figs, err, tc.want)
		}
	}
}

// TestBurstyWorkload: with BurstSize, the submissions come in bursts with BurstGap
// (virtual) between them, and a submission Core refuses with its queue full is sent
// again: 30 submissions in bursts of 10, 60 s apart, against one core and a scan queue
// of 3 keep Core working for at least the two gaps, every one answered, the queue over
// the adaptive target for a while.
func TestBurstyWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an emulated case")
	}
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	w := testWorkload(30)
	w.TurnSize, w.BurstSize, w.BurstGap, w.ExpectContinue = 5, 10, time.Minute, true
	env := testEnv()
	env.Sim.Cores, env.Sim.QueueSize = 1, 3
	f, err := RunScenario(context.Background(), env, Scenario{Name: "No-limit"}, w, files)
	if err != nil {
		t.Fatalf("RunScenario(bursty) = %v", err)
	}
	if f.Submissions != 30 || f.DurationMin < 2 {
		t.Errorf("bursty run: %d submissions over %.2f min, want 30 over at least the two 1-minute gaps", f.Submissions, f.DurationMin)
	}
	if f.PeakQueueShare == nil || *f.PeakQueueShare != 1 || *f.QueueOverTargetMin <= 0 {
		t.Errorf("bursty run against a queue of %d: peak share %s, %s min over the target; want a full queue, some time over it",
			env.Sim.QueueSize, optText(f.PeakQueueShare, "%.2f"), optText(f.QueueOverTargetMin, "%.2f"))
	}
}

// TestScaled: a workload run with fewer submissions keeps its bursts and Core's queue in
// proportion.
func TestScaled(t *testing.T) {
	w := BurstyWorkload.Scaled(200)
	if w.Submissions != 200 || w.BurstSize != BurstyWorkload.BurstSize/10 || w.CoreQueue != BurstyWorkload.CoreQueue/10 {
		t.Errorf("BurstyWorkload.Scaled(200) = %d submissions, bursts of %d, queue %d; want 200, %d, %d",
			w.Submissions, w.BurstSize, w.CoreQueue, BurstyWorkload.BurstSize/10, BurstyWorkload.CoreQueue/10)
	}
	if s := SeedWorkload.Scaled(3); s.BurstSize != 0 || s.CoreQueue != 0 {
		t.Errorf("SeedWorkload.Scaled(3) = bursts of %d, queue %d; want neither", s.BurstSize, s.CoreQueue)
	}
}

// TestCheckAdaptive: a fixed-rate case at least as good as Adaptive on both Core's
// duration and the last result fails the check; better on one only does not.
func TestCheckAdaptive(t *testing.T) {
	fig := func(name string, core, last float64) Figures {
		return Figures{Case: name, DurationMin: core, AllResultsMin: last}
	}
	adaptive := fig("Adaptive", 28, 29)
	for _, tc := range []struct {
		name string
		figs []Figures
		want string // "": holds
	}{
		{"better on one each", []Figures{fig("Rate-10", 28.5, 28.7), fig("Rate-1", 27.6, 51.6), adaptive}, ""},
		{"a tie on both", []Figures{fig("Rate-10", 28, 29), adaptive}, "Rate-10 is as good as Adaptive on both"},
		{"better on both", []Figures{fig("Rate-20", 27.9, 28.9), fig("Rate-50", 36, 36), adaptive}, "Rate-20 is as good"},
		{"mdproxy's fixed rates apart", []Figures{fig("Proxy-10", 27.9, 28.9), fig("Rate-10", 28.5, 28.7), adaptive}, ""},
		{"not fixed rates", []Figures{fig("Bridge", 27, 27), fig("Webhook", 27, 27), fig("No-limit", 27, 27), fig("Proxy-10", 28.1, 30), adaptive}, "no Adaptive case beside a fixed-rate one"},
		{"no Adaptive", []Figures{fig("Rate-10", 28, 29)}, "no Adaptive case"},
	} {
		err := CheckAdaptive(tc.figs)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: CheckAdaptive = %v, want %q", tc.name, err, tc.want)
		}
	}
	lines := AdaptiveBesideProxy([]Figures{fig("Proxy-10", 27.9, 28.9), fig("Proxy-1", 27.5, 50), fig("Rate-10", 28.5, 28.7), fig("Bridge", 27, 27), adaptive})
	want := []string{
		"Proxy-10 (mdproxy's fixed rate): Core 27.90 min against Adaptive's 28.00, last result 28.90 against 29.00: as good on both",
		"Proxy-1 (mdproxy's fixed rate): Core 27.50 min against Adaptive's 28.00, last result 50.00 against 29.00: not as good on both",
	}
	if !slices.Equal(lines, want) {
		t.Errorf("AdaptiveBesideProxy = %q, want %q", lines, want)
	}
}
