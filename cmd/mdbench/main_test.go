package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { bintest.RemoveBuilt() }))
}

// safety bounds a run that only a broken check would let start.
const safety = 60 * time.Second

// closedURL returns the URL of a loopback port nothing listens on: a Core that refuses
// connections, which a run that got past its flags stops on at once.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "http://" + l.Addr().String()
}

// writeFile writes content to name under dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBadFlags checks that every bad flag is a usageError (exit 2) naming the flag, and
// what it is given where that is a file, before anything runs: the data set is not
// generated and no case starts. The runs are against a Core that refuses connections,
// so that a check missed fails at once with another error.
func TestBadFlags(t *testing.T) {
	dir := t.TempDir()
	core := closedURL(t)
	garbage := writeFile(t, dir, "garbage.csv", "this is not\na table at all\n")
	badNumber := writeFile(t, dir, "bad-number.csv",
		"case,limit_per_s,duration_min,processed_files_per_hour,fetch_requests_per_s,fetch_error_rate_pct\nRate-1,1,27.7,many,0.799,99.84\n")
	missing := filepath.Join(dir, "nonexistent", "x.csv")
	for _, tc := range []struct {
		name string
		args []string
		want []string // each must appear in the error
	}{
		{"missing seed-csv", []string{"--seed-csv", missing}, []string{"--seed-csv", missing}},
		{"garbage seed-csv", []string{"--seed-csv", garbage}, []string{"--seed-csv", garbage}},
		{"seed-csv with a bad number", []string{"--seed-csv", badNumber}, []string{"--seed-csv", badNumber, "processed_files_per_hour"}},
		{"empty seed-csv", []string{"--seed-csv", writeFile(t, dir, "empty.csv", "")}, []string{"--seed-csv", "empty.csv"}},
		{"speedup 0", []string{"--speedup", "0"}, []string{"--speedup 0", "above 0"}},
		{"speedup NaN", []string{"--speedup", "NaN"}, []string{"--speedup NaN", "above 0"}},
		{"speedup +Inf", []string{"--speedup", "+Inf"}, []string{"--speedup +Inf"}},
		{"speedup negative", []string{"--speedup", "-1"}, []string{"--speedup -1"}},
		{"speedup beyond the emulator's", []string{"--speedup", "2e6"}, []string{"--speedup 2e+06", "at most 1e+06"}},
		{"soak-interval overflowing 6 intervals", []string{"--soak", "1h", "--soak-interval", "500000h"}, []string{"--soak-interval 500000h"}},
		{"core-url not a URL", []string{"--core-url", "notaurl"}, []string{"--core-url", "notaurl", "http or https"}},
		{"core-url without a host", []string{"--core-url", "http://"}, []string{"--core-url"}},
		{"core-url of another scheme", []string{"--core-url", "ftp://core:8008"}, []string{"--core-url"}},
		{"bridge-callback-url not a URL", []string{"--bridge-callback-url", "core:9010"}, []string{"--bridge-callback-url"}},
		{"chart gif", []string{"--chart", filepath.Join(dir, "c.gif")}, []string{"--chart", "c.gif", ".png or .svg"}},
		{"chart without extension", []string{"--chart", filepath.Join(dir, "chart")}, []string{"--chart"}},
		{"chart in a missing directory", []string{"--chart", filepath.Join(dir, "nonexistent", "c.png")}, []string{"--chart", "nonexistent"}},
		{"json in a missing directory", []string{"--json", filepath.Join(dir, "nonexistent", "out.json")}, []string{"--json", "nonexistent", "writable directory"}},
		{"json a directory", []string{"--json", dir}, []string{"--json", "not a regular file"}},
		{"json under a file", []string{"--json", filepath.Join(garbage, "out.json")}, []string{"--json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), safety)
			defer cancel()
			dataDir := filepath.Join(t.TempDir(), "data")
			args := append([]string{"--quick", "--files", "1", "--submissions", "1", "--scenarios", "No-limit",
				"--core-url", core, "--data-dir", dataDir}, tc.args...)
			var stdout, stderr bytes.Buffer
			err := run(ctx, args, map[string]string{}, &stdout, &stderr)
			if !errors.As(err, new(usageError)) {
				t.Fatalf("mdbench %q = %v, want a usage error", tc.args, err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("mdbench %q = %q, want it to contain %q", tc.args, err, want)
				}
			}
			if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("mdbench %q made its data dir (%v), want it stopped before", tc.args, err)
			}
			if stdout.Len() > 0 {
				t.Errorf("mdbench %q printed %q, want nothing", tc.args, stdout.String())
			}
		})
	}
	// The checks left nothing behind.
	if probes, _ := filepath.Glob(filepath.Join(dir, ".mdbench-probe-*")); len(probes) > 0 {
		t.Errorf("probe files left behind: %q", probes)
	}
}

