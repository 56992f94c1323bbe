package main

// Issue 29: the bridge's pending ids are bounded, black-box: the built binary in front
// of a stand-in Core that accepts every file and never calls back.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// silentCore stands in for a Core that cannot reach the callback listener: it answers
// every POST /file with a fresh data_id of idLen hex digits and never calls back, and
// answers 404 to anything else. It counts the submissions and the other requests.
type silentCore struct {
	url             string
	submissions     atomic.Int64
	others          atomic.Int64
	mu              sync.Mutex
	otherPaths      []string
	idLen           int
	firstID, lastID atomic.Value // string
}

func startSilentCore(t *testing.T, idLen int) *silentCore {
	t.Helper()
	c := &silentCore{idLen: idLen}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/file" {
			c.others.Add(1)
			c.mu.Lock()
			c.otherPaths = append(c.otherPaths, r.Method+" "+r.URL.Path)
			c.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"err":"Not found"}`)
			return
		}
		buf := make([]byte, idLen/2)
		_, _ = rand.Read(buf)
		id := hex.EncodeToString(buf)
		if c.submissions.Add(1) == 1 {
			c.firstID.Store(id)
		}
		c.lastID.Store(id)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"data_id":%q,"status":"inqueue","in_queue":1,"queue_priority":"normal"}`, id)
	}))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

// mustMetric returns the value of series in the process's /metrics, failing t when it
// is absent, so that a metric that is not exported cannot read as 0.
func (p *proc) mustMetric(t *testing.T, series string) float64 {
	t.Helper()
	v, ok := sidecartest.ParseMetrics(t, p.metrics(t)).Value(series)
	if !ok {
		t.Fatalf("/metrics has no %s", series)
	}
	return v
}

// liveHeap returns go_memstats_heap_alloc_bytes of the process right after two garbage
// collections, which /debug/pprof/heap?gc=1 runs (MDPROXY_PPROF=true): the bytes its
// live objects take, whatever garbage the load left, and without the buffers idle in
// sync.Pools (dropped at the second collection).
func (p *proc) liveHeap(t *testing.T) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.adminURL+"/debug/pprof/heap?gc=1", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET /debug/pprof/heap?gc=1: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /debug/pprof/heap?gc=1 = %d, want 200", resp.StatusCode)
		}
	}
	return p.mustMetric(t, "go_memstats_heap_alloc_bytes")
}

