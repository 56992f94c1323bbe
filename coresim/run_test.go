package coresim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// TestRun serves the emulator at a speed-up of 100: a submission is scanned and its
// result polled to completion in real time, the admin listener exports the emulator's
// metrics, and cancelling the context stops everything.
func TestRun(t *testing.T) {
	addrs, stop := startRun(t, map[string]string{
		"CORESIM_LISTEN_ADDR": "127.0.0.1:0",
		"CORESIM_ADMIN_ADDR":  "127.0.0.1:0",
		"CORESIM_SPEEDUP":     "100",
	})
	if addrs.admin == nil {
		t.Fatalf("Run reported no admin address with CORESIM_ADMIN_ADDR=127.0.0.1:0")
	}
	c := newClient(t)
	api := "http://" + addrs.api.String()

	code, body := call(t, c, http.MethodPost, api+"/file", []byte("a small file"))
	var sub struct {
		DataID string `json:"data_id"`
	}
	if err := json.Unmarshal(body, &sub); code != http.StatusOK || err != nil || len(sub.DataID) != 32 {
		t.Fatalf("POST /file = %d %s, want 200 and a data_id of 32 hex digits", code, body)
	}

	// 90 ms of core time is 0.9 ms of real time at ×100; each poll waits for a tick of
	// the model (5 ms), so a few polls see the scan complete.
	const maxPolls = 200
	var res struct {
		DataID      string `json:"data_id"`
		ProcessInfo struct {
			ProgressPercent int    `json:"progress_percentage"`
			Result          string `json:"result"`
		} `json:"process_info"`
	}
	polls := 0
	for polls < maxPolls && res.ProcessInfo.ProgressPercent != 100 {
		polls++
		code, body := call(t, c, http.MethodGet, api+"/file/"+sub.DataID, nil)
		if err := json.Unmarshal(body, &res); code != http.StatusOK || err != nil {
			t.Fatalf("GET /file/{data_id} = %d %s, want 200 and a result", code, body)
		}
	}
	if res.ProcessInfo.ProgressPercent != 100 || res.DataID != sub.DataID || res.ProcessInfo.Result != "Allowed" {
		t.Fatalf("GET /file/{data_id} after %d polls: data_id %q, progress %d, result %q, want %q, 100, Allowed",
			polls, res.DataID, res.ProcessInfo.ProgressPercent, res.ProcessInfo.Result, sub.DataID)
	}

	code, body = call(t, c, http.MethodGet, "http://"+addrs.admin.String()+"/metrics", nil)
	if code != http.StatusOK {
		t.Fatalf("GET admin /metrics = %d, want 200", code)
	}
	// Run's registry is its own, so the exposition is read as a scraper reads it. Lines
	// are looked for rather than compared with testutil.ScrapeAndCompare, which wants
	// whole families, help text included, and exact values: the model runs in real
	// time here, so core-seconds and the Go collectors' values vary from run to run.
	metrics := string(body)
	for _, want := range []string{
		"coresim_files_completed_total 1\n",
		"coresim_objects_scanned_total 1\n",
		"coresim_queue_files 0\n",
		"coresim_scanning_files 0\n",
		"coresim_speedup 100\n",
		"coresim_cores 8\n",
		`coresim_submissions_total{result="accepted"} 1` + "\n",
		fmt.Sprintf(`coresim_fetches_total{kind="result",result="served"} %d`, polls) + "\n",
		`coresim_core_seconds_total{work="scan"} `,
		"go_goroutines ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("GET admin /metrics lacks %q:\n%s", want, metrics)
		}
	}

	logs, err := stop()
	if err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
	var rec struct {
		Msg, Listen string
		Speedup     float64
	}
	line, _, _ := strings.Cut(logs, "\n")
	if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Msg != "coresim serving" || rec.Listen != addrs.api.String() || rec.Speedup != 100 {
		t.Errorf("Run's first log line = %q, want JSON {msg: coresim serving, listen: %s, speedup: 100}", line, addrs.api)
	}
	if _, err := net.DialTimeout("tcp", addrs.api.String(), time.Second); err == nil {
		t.Errorf("the API still accepts connections after Run returned")
	}
}

// TestRunNoAdmin checks that an empty CORESIM_ADMIN_ADDR serves no admin listener.
func TestRunNoAdmin(t *testing.T) {
	addrs, stop := startRun(t, map[string]string{"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": "", "CORESIM_FETCH_WAITT": "0s"})
	if addrs.admin != nil {
		t.Errorf("admin address with CORESIM_ADMIN_ADDR empty = %v, want none", addrs.admin)
	}
	if code, _ := call(t, newClient(t), http.MethodGet, "http://"+addrs.api.String()+"/version", nil); code != http.StatusOK {
		t.Errorf("GET /version = %d, want 200", code)
	}
	logs, err := stop()
	if err != nil {
		t.Errorf("Run after its context ended = %v, want nil", err)
	}
	// A misspelt variable is ignored, with a warning naming it.
	if !strings.Contains(logs, "unknown variables ignored") || !strings.Contains(logs, "CORESIM_FETCH_WAITT") {
		t.Errorf("logs with CORESIM_FETCH_WAITT set = %q, want a warning naming it", logs)
	}
}

// TestRunBadVariable checks that Run refuses a bad setting before listening, with an
// *envconf.Error naming the variable (main exits 2 on it).
func TestRunBadVariable(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"CORESIM_CORES", "0"},
		{"CORESIM_SPEEDUP", "x"},
		{"CORESIM_TICK", "5"},
		{"CORESIM_FETCH_LIMIT", "-1"},
		{"CORESIM_LISTEN_ADDR", ""},
	} {
		environ := map[string]string{"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": "127.0.0.1:0", tc.name: tc.value}
		called := false
		err := Run(context.Background(), environ, io.Discard, func(net.Addr, net.Addr) { called = true })
		var e *envconf.Error
		if !errors.As(err, &e) || e.Var != tc.name {
			t.Errorf("Run with %s=%q = %v, want an *envconf.Error naming %s", tc.name, tc.value, err, tc.name)
		}
		if called {
			t.Errorf("Run with %s=%q listened, want it to stop before", tc.name, tc.value)
		}
	}
}

// TestRunAddressInUse checks that a listener that cannot be opened is an error naming
// its variable, not a bad setting.
func TestRunAddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, name := range []string{"CORESIM_LISTEN_ADDR", "CORESIM_ADMIN_ADDR"} {
		environ := map[string]string{"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": "127.0.0.1:0", name: busy.Addr().String()}
		err := Run(context.Background(), environ, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), name) || errors.As(err, new(*envconf.Error)) {
			t.Errorf("Run with %s on a busy address = %v, want an error naming %s, not an *envconf.Error", name, err, name)
		}
	}
}
