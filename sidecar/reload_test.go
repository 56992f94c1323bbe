package sidecar

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// reloadWithin bounds a test's wait for a change of the limits file to be in force:
// generous, reached only when the change goes unseen. How soon a change is in force
// (its settle time after the last write seen: issue 10's 2 s at the default settle
// time) is the TestFileSettle tests', on a fake clock, not a race against the real one.
const reloadWithin = safety

// Series of a running mdproxy the reload tests read.
const (
	fileResultRate  = `mdproxy_limit_rate_requests_per_second{route="file_result"}`
	reloadsSuccess  = `mdproxy_config_reloads_total{result="success"}`
	reloadsError    = `mdproxy_config_reloads_total{result="error"}`
	slowFileResult  = "MDPROXY_FILE_RESULT_RATE=0.001\nMDPROXY_FILE_RESULT_BURST=1\n"
	slowBatchStatus = "MDPROXY_BATCH_STATUS_RATE=0.001\nMDPROXY_BATCH_STATUS_BURST=1\n"
)

// metric returns the value of series in the instance's /metrics, 0 when absent.
func (in *instance) metric(t *testing.T, series string) float64 {
	t.Helper()
	c := sidecartest.NewClient(t)
	code, page := sidecartest.Get(t, c, in.adminURL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET admin /metrics = %d, want 200", code)
	}
	v, _ := sidecartest.ParseMetrics(t, page).Value(series)
	return v
}

// waitMetric polls series until it is want, failing t after within.
func (in *instance) waitMetric(t *testing.T, series string, want float64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := in.metric(t, series)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %v, want %v; logs:\n%s", series, got, within, want, in.logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// polls sends n polls of path to the instance and returns their statuses.
func (in *instance) polls(t *testing.T, path string, n int) []int {
	t.Helper()
	c := sidecartest.NewClient(t)
	codes := make([]int, n)
	for i := range codes {
		codes[i], _ = sidecartest.Get(t, c, in.proxyURL+path)
	}
	return codes
}

// count returns how many of codes are code.
func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// replaceFile writes content to path as editors and Kubernetes do, through a new file
// renamed over it, so that no reader sees it half-written.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestReloadFileChange edits the limits file of a serving mdproxy: within 2 s the new
// limit is in force (polls refused before pass after, the gauge follows), while a
// route whose limit the edit left alone keeps its bucket, still empty.
func TestReloadFileChange(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	path := writeLimits(t, t.TempDir(), "limits.env", slowFileResult+slowBatchStatus)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})

	if codes := in.polls(t, "/file/x", 3); count(codes, http.StatusOK) != 1 || count(codes, http.StatusServiceUnavailable) != 2 {
		t.Fatalf("3 polls at rate 0.001, burst 1 = %v, want one 200 then 503s", codes)
	}
	if codes := in.polls(t, "/file/batch/b", 2); codes[0] != http.StatusOK || codes[1] != http.StatusServiceUnavailable {
		t.Fatalf("2 batch polls at rate 0.001, burst 1 = %v, want 200 then 503", codes)
	}
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Fatalf("%s = %v at start, want 0.001, the file's", fileResultRate, got)
	}

	// Raise file_result's limit, in place, as `echo >` or a plain write does.
	if err := os.WriteFile(path, []byte("# raised\nMDPROXY_FILE_RESULT_RATE=1000\nMDPROXY_FILE_RESULT_BURST=1000\n"+slowBatchStatus), 0o644); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 1000, reloadWithin)
	if codes := in.polls(t, "/file/x", 10); count(codes, http.StatusOK) != 10 {
		t.Errorf("10 polls after the rate was raised to 1000 = %v, want all 200", codes)
	}
	if codes := in.polls(t, "/file/batch/b", 1); codes[0] != http.StatusServiceUnavailable {
		t.Errorf("batch poll after a reload that left batch_status alone = %v, want 503: its bucket is kept, empty", codes)
	}
	if got := in.metric(t, reloadsSuccess); got < 1 {
		t.Errorf("%s = %v, want at least 1", reloadsSuccess, got)
	}

	// Lower it again, through a rename, as an editor saves.
	replaceFile(t, path, slowFileResult+slowBatchStatus)
	in.waitMetric(t, fileResultRate, 0.001, reloadWithin)
	if codes := in.polls(t, "/file/x", 3); count(codes, http.StatusOK) != 1 || count(codes, http.StatusServiceUnavailable) != 2 {
		t.Errorf("3 polls after the rate was lowered to 0.001 = %v, want one 200 (a new, full bucket) then 503s", codes)
	}
	if got := in.metric(t, reloadsError); got != 0 {
		t.Errorf("%s = %v, want 0", reloadsError, got)
	}
	lines := sidecartest.CheckJSONLogs(t, in.logs.String())
	if l := findLog(lines, "limits reloaded"); l == nil || l["file"] != path {
		t.Errorf("logs have no %q line naming %s:\n%s", "limits reloaded", path, in.logs)
	}
	if l := findLog(lines, "route limit changed"); l == nil || l["route"] != "file_result" {
		t.Errorf("logs have no %q line for file_result:\n%s", "route limit changed", in.logs)
	}
}