// TestBinaryPendingBounded: submissions whose callbacks never come and whose results
// nobody polls (clients that fire and forget, Core out of the listener's reach) no
// longer grow mdproxy's memory: the pending ids stay within
// MDPROXY_BRIDGE_PENDING_MAX_BYTES, the oldest dropped and counted, and the drops are
// logged once. Core's data_ids are long here (4 KiB), so that each id held weighs about
// 4.6 KiB with its records, and the 1 MiB bound lets about 230 live. The live heap is
// read after collections, once a first round of submissions filled the bound (and
// warmed the connections and buffers up), and again after a second round of 2,500,
// whose ids would take 11 MiB more without the bound.
//
// A dropped id's poll goes to Core; one still pending is answered by mdproxy.
func TestBinaryPendingBounded(t *testing.T) {
	t.Parallel()
	const (
		idLen       = 4096
		maxBytes    = 1 << 20
		warmUp      = 500
		submissions = 3000
		workers     = 8
	)
	core := startSilentCore(t, idLen)
	p := startBinary(t, core.url, map[string]string{
		"MDPROXY_BRIDGE_PENDING_MAX_BYTES": fmt.Sprint(maxBytes),
		"MDPROXY_PPROF":                    "true",
	})
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: safety}
	var next, failed atomic.Int64
	submitUpTo := func(n int64) {
		t.Helper()
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for next.Add(1) <= n && failed.Load() == 0 {
					resp, err := client.Post(p.proxyURL+"/file", "application/octet-stream", strings.NewReader("hello"))
					if err != nil {
						failed.Add(1)
						t.Errorf("POST /file: %v", err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
						t.Errorf("POST /file = %d, want Core's 200", resp.StatusCode)
						return
					}
				}
			})
		}
		wg.Wait()
		next.Store(n)
		if t.Failed() {
			t.FailNow()
		}
	}
	submitUpTo(warmUp)
	if d := p.mustMetric(t, "mdproxy_bridge_pending_dropped_total"); d <= 0 {
		t.Fatalf("after %d submissions, mdproxy_bridge_pending_dropped_total = %v, want the bound reached", warmUp, d)
	}
	heapBefore := p.liveHeap(t)
	submitUpTo(submissions)
	heapAfter := p.liveHeap(t)

	if n := core.submissions.Load(); n != submissions {
		t.Fatalf("Core took %d submissions, want %d", n, submissions)
	}
	held := p.mustMetric(t, "mdproxy_bridge_pending_ids")
	dropped := p.mustMetric(t, "mdproxy_bridge_pending_dropped_total")
	weight := p.mustMetric(t, "mdproxy_bridge_pending_bytes")
	t.Logf("%d submissions: %v pending ids held (%v bytes as weighed), %v dropped; live heap %.0f bytes after %d, %.0f after all (%+.0f)",
		submissions, held, weight, dropped, heapBefore, warmUp, heapAfter, heapAfter-heapBefore)
	if held <= 0 || weight > maxBytes || weight < maxBytes/2 {
		t.Errorf("%v pending ids weighing %v bytes, want some, weighing at most %d and near it", held, weight, maxBytes)
	}
	if held+dropped != submissions {
		t.Errorf("%v pending ids held and %v dropped, want %d in all (no callback, no poll, none expired)", held, dropped, submissions)
	}
	// Without the bound the second round's ids would take 2500 x 4.6 KiB = 11 MiB more;
	// with it, the ids held are as many, and the live heap moves by what else serving
	// holds for a moment (measured: tens of KiB).
	if grown := heapAfter - heapBefore; grown > maxBytes {
		t.Errorf("live heap grew by %.0f bytes for %d more submissions, want at most %d (the bound)", grown, submissions-warmUp, maxBytes)
	}

	// Logged once for the burst, naming the setting, without a data_id.
	var lines []string
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(line, `"msg":"bridge: the pending ids weigh more than MDPROXY_BRIDGE_PENDING_MAX_BYTES`) {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || strings.Contains(lines[0], core.firstID.Load().(string)) || !strings.Contains(lines[0], `"level":"WARN"`) {
		t.Errorf("log lines of pending ids dropped: %q, want one warning for the burst, without a data_id", lines)
	}

	// The first id was dropped: its poll goes to Core (which answers 404 here). The last
	// is pending: answered without Core.
	c := sidecartest.NewClient(t)
	if pl := getResult(t, c, p.proxyURL, core.firstID.Load().(string), ""); pl.status != http.StatusNotFound {
		t.Errorf("poll of the first, dropped id = %d %s, want Core's 404", pl.status, sidecartest.Short(pl.body))
	}
	if n := core.others.Load(); n != 1 {
		t.Errorf("Core received %d requests but submissions, want 1 (the dropped id's poll)", n)
	}
	last := core.lastID.Load().(string)
	if pl := getResult(t, c, p.proxyURL, last, ""); pl.status != http.StatusOK || pl.verdict != 255 || pl.result != "Processing" {
		t.Errorf("poll of the last id = %d %s, want the in-progress answer", pl.status, sidecartest.Short(pl.body))
	}
	if n := core.others.Load(); n != 1 {
		core.mu.Lock()
		t.Errorf("Core received %v, want only the dropped id's poll", core.otherPaths)
		core.mu.Unlock()
	}
	if t.Failed() {
		t.Logf("mdproxy's log:\n%s", p.logs.String())
	}
}
