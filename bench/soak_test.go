package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

func TestJudgeSoak(t *testing.T) {
	for _, tc := range []struct {
		name      string
		samples   []SoakSample
		warmup    time.Duration
		flat      bool
		failed    string // the metric and kind of the one failing check
		problem   bool
		checksLen int
	}{
		{name: "flat", samples: soakSeriesOf(30, steady, 10), flat: true, checksLen: 6},
		{name: "rss grows 1 MiB a sample", samples: soakSeriesOf(30, func(i int) SoakSample {
			s := steady(i)
			s.RSSBytes += float64(i << 20)
			return s
		}, 10), failed: "rss_bytes trend", checksLen: 6},
		{name: "heap grows", samples: soakSeriesOf(30, func(i int) SoakSample {
			s := steady(i)
			s.HeapInuseBytes += float64(i << 18)
			return s
		}, 10), failed: "heap_inuse_bytes trend", checksLen: 6},
		{name: "a goroutine leaked a sample", samples: soakSeriesOf(30, func(i int) SoakSample {
			s := steady(i)
			s.Goroutines += float64(i)
			return s
		}, 10), failed: "goroutines trend", checksLen: 6},
		{name: "descriptors leak", samples: soakSeriesOf(30, func(i int) SoakSample {
			s := steady(i)
			s.OpenFDs += float64(i)
			return s
		}, 10), failed: "open_fds trend", checksLen: 6},
		{name: "goroutines stay after the load", samples: soakSeriesOf(30, steady, 25), failed: "goroutines idle", checksLen: 6},
		{name: "a ramp inside the warm-up is left out", samples: soakSeriesOf(30, func(i int) SoakSample {
			s := steady(i)
			if i < 5 {
				s.RSSBytes = float64((10 + i) << 20)
			}
			return s
		}, 10), warmup: 6 * time.Second, flat: true, checksLen: 6},
		{name: "the same ramp counted", samples: soakSeriesOf(9, func(i int) SoakSample {
			s := steady(i)
			if i < 3 {
				s.RSSBytes = float64((5 + i) << 20)
			}
			return s
		}, 10), failed: "rss_bytes trend", checksLen: 6},
		{name: "too few samples", samples: soakSeriesOf(4, steady, 10), warmup: 3 * time.Second, problem: true},
		{name: "no idle sample", samples: soakSeriesOf(30, steady, 10)[:31], problem: true, checksLen: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := JudgeSoak(tc.samples, tc.warmup)
			if v.Flat != tc.flat || (v.Problem != "") != tc.problem || len(v.Checks) != tc.checksLen {
				t.Fatalf("JudgeSoak = flat %v, problem %q, %d checks; want flat %v, a problem %v, %d checks",
					v.Flat, v.Problem, len(v.Checks), tc.flat, tc.problem, tc.checksLen)
			}
			for _, c := range v.Checks {
				if want := c.Metric+" "+c.Kind != tc.failed; c.OK != want {
					t.Errorf("check %s %s: ref %g got %g limit %g: OK = %v, want %v", c.Metric, c.Kind, c.Ref, c.Got, c.Limit, c.OK, want)
				}
			}
		})
	}
}