// TestReloadInvalidKeepsLimits writes a bad limits file: nothing changes, the error is
// counted and logged naming the file and every bad variable; a good file then reloads.
func TestReloadInvalidKeepsLimits(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	path := writeLimits(t, t.TempDir(), "limits.env", slowFileResult)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})
	if codes := in.polls(t, "/file/x", 2); codes[0] != http.StatusOK || codes[1] != http.StatusServiceUnavailable {
		t.Fatalf("2 polls at rate 0.001, burst 1 = %v, want 200 then 503", codes)
	}

	failed := in.logs.Written("limits not reloaded")
	replaceFile(t, path, "MDPROXY_FILE_RESULT_RATE=1000\nMDPROXY_FILE_RESULT_BURST=-5\nMDPROXY_UPSTREAM_URL=http://elsewhere\n")
	in.waitMetric(t, reloadsError, 1, reloadWithin)
	select {
	case <-failed:
	case <-time.After(safety):
		t.Fatalf("no %q line logged:\n%s", "limits not reloaded", in.logs)
	}
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Errorf("%s after a bad file = %v, want 0.001: the previous limits stay", fileResultRate, got)
	}
	if codes := in.polls(t, "/file/x", 1); codes[0] != http.StatusServiceUnavailable {
		t.Errorf("poll after a bad file = %v, want 503: the previous, empty bucket stays", codes)
	}
	if got := in.metric(t, reloadsSuccess); got != 0 {
		t.Errorf("%s after a bad file = %v, want 0", reloadsSuccess, got)
	}
	l := findLog(sidecartest.CheckJSONLogs(t, in.logs.String()), "limits not reloaded: the previous limits stay")
	if l == nil || l["level"] != "ERROR" {
		t.Fatalf("no ERROR line %q:\n%s", "limits not reloaded: the previous limits stay", in.logs)
	}
	msg, _ := l["err"].(string)
	for _, name := range []string{"MDPROXY_FILE_RESULT_BURST", "MDPROXY_UPSTREAM_URL"} {
		if !strings.Contains(msg, path) || !sidecartest.NamesVar(msg, name) {
			t.Errorf("reload error %q, want it to name the file %s and %s", msg, path, name)
		}
	}

	replaceFile(t, path, "MDPROXY_FILE_RESULT_RATE=1000\n")
	in.waitMetric(t, fileResultRate, 1000, reloadWithin)
	if got := in.metric(t, reloadsSuccess); got != 1 {
		t.Errorf("%s after the file was fixed = %v, want 1", reloadsSuccess, got)
	}
}

