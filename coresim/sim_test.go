package coresim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBoundedGoroutines submits thousands of files while the model stands still: the
// emulator holds them in its queue, not in goroutines, and keeps no spooled upload.
func TestBoundedGoroutines(t *testing.T) {
	cfg := rigConfig(t)
	r := newRig(t, cfg)
	const files = 3000
	r.mustSubmit([]byte("warm-up: opens the client's connection"), nil)
	for i := range 20 {
		r.mustSubmit(rigZip(t, 3, 10+i), map[string]string{"filename": "x.docx"})
	}
	before := runtime.NumGoroutine()
	for i := range files {
		r.mustSubmit([]byte(fmt.Sprintf("file %d", i)), nil)
	}
	after := runtime.NumGoroutine()
	if after > before+3 {
		t.Errorf("goroutines after %d more queued files = %d, want at most %d + 3 (none a file)", files, after, before)
	}
	if got, want := r.sim.model.QueueLen(), files+21; got != want {
		t.Errorf("QueueLen() = %d, want %d", got, want)
	}
	if got := r.metric("coresim_queue_files"); got != files+21 {
		t.Errorf("coresim_queue_files = %v, want %d", got, files+21)
	}
	if left, err := os.ReadDir(cfg.TempDir); err != nil || len(left) != 0 {
		t.Errorf("files left in CORESIM_TEMP_DIR after 20 zip uploads = %d (%v), want 0", len(left), err)
	}
}

