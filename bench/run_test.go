package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunScenarios plays each kind of case end to end over loopback HTTP: every
// submission gets its result, fetches are counted, the figures are consistent.
func TestRunScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four emulated cases")
	}
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"No-limit", "Rate-1", "Proxy-2", "Webhook"} {
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
			switch name {
			case "Webhook":
				if f.FetchRequestsPerS != nil {
					t.Errorf("Webhook: fetch rate %v, want none (no fetching)", *f.FetchRequestsPerS)
				}
			case "No-limit":
				if f.FetchRequestsPerS == nil || *f.FetchRequestsPerS <= 0 || *f.FetchErrorRatePct != 0 {
					t.Errorf("No-limit: fetch rate %v, error rate %v, want accepted fetches and no error", f.FetchRequestsPerS, f.FetchErrorRatePct)
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
		{"Rate-10", Scenario{Name: "Rate-10", CoreLimit: 10}, false},
		{"Proxy-0.5", Scenario{Name: "Proxy-0.5", ProxyLimit: 0.5}, false},
		{"Rate-0", Scenario{}, true},
		{"Rate-x", Scenario{}, true},
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
	if st.target != "http://192.0.2.1:1" {
		t.Errorf("Proxy-10 target = %q, want mdproxy's URL", st.target)
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
	} {
		if got[name] != want {
			t.Errorf("Proxy-10 at ×50: %s = %q, want %q", name, got[name], want)
		}
	}

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
		FetchOK: 50, FetchErrors: 150,
	}
	for i := range 4 {
		o.Submissions = append(o.Submissions, &Submission{
			Sent: t0, Received: t0.Add(time.Duration(i+1) * 10 * time.Second), Objects: 10,
			Uploaded: t0.Add(time.Duration(i) * time.Minute), Completed: t0.Add(time.Duration(i+1) * 30 * time.Minute),
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
	if w := Summarize("Webhook", o, false); w.FetchRequestsPerS != nil || w.FetchErrorRatePct != nil {
		t.Errorf("Summarize(Webhook) has fetch figures, want none")
	}
}

func TestReport(t *testing.T) {
	one, zero := 1.0, 0.0
	figs := []Figures{
		{Case: "No-limit", DurationMin: 45, ProcessedFilesPerHour: 170000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10},
		{Case: "Proxy-10", DurationMin: 28.6, ProcessedFilesPerHour: 270000, FetchRequestsPerS: &one, FetchErrorRatePct: &zero, OfferedFetchPerS: &one, Submissions: 10},
		{Case: "Webhook", DurationMin: 26.9, ProcessedFilesPerHour: 292389, Submissions: 10},
	}
	pub := SeedTable()
	if p, err := LoadPublished(filepath.Join("testdata", "published.csv")); err == nil {
		if len(p) != len(pub) || p["Rate-1"].DurationMin != pub["Rate-1"].DurationMin || *p["Rate-50"].FetchErrorRatePct != *pub["Rate-50"].FetchErrorRatePct {
			t.Errorf("the built-in table differs from testdata/published.csv: %v against %v", pub, p)
		}
	}
	var b bytes.Buffer
	WriteTable(&b, figs, pub)
	out := b.String()
	for _, want := range []string{"| case | duration_min |", "| No-limit | 45.0 | 45.2 | 1.00 |", "| Proxy-10 | 28.6 | 28.6 | 1.00 |", "| Webhook | 26.9 | 26.9 | 1.00 |"} {
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
}

func TestCheckQuick(t *testing.T) {
	fig := func(name string, d float64, n int) Figures {
		return Figures{Case: name, DurationMin: d, Submissions: n}
	}
	if err := CheckQuick([]Figures{fig("No-limit", 4, 200), fig("Rate-1", 3, 200), fig("Webhook", 2.9, 200)}, 200); err != nil {
		t.Errorf("CheckQuick(good run) = %v, want nil", err)
	}
	for _, bad := range [][]Figures{
		{fig("No-limit", 3, 200), fig("Rate-1", 3, 200)},
		{fig("Rate-1", 3.5, 200), fig("Webhook", 3, 200)},
		{fig("Rate-1", 3, 199), fig("Webhook", 3, 200)},
	} {
		if err := CheckQuick(bad, 200); err == nil {
			t.Errorf("CheckQuick(%+v) = nil, want an error", bad)
		}
	}
}