// TestReloadConfigMapSwap updates the limits file as Kubernetes updates a mounted
// ConfigMap: the file is a symlink through ..data, and ..data is swapped to a new
// directory, then the old one removed.
func TestReloadConfigMapSwap(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeLimits(t, filepath.Join(dir, name), "limits.env", content)
	}
	version("..2025_01_01_00_00_00.1", slowFileResult)
	if err := os.Symlink("..2025_01_01_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "limits.env")
	if err := os.Symlink(filepath.Join("..data", "limits.env"), path); err != nil {
		t.Fatal(err)
	}
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Fatalf("%s at start = %v, want 0.001, the ConfigMap's", fileResultRate, got)
	}

	// Kubernetes' atomic writer: a new directory, a new symlink renamed over ..data.
	version("..2025_01_01_00_01_00.2", "MDPROXY_FILE_RESULT_RATE=1000\n")
	if err := os.Symlink("..2025_01_01_00_01_00.2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2025_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 1000, reloadWithin)
	if codes := in.polls(t, "/file/x", 10); count(codes, http.StatusOK) != 10 {
		t.Errorf("10 polls after the ConfigMap raised the rate = %v, want all 200", codes)
	}
}

// TestReloadSignal sends reload signals through WithReloadSignals: with a limits file
// each reloads it; without one it is logged as reloading nothing, and mdproxy serves on.
func TestReloadSignal(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)

	t.Run("file", func(t *testing.T) {
		t.Parallel()
		path := writeLimits(t, t.TempDir(), "limits.env", slowFileResult)
		sigs := make(chan os.Signal, 1)
		// A settle time no test waits for: a change is in force by the signal alone.
		in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path, "MDPROXY_LIMITS_FILE_SETTLE": "1m"},
			WithReloadSignals(sigs))
		if codes := in.polls(t, "/file/x", 2); codes[0] != http.StatusOK || codes[1] != http.StatusServiceUnavailable {
			t.Fatalf("2 polls at rate 0.001, burst 1 = %v, want 200 then 503", codes)
		}

		// The file as it is: nothing to reload, and the operator hears so.
		unchanged := in.logs.Written(msgUnchanged)
		sigs <- syscall.SIGHUP
		select {
		case <-unchanged:
		case <-time.After(safety):
			t.Fatalf("no %q logged after a signal:\n%s", msgUnchanged, in.logs)
		}
		l := findLog(sidecartest.CheckJSONLogs(t, in.logs.String()), msgUnchanged)
		if l["level"] != "INFO" || l["trigger"] != "signal hangup" || l["file"] != path {
			t.Errorf("%q line = %v, want INFO, trigger %q, file %s", msgUnchanged, l, "signal hangup", path)
		}
		for _, s := range []string{reloadsSuccess, reloadsError} {
			if got := in.metric(t, s); got != 0 {
				t.Errorf("%s after a signal with the file unchanged = %v, want 0", s, got)
			}
		}
		if codes := in.polls(t, "/file/x", 1); codes[0] != http.StatusServiceUnavailable {
			t.Errorf("poll after a signal with the file unchanged = %v, want 503: the bucket kept, empty", codes)
		}

		// A new file renamed in place, then the signal: in force at once, not a
		// settle time later.
		reloaded := in.logs.Written(`"trigger":"signal hangup","changed":["file_result"]`)
		replaceFile(t, path, "MDPROXY_FILE_RESULT_RATE=1000\n")
		sigs <- syscall.SIGHUP
		select {
		case <-reloaded:
		case <-time.After(safety):
			t.Fatalf("no reload of file_result logged after a signal:\n%s", in.logs)
		}
		if got := in.metric(t, fileResultRate); got != 1000 {
			t.Errorf("%s after the signal = %v, want 1000", fileResultRate, got)
		}
		if got := in.metric(t, reloadsSuccess); got != 1 {
			t.Errorf("%s after the signal = %v, want 1", reloadsSuccess, got)
		}
	})

	t.Run("no file", func(t *testing.T) {
		t.Parallel()
		sigs := make(chan os.Signal, 1)
		in := startRun(t, up.URL, nil, WithReloadSignals(sigs))
		nothing := in.logs.Written("limits not reloaded: MDPROXY_LIMITS_FILE is not set")
		sigs <- syscall.SIGHUP
		select {
		case <-nothing:
		case <-time.After(safety):
			t.Fatalf("no line logged after a signal without a limits file:\n%s", in.logs)
		}
		if code, _ := sidecartest.Get(t, sidecartest.NewClient(t), in.proxyURL+"/file/x"); code != http.StatusOK {
			t.Errorf("GET /file/x after the signal = %d, want 200: mdproxy serves on", code)
		}
		for _, s := range []string{reloadsSuccess, reloadsError} {
			if got := in.metric(t, s); got != 0 {
				t.Errorf("%s after a signal without a file = %v, want 0", s, got)
			}
		}
		if err := in.stop(t); err != nil {
			t.Errorf("Run after a signal without a file = %v, want nil", err)
		}
	})
}