// TestQueueSize checks that POST /file answers 503 "Server is too busy" beyond
// CORESIM_QUEUE_SIZE waiting files, and accepts again once scans leave the queue.
func TestQueueSize(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Cores = 2
	cfg.QueueSize = 5
	r := newRig(t, cfg)
	for i := range cfg.QueueSize {
		r.mustSubmit([]byte(fmt.Sprintf("file %d", i)), nil)
	}
	code, msg := r.submit([]byte("one too many"), nil)
	if code != http.StatusServiceUnavailable || msg != "Server is too busy. Try again later." {
		t.Errorf("POST /file with %d queued = %d %q, want 503 %q", cfg.QueueSize, code, msg, "Server is too busy. Try again later.")
	}
	if got := testutil.ToFloat64(r.sim.m.submissions.WithLabelValues("busy")); got != 1 {
		t.Errorf(`coresim_submissions_total{result="busy"} = %v, want 1`, got)
	}
	// One step moves two files to the cores: room for two more, not three.
	r.sim.advance(10 * time.Millisecond)
	for i := range 2 {
		if code, msg := r.submit([]byte(fmt.Sprintf("again %d", i)), nil); code != http.StatusOK {
			t.Errorf("POST /file %d after 2 files left the queue = %d %q, want 200", i, code, msg)
		}
	}
	if code, _ := r.submit([]byte("again, too many"), nil); code != http.StatusServiceUnavailable {
		t.Errorf("POST /file with a full queue again = %d, want 503", code)
	}
	if got := testutil.ToFloat64(r.sim.m.submissions.WithLabelValues("accepted")); got != 7 {
		t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want 7`, got)
	}
}

// TestQueueSizeConcurrent sends many submissions at once: the queue still never holds
// more than CORESIM_QUEUE_SIZE files (the seed's clients send ten at a time).
func TestQueueSizeConcurrent(t *testing.T) {
	cfg := rigConfig(t)
	cfg.QueueSize = 10
	r := newRig(t, cfg)
	const senders = 40
	body := rigZip(t, 20, 1000) // long enough to read that the senders overlap
	var wg sync.WaitGroup
	codes := make([]int, senders)
	start := make(chan struct{})
	for i := range senders {
		wg.Go(func() {
			<-start
			codes[i] = r.do(http.MethodPost, "/file", body, map[string]string{"filename": "a.docx"}).code
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for _, c := range codes {
		switch c {
		case http.StatusOK:
			ok++
		case http.StatusServiceUnavailable:
		default:
			t.Errorf("POST /file = %d, want 200 or 503", c)
		}
	}
	if ok != cfg.QueueSize || r.sim.model.QueueLen() != cfg.QueueSize {
		t.Errorf("%d concurrent POST /file with CORESIM_QUEUE_SIZE=%d: %d accepted, %d queued, want %d and %d",
			senders, cfg.QueueSize, ok, r.sim.model.QueueLen(), cfg.QueueSize, cfg.QueueSize)
	}
}

// TestRetention checks that a completed result is dropped once older than
// CORESIM_RETENTION (virtual), from GET /file/{data_id} and from the hash look-up.
func TestRetention(t *testing.T) {
	cfg := rigConfig(t)
	cfg.Retention = time.Minute
	r := newRig(t, cfg)
	body := []byte("kept for a minute")
	id := r.mustSubmit(body, nil)
	var res analysisResult
	r.get("/file/"+id, &res)
	md5 := res.FileInfo.MD5

	step := 100 * time.Millisecond
	for r.get("/file/"+id, &res); res.ProcessInfo.ProgressPercent != 100; r.get("/file/"+id, &res) {
		if r.sim.model.Now() > time.Minute {
			t.Fatalf("GET /file/%s progress after 1 min = %d, want 100", id, res.ProcessInfo.ProgressPercent)
		}
		r.sim.advance(step)
	}
	finished := r.sim.model.Now()
	r.sim.advance(10 * time.Second)
	other := r.mustSubmit([]byte("submitted 10 s later"), nil)
	for r.sim.model.Now() < finished+cfg.Retention-step {
		r.sim.advance(step)
	}
	if code := r.get("/file/"+id, nil); code != http.StatusOK {
		t.Errorf("GET /file/{id} at age %v < retention %v = %d, want 200", r.sim.model.Now()-finished, cfg.Retention, code)
	}
	var hit map[string]any
	if r.get("/hash/"+md5, &hit); hit["data_id"] != id {
		t.Errorf("GET /hash/{md5} at age < retention = %v, want the result of %s", hit, id)
	}

	r.sim.advance(2 * step)
	var notFound map[string]string
	if code := r.get("/file/"+id, &notFound); code != http.StatusNotFound || notFound["err"] != "Not found" {
		t.Errorf("GET /file/{id} at age %v > retention %v = %d %v, want 404 {\"err\":\"Not found\"}",
			r.sim.model.Now()-finished, cfg.Retention, code, notFound)
	}
	var miss map[string]string
	if code := r.get("/hash/"+md5, &miss); code != http.StatusOK || miss[md5] != "Not Found" {
		t.Errorf("GET /hash/{md5} after retention = %d %v, want 200 {%q: \"Not Found\"}", code, miss, md5)
	}
	// The file completed 10 s later is still there.
	if code := r.get("/file/"+other, nil); code != http.StatusOK {
		t.Errorf("GET /file/{id} of a younger result = %d, want 200", code)
	}
}

// flood offers far more fetches than Core's own limit allows, n at each step of
// 100 ms over span, and returns how many were accepted and rejected; every rejection
// must be a 503 with a Core-style body. post, when true, submits a file at each step as
// well: submissions are not limited.
func (r *rig) flood(paths []string, n int, span time.Duration, post bool) (accepted, rejected int) {
	r.t.Helper()
	const step = 100 * time.Millisecond
	for at := time.Duration(0); ; at += step {
		for i := range n {
			path := paths[i%len(paths)]
			resp := r.do(http.MethodGet, path, nil, nil)
			switch resp.code {
			case http.StatusOK:
				accepted++
			case http.StatusServiceUnavailable:
				rejected++
				var e map[string]string
				if err := json.Unmarshal(resp.body, &e); err != nil || e["err"] == "" {
					r.t.Errorf("GET %s over Core's limit = 503 %q, want a body {\"err\": ...}", path, resp.body)
				}
			default:
				r.t.Fatalf("GET %s = %d %q (%v), want 200 or 503", path, resp.code, resp.body, resp.err)
			}
		}
		if post {
			if code, msg := r.submit([]byte(fmt.Sprintf("submitted at %v", at)), nil); code != http.StatusOK {
				r.t.Errorf("POST /file while fetches are over Core's limit = %d %q, want 200", code, msg)
			}
		}
		if at >= span {
			return accepted, rejected
		}
		r.sim.advance(step)
	}
}

// TestFetchWait checks Core's limit with a wait (FetchWait): a fetch over the limit
// whose turn comes within the wait is held, then served at the limit's pace; one whose
// turn is further away is answered 503 at once.
func TestFetchWait(t *testing.T) {
	cfg := rigConfig(t)
	cfg.FetchLimit, cfg.FetchBurst, cfg.FetchWait = 2, 1, time.Second
	r := newRig(t, cfg)
	id := r.mustSubmit([]byte("waited for"), nil)

	type answer struct {
		code int
		at   time.Duration // virtual time of the answer
	}
	answers := make(chan answer, 5)
	for range 5 {
		go func() {
			resp := r.do(http.MethodGet, "/file/"+id, nil, nil)
			answers <- answer{resp.code, r.sim.model.Now()}
		}()
	}
	// receive waits for n answers; quiet checks that no other one comes meanwhile.
	receive := func(n int) (ok, refused int) {
		t.Helper()
		for range n {
			select {
			case a := <-answers:
				switch a.code {
				case http.StatusOK:
					ok++
				case http.StatusServiceUnavailable:
					refused++
				default:
					t.Fatalf("GET /file/{id} = %d, want 200 or 503", a.code)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d answers still missing after 10 s", n, n)
			}
		}
		return ok, refused
	}
	quiet := func(when string) {
		t.Helper()
		select {
		case a := <-answers:
			t.Errorf("%s: an answer %d at %v, want none yet", when, a.code, a.at)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// At 2/s with a burst of 1 and a wait of 1 s: the first fetch passes, the next two
	// are given turns at 0.5 s and 1 s, the last two would wait 1.5 s: refused.
	if ok, refused := receive(3); ok != 1 || refused != 2 {
		t.Fatalf("answers at once = %d × 200, %d × 503, want 1 and 2", ok, refused)
	}
	quiet("before 0.5 s")
	for i, at := range []time.Duration{500 * time.Millisecond, time.Second} {
		r.sim.advance(400 * time.Millisecond)
		quiet(fmt.Sprintf("%v before the turn at %v", r.sim.model.Now(), at))
		r.sim.advance(100 * time.Millisecond)
		if ok, _ := receive(1); ok != 1 {
			t.Fatalf("waiting fetch %d at %v: not served, want 200", i+1, at)
		}
	}
	if got := testutil.ToFloat64(r.sim.m.fetches.WithLabelValues("result", "rejected")); got != 2 {
		t.Errorf("coresim_fetches_total{result=rejected} = %v, want 2", got)
	}
}

// TestFetchLimit floods GET /file/{data_id} and GET /file/batch/{batch_id} and checks
// that Core's own limit lets exactly burst + rate × virtual elapsed through, within
// one, and never limits POST /file.
func TestFetchLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     float64
		burst     int
		kinds     []string // "result", "batch_status"
		perStep   int
		span      time.Duration
		wantBurst int
	}{
		{"results, 10/s", 10, 0, []string{"result"}, 5, 10 * time.Second, 10},
		{"results, 2/s, burst 5", 2, 5, []string{"result"}, 3, 20 * time.Second, 5},
		{"results, 0.5/s", 0.5, 0, []string{"result"}, 2, 30 * time.Second, 1},
		{"batch status, 4/s", 4, 0, []string{"batch_status"}, 2, 10 * time.Second, 4},
		{"results and batch status share the limit, 20/s", 20, 0, []string{"result", "batch_status"}, 8, 5 * time.Second, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := rigConfig(t)
			cfg.FetchLimit, cfg.FetchBurst = tc.limit, max(tc.burst, tc.wantBurst)
			r := newRig(t, cfg)
			var b struct {
				BatchID string `json:"batch_id"`
			}
			if resp := r.do(http.MethodPost, "/file/batch", nil, nil); json.Unmarshal(resp.body, &b) != nil {
				t.Fatalf("POST /file/batch = %d %q, want a batch_id", resp.code, resp.body)
			}
			id := r.mustSubmit([]byte("polled"), map[string]string{"batch": b.BatchID})
			var paths []string
			for _, k := range tc.kinds {
				paths = append(paths, map[string]string{"result": "/file/" + id, "batch_status": "/file/batch/" + b.BatchID}[k])
			}

			accepted, rejected := r.flood(paths, tc.perStep, tc.span, true)
			want := float64(tc.wantBurst) + tc.limit*tc.span.Seconds()
			if math.Abs(float64(accepted)-want) > 1 {
				t.Errorf("fetches accepted over %v at %d a step = %d, want burst %d + %v/s × %v = %v (±1)",
					tc.span, tc.perStep, accepted, tc.wantBurst, tc.limit, tc.span, want)
			}
			offered := tc.perStep * (int(tc.span/(100*time.Millisecond)) + 1)
			if accepted+rejected != offered {
				t.Errorf("fetches answered = %d + %d, want %d offered", accepted, rejected, offered)
			}
			served, rej := 0.0, 0.0
			for _, k := range tc.kinds {
				served += testutil.ToFloat64(r.sim.m.fetches.WithLabelValues(k, "served"))
				rej += testutil.ToFloat64(r.sim.m.fetches.WithLabelValues(k, "rejected"))
			}
			if int(served) != accepted || int(rej) != rejected {
				t.Errorf("coresim_fetches_total served, rejected = %v, %v, want %d, %d", served, rej, accepted, rejected)
			}
			if got, want := testutil.ToFloat64(r.sim.m.submissions.WithLabelValues("accepted")), float64(int(tc.span/(100*time.Millisecond))+2); got != want {
				t.Errorf(`coresim_submissions_total{result="accepted"} = %v, want %v: POST /file is never limited`, got, want)
			}
		})
	}
}

// TestFetchLimitOff checks that without CORESIM_FETCH_LIMIT (Core's default) no fetch
// is refused.
func TestFetchLimitOff(t *testing.T) {
	r := newRig(t, rigConfig(t))
	id := r.mustSubmit([]byte("polled"), nil)
	accepted, rejected := r.flood([]string{"/file/" + id}, 20, time.Second, false)
	if accepted != 220 || rejected != 0 {
		t.Errorf("fetches without a limit: %d accepted, %d rejected, want 220, 0", accepted, rejected)
	}
}

// mechanism is what one run of the seed's workload measured.
type mechanism struct {
	duration                    time.Duration // virtual, from the first submission to the last completion
	served, rejected            int           // poll answers: 200, 503
	learned                     int           // files whose complete result a poller got
	rejectSpent, pollSpent, all float64       // core-seconds
}

// runSeedWorkload replays the seed's test steps at a small scale through the HTTP API,
// advancing virtual time by hand in steps of 100 ms: turns of 10 submissions a virtual
// second until files are submitted, and, when poll is true, every 5 virtual seconds a
// GET /file/{data_id} of every data_id whose result the pollers do not have yet. It
// returns when the last scan completed and every poll was answered.
func runSeedWorkload(t *testing.T, cfg Config, files int, body []byte, poll bool) mechanism {
	t.Helper()
	r := newRig(t, cfg)
	const step = 100 * time.Millisecond
	var (
		mu       sync.Mutex
		ids      []string
		learned  = map[string]bool{}
		inflight = map[string]bool{}
		out      mechanism
		wg       sync.WaitGroup
	)
	pollOne := func(id string) {
		defer wg.Done()
		resp := r.do(http.MethodGet, "/file/"+id, nil, nil)
		mu.Lock()
		defer mu.Unlock()
		delete(inflight, id)
		switch {
		case resp.err != nil:
			t.Errorf("GET /file/%s: %v", id, resp.err)
		case resp.code == http.StatusOK:
			out.served++
			var res analysisResult
			if err := json.Unmarshal(resp.body, &res); err != nil {
				t.Errorf("GET /file/%s = 200 %q: %v", id, resp.body, err)
			}
			if res.ProcessInfo.ProgressPercent == 100 {
				learned[id] = true
			}
		case resp.code == http.StatusServiceUnavailable:
			out.rejected++
			var e map[string]string
			if err := json.Unmarshal(resp.body, &e); err != nil || e["err"] == "" {
				t.Errorf("GET /file/%s = 503 %q, want a body {\"err\": ...}", id, resp.body)
			}
		default:
			t.Errorf("GET /file/%s = %d %q, want 200 or 503", id, resp.code, resp.body)
		}
	}
	round := func() {
		// The pollers have read every answer already paid for: whether an id is polled
		// again depends on virtual time only, not on how fast the goroutines ran.
		// (A fetch books core time twice, to be received then answered: in between it is
		// neither booked nor answered, hence the condition, not a count taken once.)
		rigWaitFor(t, "the paid polls to be answered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(inflight) == rigPending(r.sim.model)
		})
		mu.Lock()
		n := 0
		for _, id := range ids {
			if learned[id] || inflight[id] {
				continue
			}
			inflight[id] = true
			n++
			wg.Add(1)
			go pollOne(id)
		}
		mu.Unlock()
		// Each poll in flight books its core time before time moves on; a rejection is
		// answered at once, its core time booked without a wait.
		rigWaitFor(t, fmt.Sprintf("%d polls to book core time or be refused", n), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rigPending(r.sim.model) == len(inflight)
		})
	}

	completed := func() bool {
		running, _, _ := r.sim.model.Load()
		return running == 0 && r.sim.model.QueueLen() == 0
	}
	for i := 0; ; i++ {
		now := time.Duration(i) * step
		if now%time.Second == 0 {
			for range min(10, files-len(ids)) {
				ids = append(ids, r.mustSubmit(body, map[string]string{"filename": "seed.docx"}))
			}
		}
		if poll && now > 0 && now%(5*time.Second) == 0 {
			round()
		}
		r.sim.advance(step)
		if len(ids) == files && completed() {
			out.duration = r.sim.model.Now()
			break
		}
		if i > 100000 {
			t.Fatalf("the workload did not complete in %v virtual", now)
		}
	}
	// Let the last polls be answered.
	for rigPending(r.sim.model) > 0 {
		r.sim.advance(step)
	}
	wg.Wait()
	out.learned = len(learned)
	if got := testutil.ToFloat64(r.sim.m.filesCompleted); got != float64(files) {
		t.Errorf("coresim_files_completed_total = %v, want %d", got, files)
	}
	_, _, spent := r.sim.model.Load()
	out.rejectSpent, out.pollSpent, out.all = spent[workReject], spent[workPoll], modelSpentTotal(spent)
	if got := r.metric("coresim_core_seconds_total", "work", "reject"); got != out.rejectSpent {
		t.Errorf(`coresim_core_seconds_total{work="reject"} = %v, want Load's %v`, got, out.rejectSpent)
	}
	if got := testutil.ToFloat64(r.sim.m.fetches.WithLabelValues("result", "rejected")); int(got) != out.rejected {
		t.Errorf(`coresim_fetches_total{kind="result",result="rejected"} = %v, want the %d 503 answers`, got, out.rejected)
	}
	return out
}

