package coresim

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetrics follows three files through the cores and reads every gauge and counter
// of the emulator from the registry.
func TestMetrics(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Cores = 2
	cfg.ScanCostObject, cfg.ScanCostMiB = time.Second, 0
	cfg.PollCostBase, cfg.PollCostEntry = 10*time.Millisecond, time.Millisecond
	cfg.BatchCostFile, cfg.RejectCost = 5*time.Millisecond, 2*time.Millisecond
	cfg.FetchLimit, cfg.FetchBurst = 0.0001, 3 // three fetches, then every one rejected
	r := newRig(t, cfg)

	type want struct {
		queue, scanning, busy, completed, objects, scan float64
	}
	check := func(when string, w want) {
		t.Helper()
		for _, m := range []struct {
			name string
			want float64
		}{
			{"coresim_queue_files", w.queue},
			{"coresim_scanning_files", w.scanning},
			{"coresim_busy_cores", w.busy},
			{"coresim_files_completed_total", w.completed},
			{"coresim_objects_scanned_total", w.objects},
		} {
			if got := r.metric(m.name); !modelNear(got, m.want) {
				t.Errorf("%s: %s = %v, want %v", when, m.name, got, m.want)
			}
		}
		if got := r.metric("coresim_core_seconds_total", "work", "scan"); !modelNear(got, w.scan) {
			t.Errorf(`%s: coresim_core_seconds_total{work="scan"} = %v, want %v`, when, got, w.scan)
		}
		if got, want := r.metric("coresim_virtual_seconds"), r.sim.model.Now().Seconds(); got != want {
			t.Errorf("%s: coresim_virtual_seconds = %v, want %v", when, got, want)
		}
	}

	var b struct {
		BatchID string `json:"batch_id"`
	}
	if resp := r.do(http.MethodPost, "/file/batch", nil, nil); resp.code != http.StatusOK || json.Unmarshal(resp.body, &b) != nil {
		t.Fatalf("POST /file/batch = %d %q, want 200 and a batch_id", resp.code, resp.body)
	}
	a := r.mustSubmit(rigZip(t, 4, 100), map[string]string{"filename": "a.docx"}) // 5 objects, 5 s
	r.mustSubmit([]byte("b"), nil)                                                // 1 object, 1 s
	r.mustSubmit([]byte("c"), map[string]string{"batch": b.BatchID})              // 1 object, 1 s
	check("queued", want{queue: 3})
	if got := r.metric("coresim_cores"); got != 2 {
		t.Errorf("coresim_cores = %v, want 2", got)
	}
	if got := r.metric("coresim_speedup"); got != 1 {
		t.Errorf("coresim_speedup = %v, want 1", got)
	}
	if got := r.metric("coresim_submissions_total", "result", "accepted"); got != 3 {
		t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want 3`, got)
	}

	r.sim.advance(500 * time.Millisecond) // a and b scan, c waits
	check("at 0.5 s", want{queue: 1, scanning: 2, busy: 2, scan: 1})
	r.sim.advance(500 * time.Millisecond) // b done
	check("at 1 s", want{queue: 1, scanning: 1, busy: 2, completed: 1, objects: 1, scan: 2})
	r.sim.advance(time.Second) // c starts and ends, a at 2 of 5
	check("at 2 s", want{scanning: 1, busy: 2, completed: 2, objects: 2, scan: 4})
	r.sim.advance(3 * time.Second) // a ends: 3 core-s in 3 s
	check("at 5 s", want{busy: 1, completed: 3, objects: 7, scan: 7})
	r.sim.advance(time.Second)
	check("idle", want{completed: 3, objects: 7, scan: 7})

	step := 10 * time.Millisecond
	// A poll of a's complete result: 10 ms + 5 objects × 7 engines × 1 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/"+a), 0, step); resp.code != http.StatusOK {
		t.Errorf("GET /file/{a} = %d, want 200", resp.code)
	}
	// An unknown data_id: 10 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/0123456789abcdef0123456789abcdef"), 0, step); resp.code != http.StatusNotFound {
		t.Errorf("GET /file/{unknown} = %d, want 404", resp.code)
	}
	// The batch status page of one file: 10 ms + 5 ms.
	if resp := r.awaitAnswer(r.async(http.MethodGet, "/file/batch/"+b.BatchID), 0, step); resp.code != http.StatusOK {
		t.Errorf("GET /file/batch/{id} = %d, want 200", resp.code)
	}
	// The burst is spent: two polls and a batch status rejected, 2 ms each.
	for _, path := range []string{"/file/" + a, "/file/" + a, "/file/batch/" + b.BatchID} {
		resp := r.awaitAnswer(r.async(http.MethodGet, path), 0, step)
		if resp.code != http.StatusServiceUnavailable {
			t.Errorf("GET %s over Core's limit = %d, want 503", path, resp.code)
		}
	}
	for _, m := range []struct {
		labels []string
		want   float64
	}{
		{[]string{"kind", "result", "result", "served"}, 1},
		{[]string{"kind", "result", "result", "not_found"}, 1},
		{[]string{"kind", "result", "result", "rejected"}, 2},
		{[]string{"kind", "batch_status", "result", "served"}, 1},
		{[]string{"kind", "batch_status", "result", "rejected"}, 1},
	} {
		if got := r.metric("coresim_fetches_total", m.labels...); got != m.want {
			t.Errorf("coresim_fetches_total%v = %v, want %v", m.labels, got, m.want)
		}
	}
	// Rejections book core time that nobody waits for: it is spent at the next step.
	r.sim.advance(10 * time.Millisecond)
	for _, m := range []struct {
		work string
		want float64
	}{
		{"scan", 7},
		{"poll", 0.045 + 0.010 + 2*0.002}, // and each receiving by a worker (RejectCost)
		{"batch_status", 0.015 + 0.002},
		{"reject", 3 * 0.002},
	} {
		if got := r.metric("coresim_core_seconds_total", "work", m.work); !modelNear(got, m.want) {
			t.Errorf(`coresim_core_seconds_total{work=%q} = %v, want %v`, m.work, got, m.want)
		}
	}
	// No other series: label values come from fixed sets, a series exists once counted.
	for _, m := range []struct {
		name string
		want int
	}{
		{"coresim_submissions_total", 1},
		{"coresim_fetches_total", 5},
		{"coresim_core_seconds_total", 4},
		{"coresim_callbacks_total", 0},
	} {
		if got, err := testutil.GatherAndCount(r.reg, m.name); err != nil || got != m.want {
			t.Errorf("series of %s = %d, %v, want %d", m.name, got, err, m.want)
		}
	}
}