// TestNoEffectWarned checks the warning about settings that have no effect, at start
// and after a reload: one line naming each.
func TestNoEffectWarned(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	path := writeLimits(t, t.TempDir(), "limits.env", "MDPROXY_STAT_BURST=3\n")
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_LIMITS_FILE":               path,
		"MDPROXY_VERSION_MAX_WAIT":          "1s",
		"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "1m",
	})
	// check waits for the lines-th warning (the reload counts itself before it logs)
	// and checks that it names want.
	check := func(when string, lines int, want ...string) {
		t.Helper()
		var warned []map[string]any
		for deadline := time.Now().Add(reloadWithin); ; time.Sleep(10 * time.Millisecond) {
			warned = logsOf(t, in.logs, "settings without effect")
			if len(warned) >= lines || time.Now().After(deadline) {
				break
			}
		}
		if len(warned) < lines {
			t.Fatalf("%s: %d %q lines, want %d:\n%s", when, len(warned), "settings without effect", lines, in.logs)
		}
		l := warned[len(warned)-1]
		vars, _ := l["variables"].([]any)
		if l["level"] != "WARN" || len(vars) != len(want) {
			t.Fatalf("%s: %q line = %v, want a WARN naming %v", when, "settings without effect", l, want)
		}
		for i, name := range want {
			if s, _ := vars[i].(string); !sidecartest.NamesVar(s, name) {
				t.Errorf("%s: no-effect variable #%d = %q, want %s", when, i+1, s, name)
			}
		}
	}
	check("at start", 1, "MDPROXY_FILE_RESULT_CLIENT_WINDOW", "MDPROXY_VERSION_MAX_WAIT", "MDPROXY_STAT_BURST")

	replaceFile(t, path, "MDPROXY_STAT_RATE=1\nMDPROXY_STAT_BURST=3\nMDPROXY_LOGIN_BURST=2\n")
	in.waitMetric(t, reloadsSuccess, 1, reloadWithin)
	check("after a reload", 2, "MDPROXY_FILE_RESULT_CLIENT_WINDOW", "MDPROXY_LOGIN_BURST", "MDPROXY_VERSION_MAX_WAIT")
}