// TestPollingSlowsScanning reproduces the seed's mechanism on virtual time: answering
// result polls takes core time from scanning, so the same workload lasts longer when
// polls are answered at a high rate, and Core's own limit of 1 fetch a second brings
// the duration back, at the price of rejecting most polls.
func TestPollingSlowsScanning(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 200 submissions three times")
	}
	cfg := DefaultConfig() // 8 cores, as the seed's host
	cfg.TempDir = t.TempDir()
	// The rounds below are synchronized on polls booking core time at once: no
	// request latency, which would hold them on a virtual timer first, and no cost to
	// receive a fetch, which would book it in two stages (TestMetrics checks what a
	// rejection costs).
	cfg.RequestLatency, cfg.RejectCost = 0, 0
	// A fetch over Core's limit is refused at once rather than held for its turn
	// (TestFetchWait checks the wait): the rounds wait for every answer.
	cfg.FetchWait = 0
	// The slowdown grows with files × poll cost / cores, so a small workload needs a
	// dearer poll than the default 50 ms to show it.
	cfg.PollCostBase = 100 * time.Millisecond
	// Each submission costs 1.5 core-s, a quarter of the seed's 6.5: the run, and the
	// number of polls, are four times smaller (TestModelPollingSlowsScanning replays
	// the seed's 65 objects on the model alone).
	cfg.ScanCostObject = 1500 * time.Millisecond
	const files = 200
	body := []byte("one of 200 identical submissions")

	none := runSeedWorkload(t, cfg, files, body, false)
	polled := runSeedWorkload(t, cfg, files, body, true)
	limited := cfg
	limited.FetchLimit = 1
	capped := runSeedWorkload(t, limited, files, body, true)

	t.Logf("no polls: %v; polls every 5 s, no limit: %v (%d served, %.1f core-s); Core's limit 1/s: %v (%d served, %d rejected, %.3f core-s of rejections)",
		none.duration, polled.duration, polled.served, polled.pollSpent, capped.duration, capped.served, capped.rejected, capped.rejectSpent)

	if min := time.Duration(float64(none.duration) * 1.2); polled.duration < min {
		t.Errorf("duration with polls answered at will = %v, want at least +20%% over %v without polls = %v", polled.duration, none.duration, min)
	}
	// Polls queue for Core's 3 API workers, so the last files' results are learned in
	// rounds after the scans end: most, not all, are known when the last scan ends.
	if polled.rejected != 0 || polled.learned < files*8/10 {
		t.Errorf("without a limit: %d polls rejected, %d results learned, want 0 and at least %d", polled.rejected, polled.learned, files*8/10)
	}
	if d := math.Abs(float64(capped.duration-none.duration)) / float64(none.duration); d > 0.10 {
		t.Errorf("duration under Core's limit of 1/s = %v, want within 10%% of %v without polls (off by %.1f%%)", capped.duration, none.duration, 100*d)
	}
	if total := capped.served + capped.rejected; capped.rejected < total*9/10 {
		t.Errorf("polls under Core's limit of 1/s: %d rejected of %d, want most (at least 90%%)", capped.rejected, total)
	}
	if want := float64(capped.rejected) * limited.RejectCost.Seconds(); !modelNear(capped.rejectSpent, want) {
		t.Errorf("core-seconds spent rejecting = %v, want %d rejections × %v = %v", capped.rejectSpent, capped.rejected, limited.RejectCost, want)
	}
	if none.served != 0 || none.pollSpent != 0 {
		t.Errorf("without polls: %d polls served, %v core-s spent on polls, want 0, 0", none.served, none.pollSpent)
	}
}