// TestScrapeMdproxy parses an exposition like mdproxy's: the four gauges, and
// requests summed over methods by route and code.
func TestScrapeMdproxy(t *testing.T) {
	const text = `# TYPE go_goroutines gauge
go_goroutines 42
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 4.194304e+06
# TYPE process_open_fds gauge
process_open_fds 29
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.7825792e+07
# TYPE mdproxy_requests_total counter
mdproxy_requests_total{code="200",method="GET",route="file_result"} 10
mdproxy_requests_total{code="200",method="HEAD",route="file_result"} 2
mdproxy_requests_total{code="503",method="GET",route="file_result"} 5
mdproxy_requests_total{code="200",method="POST",route="submit"} 3
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(text))
	}))
	defer srv.Close()
	s, err := scrapeMdproxy(context.Background(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if s.Goroutines != 42 || s.HeapInuseBytes != 4<<20 || s.OpenFDs != 29 || s.RSSBytes != 17<<20 {
		t.Errorf("scrapeMdproxy = goroutines %g, heap %g, fds %g, rss %g; want 42, %d, 29, %d", s.Goroutines, s.HeapInuseBytes, s.OpenFDs, s.RSSBytes, 4<<20, 17<<20)
	}
	want := map[string]float64{"file_result 200": 12, "file_result 503": 5, "submit 200": 3}
	if len(s.Requests) != len(want) {
		t.Errorf("scrapeMdproxy requests = %v, want %v", s.Requests, want)
	}
	for k, v := range want {
		if s.Requests[k] != v {
			t.Errorf("scrapeMdproxy requests[%q] = %g, want %g", k, s.Requests[k], v)
		}
	}

	missing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE go_goroutines gauge\ngo_goroutines 42\n"))
	}))
	defer missing.Close()
	if _, err := scrapeMdproxy(context.Background(), missing.Client(), missing.URL); err == nil || !strings.Contains(err.Error(), "process_resident_memory_bytes") {
		t.Errorf("scrapeMdproxy of an exposition without RSS = %v, want an error naming it", err)
	}
}

// TestSoakRefusesBadStarts: bad settings and a binary that exits at once fail the
// soak with an error, and leave nothing running (TestMain checks goroutines).
func TestSoakRefusesBadStarts(t *testing.T) {
	files := []DataFile{{Name: "x.docx", Path: "/nonexistent", Size: 1}}
	sim := coresim.DefaultConfig()
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Skip("no false command")
	}
	for _, tc := range []struct {
		name string
		cfg  SoakConfig
		want string
	}{
		{"too short", SoakConfig{Duration: 5 * time.Second, Interval: time.Second, Files: files, MdproxyBin: falseBin, Sim: sim}, "fewer than 6 intervals"},
		{"no files", SoakConfig{Duration: time.Minute, MdproxyBin: falseBin, Sim: sim}, "empty"},
		{"no binary", SoakConfig{Duration: time.Minute, Files: files, MdproxyBin: filepath.Join(t.TempDir(), "none"), Sim: sim}, "starting mdproxy"},
		{"exits at once", SoakConfig{Duration: time.Minute, Files: files, MdproxyBin: falseBin, Sim: sim}, "exited at start (exit status 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Soak(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Soak = %v, %v; want an error containing %q", res, err, tc.want)
			}
		})
	}
}

// TestSoakShort runs a soak of a few seconds against the real emulator and the real
// mdproxy binary, built from this module: samples are taken in each phase, the mix
// reaches both routes and the limit answer, mdproxy's goroutines come back to their
// baseline when idle and it shuts down cleanly; the table, JSON and chart are written.
func TestSoakShort(t *testing.T) {
	bin := bintest.Build(t, bintest.Module+"/cmd/mdproxy") // skips in -short mode
	files, err := LoadOrGenerate(t.TempDir(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	mix := DefaultSoakMix
	mix.UploadsPerS, mix.PollsPerS, mix.CanceledPollsPerS, mix.UnknownPollsPerS, mix.AbortedUploadsPerS = 4, 30, 4, 4, 2
	var progress bytes.Buffer
	res, err := Soak(context.Background(), SoakConfig{
		// No warm-up: every load sample counts towards the 3 the verdict needs.
		Duration: 3 * time.Second, Interval: 250 * time.Millisecond, Warmup: time.Nanosecond, IdleWait: 10 * time.Second,
		MdproxyBin: bin, Sim: coresim.DefaultConfig(), Mix: mix, Files: files, Progress: &progress,
		// A setting of the caller's, and a log level that the soak raises to info.
		ProxyEnv: []string{"MDPROXY_FILE_RESULT_BURST=5", "MDPROXY_LOG_LEVEL=warn"},
	})
	if err != nil {
		t.Fatalf("Soak = %v\n%s", err, progress.String())
	}
	env := strings.Join(res.ProxyEnv, " ")
	if !strings.Contains(env, "MDPROXY_FILE_RESULT_BURST=5") || strings.Contains(env, "MDPROXY_FILE_RESULT_BURST=10") || !strings.Contains(env, "MDPROXY_LOG_LEVEL=info") {
		t.Errorf("mdproxy's settings %q: want the caller's burst of 5 over the soak's 10, log level info", env)
	}
	phases := map[string]int{}
	for _, s := range res.Samples {
		phases[s.Phase]++
	}
	if res.Samples[0].Phase != "baseline" || res.Samples[len(res.Samples)-1].Phase != "idle" || phases["load"] < 3 {
		// Samples are taken every 250 ms, but a scrape that comes late (a loaded
		// machine) skips ticks: 3 is what the verdict needs.
		t.Errorf("samples by phase %v, first %q, last %q; want a baseline, at least 3 load samples, an idle one last",
			phases, res.Samples[0].Phase, res.Samples[len(res.Samples)-1].Phase)
	}
	last := res.Samples[len(res.Samples)-1]
	for _, k := range []string{"submit 200", "submit 499", "file_result 200", "file_result 503", "file_result 404"} {
		if last.Requests[k] == 0 {
			t.Errorf("mdproxy counted no request %q: %v", k, last.Requests)
		}
	}
	c := res.Client
	if c.Uploads == 0 || c.Polls == 0 || c.PollsLimited == 0 || c.CanceledPolls == 0 || c.UnknownPolls == 0 || c.AbortedUploads == 0 {
		t.Errorf("client counts %+v: want uploads, polls, limited polls, canceled polls, unknown data_ids and aborted uploads", c)
	}
	if c.UploadErrors != 0 || c.Skipped != 0 {
		t.Errorf("client counts %+v: want no failed upload, nothing skipped", c)
	}
	if len(res.Verdict.Checks) != 6 {
		t.Errorf("verdict %+v: want 6 checks", res.Verdict)
	}
	for _, ck := range res.Verdict.Checks {
		if ck.Kind == "idle" && !ck.OK {
			t.Errorf("idle check %+v: want mdproxy back to its baseline", ck)
		}
	}
	if res.ProxyExit != "exit status 0" {
		t.Errorf("mdproxy ended with %q, want exit status 0", res.ProxyExit)
	}
	if !strings.Contains(progress.String(), "mdproxy (pid ") {
		t.Errorf("progress lacks the start line:\n%s", progress.String())
	}

	var table bytes.Buffer
	WriteSoakTable(&table, res)
	t.Logf("soak of %v:\n%s", 3*time.Second, table.String())
	for _, want := range []string{"| t | phase | rss_MiB |", "file_result 503 /s", "verdict: ", "goroutines idle: baseline"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back SoakResult
	if err := json.Unmarshal(b, &back); err != nil || len(back.Samples) != len(res.Samples) {
		t.Errorf("JSON round trip: %v, %d samples, want %d", err, len(back.Samples), len(res.Samples))
	}
	chart := filepath.Join(t.TempDir(), "soak.png")
	if err := SoakChart(chart, res); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(chart)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("chart is not a PNG: %v", err)
	}
}