// logsOf returns the lines of logs whose msg is msg.
func logsOf(t *testing.T, logs *sidecartest.LogBuffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range sidecartest.CheckJSONLogs(t, logs.String()) {
		if l["msg"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// TestReloadDirRecreated removes the limits file's directory and makes it again, with
// a new file in it: the watch comes back by itself (no SIGHUP), the new file is put in
// force and so are later edits. The loss is logged at WARN once, the return at INFO.
func TestReloadDirRecreated(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	dir := filepath.Join(t.TempDir(), "limits")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := writeLimits(t, dir, "limits.env", slowFileResult)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Fatalf("%s at start = %v, want 0.001, the file's", fileResultRate, got)
	}
	recreate := func(content string) {
		t.Helper()
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeLimits(t, dir, "limits.env", content)
	}

	// The directory stays away until its loss was seen, then comes back.
	lost := in.logs.Written(msgWatchLost)
	back := in.logs.Written(msgWatchBack)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(safety):
		t.Fatalf("no %q logged after the directory was removed:\n%s", msgWatchLost, in.logs)
	}
	recreate("MDPROXY_FILE_RESULT_RATE=17\n")
	in.waitMetric(t, fileResultRate, 17, safety)
	select {
	case <-back:
	case <-time.After(safety):
		t.Fatalf("no %q logged after the directory came back:\n%s", msgWatchBack, in.logs)
	}
	// A later edit, in place, is seen: the directory is watched again.
	if err := os.WriteFile(path, []byte("MDPROXY_FILE_RESULT_RATE=18\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 18, safety)
	for msg, level := range map[string]string{msgWatchLost: "WARN", msgWatchBack: "INFO"} {
		if lines := logsOf(t, in.logs, msg); len(lines) != 1 || lines[0]["level"] != level || lines[0]["file"] != path {
			t.Errorf("%q lines = %v, want one at %s naming %s", msg, lines, level, path)
		}
	}

	// As a shell does it, `rm -rf d; mkdir d; echo ... > d/limits.env`: the directory may
	// be back before its removal was seen. The new file is read, and later edits.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	recreate("MDPROXY_FILE_RESULT_RATE=19\n")
	in.waitMetric(t, fileResultRate, 19, safety)
	replaceFile(t, path, "MDPROXY_FILE_RESULT_RATE=20\n")
	in.waitMetric(t, fileResultRate, 20, safety)
}

// TestReloadSymlinkTarget updates a limits file that is a symlink to a file in another
// directory, as some configuration tools lay it out: an edit of the target in place and
// a replacement of it are seen; so is the symlink pointed elsewhere, after which the new
// target is the one watched, even when its directory is removed and made again.
func TestReloadSymlinkTarget(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	root := t.TempDir()
	mkdir := func(name string) string {
		t.Helper()
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	lim, real1, real2 := mkdir("lim"), mkdir("real"), mkdir("real2")
	target1 := writeLimits(t, real1, "real.env", slowFileResult)
	path := filepath.Join(lim, "limits.env")
	if err := os.Symlink(target1, path); err != nil {
		t.Fatal(err)
	}
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path})
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Fatalf("%s at start = %v, want 0.001, the target's", fileResultRate, got)
	}

	// The target edited in place, then replaced through a rename.
	if err := os.WriteFile(target1, []byte("MDPROXY_FILE_RESULT_RATE=7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 7, safety)
	replaceFile(t, target1, "MDPROXY_FILE_RESULT_RATE=8\n")
	in.waitMetric(t, fileResultRate, 8, safety)

	// The symlink pointed at a file of another directory, replaced as `ln -sfn` does.
	target2 := writeLimits(t, real2, "other.env", "MDPROXY_FILE_RESULT_RATE=9\n")
	if err := os.Symlink(target2, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 9, safety)
	if err := os.WriteFile(target2, []byte("MDPROXY_FILE_RESULT_RATE=10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 10, safety)

	// The new target's directory removed and made again: the symlink dangles meanwhile.
	if err := os.RemoveAll(real2); err != nil {
		t.Fatal(err)
	}
	mkdir("real2")
	writeLimits(t, real2, "other.env", "MDPROXY_FILE_RESULT_RATE=11\n")
	in.waitMetric(t, fileResultRate, 11, safety)
	if err := os.WriteFile(target2, []byte("MDPROXY_FILE_RESULT_RATE=12\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, fileResultRate, 12, safety)
}

// TestReloadEmptyFileStaysEmpty empties the limits file and leaves it so: once settled,
// an empty file is a good one that overrides nothing, and the routes take the
// environment's limits, else their defaults.
func TestReloadEmptyFileStaysEmpty(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	path := writeLimits(t, t.TempDir(), "limits.env", slowFileResult+slowBatchStatus)
	in := startRun(t, up.URL, map[string]string{"MDPROXY_LIMITS_FILE": path, "MDPROXY_BATCH_STATUS_RATE": "7"})
	if got := in.metric(t, fileResultRate); got != 0.001 {
		t.Fatalf("%s at start = %v, want 0.001, the file's", fileResultRate, got)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	in.waitMetric(t, reloadsSuccess, 1, safety)
	if got := in.metric(t, fileResultRate); got != DefaultLimits["file_result"].Rate {
		t.Errorf("%s with the file empty = %v, want the default %v", fileResultRate, got, DefaultLimits["file_result"].Rate)
	}
	const batchRate = `mdproxy_limit_rate_requests_per_second{route="batch_status"}`
	if got := in.metric(t, batchRate); got != 7 {
		t.Errorf("%s with the file empty = %v, want 7, the environment's", batchRate, got)
	}
}