// TestGoodFlags checks that the flags' checks let good values through: a run with a
// readable --seed-csv, --json and --chart in an existing directory (one existing, which
// is not truncated), --speedup given and a --core-url ending in a slash gets past them to the case, which stops on the
// Core that refuses connections with an error that is not a usage error, and leaves no
// file behind.
func TestGoodFlags(t *testing.T) {
	dir := t.TempDir()
	seed, err := os.ReadFile(filepath.Join("..", "..", "bench", "testdata", "published.csv"))
	if err != nil {
		t.Fatal(err)
	}
	seedCSV := writeFile(t, dir, "published.csv", string(seed))
	old := writeFile(t, dir, "old.json", "previous figures")
	for _, args := range [][]string{
		{"--seed-csv", seedCSV, "--json", filepath.Join(dir, "out.json"), "--chart", filepath.Join(dir, "out.PNG"), "--speedup", "4", "--core-url", closedURL(t)},
		{"--json", old, "--chart", filepath.Join(dir, "out.svg"), "--core-url", closedURL(t) + "/"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), safety)
		defer cancel()
		dataDir := filepath.Join(t.TempDir(), "data")
		all := append([]string{"--quick", "--files", "1", "--submissions", "1", "--scenarios", "No-limit", "--data-dir", dataDir}, args...)
		var stdout, stderr bytes.Buffer
		err := run(ctx, all, map[string]string{}, &stdout, &stderr)
		if err == nil || errors.As(err, new(usageError)) {
			t.Errorf("mdbench %q against a closed port = %v, want the case's error", args, err)
		}
		if _, err := os.Stat(dataDir); err != nil {
			t.Errorf("mdbench %q did not make its data set: %v", args, err)
		}
	}
	if b, err := os.ReadFile(old); err != nil || string(b) != "previous figures" {
		t.Errorf("--json's existing file after a failed run = %q, %v; want it untouched", b, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if n := e.Name(); n != "published.csv" && n != "old.json" {
			t.Errorf("file %s left in the output directory, want none", n)
		}
	}
}

// TestBinary runs the built mdbench as an operator would: a bad flag exits 2 with the
// flag named on stderr, before anything runs.
func TestBinary(t *testing.T) {
	bin := bintest.Build(t, bintest.Module+"/cmd/mdbench")
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent", "x.csv")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--seed-csv", missing}, []string{"--seed-csv", missing}},
		{[]string{"--speedup", "NaN"}, []string{"--speedup NaN"}},
		{[]string{"--core-url", "notaurl"}, []string{"--core-url"}},
		{[]string{"--chart", filepath.Join(dir, "c.gif")}, []string{"--chart"}},
		{[]string{"--json", filepath.Join(dir, "nonexistent", "out.json")}, []string{"--json"}},
	} {
		dataDir := filepath.Join(dir, "data")
		res := bintest.Run(t, bin, nil, append([]string{"--quick", "--scenarios", "No-limit", "--data-dir", dataDir}, tc.args...)...)
		if res.Code != 2 {
			t.Errorf("mdbench %q exit code = %d, want 2; stderr:\n%s", tc.args, res.Code, res.Stderr)
		}
		for _, want := range tc.want {
			if !strings.Contains(res.Stderr, want) {
				t.Errorf("mdbench %q stderr = %q, want it to contain %q", tc.args, res.Stderr, want)
			}
		}
		if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("mdbench %q made its data dir (%v), want it stopped before", tc.args, err)
		}
	}
}

// TestFromJSON: --from-json runs no case and reports the figures of an earlier run, as
// --json wrote them: the table, the Adaptive comparison, and the chart; a file that is
// not figures is an error naming it.
func TestFromJSON(t *testing.T) {
	dir := t.TempDir()
	figs := `[{"case":"Rate-10","duration_min":28.6,"all_results_min":28.7},{"case":"Adaptive","duration_min":28.3,"all_results_min":29.7,"adaptive_rate_mean_per_s":9.5}]`
	in, chart := writeFile(t, dir, "figs.json", figs), filepath.Join(dir, "c.png")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--from-json", in, "--chart", chart}, map[string]string{}, &stdout, &stderr); err != nil {
		t.Fatalf("mdbench --from-json = %v (%s)", err, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "| Rate-10 | 28.6 |") || !strings.Contains(out, "| 9.50 |  |\n") {
		t.Errorf("--from-json table:\n%s\nwant Rate-10's row and Adaptive's rate", out)
	}
	if !strings.Contains(stderr.String(), "adaptive: no fixed-rate case of the published trade-off (Rate-N) is as good as Adaptive") {
		t.Errorf("--from-json stderr %q, want the Adaptive comparison", stderr.String())
	}
	if st, err := os.Stat(chart); err != nil || st.Size() == 0 {
		t.Errorf("--from-json --chart: %v, want the chart drawn", err)
	}
	bad := writeFile(t, dir, "bad.json", "not figures")
	if err := run(context.Background(), []string{"--from-json", bad}, map[string]string{}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("mdbench --from-json on a file of no figures = %v, want an error naming it", err)
	}
}
