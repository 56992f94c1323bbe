package coresim

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestWorkString(t *testing.T) {
	for _, tc := range []struct {
		w    work
		want string
	}{
		{workScan, "scan"},
		{workPoll, "poll"},
		{workBatchStatus, "batch_status"},
		{workReject, "reject"},
	} {
		if got := tc.w.String(); got != tc.want {
			t.Errorf("work(%d).String() = %q, want %q", int(tc.w), got, tc.want)
		}
	}
}

// TestModelCapacity checks the capacity arithmetic of one step: V cores supply V × dv
// core-seconds, the foreground is served first, scans share the rest, at most one core
// each, with at most V files in progress and the others queued.
func TestModelCapacity(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cores   int
		jobs    []float64 // scan costs, core-seconds, enqueued in this order
		charges []float64 // foreground poll charges, booked before the step
		dv      time.Duration

		wantScan, wantPoll, wantBusy      float64
		wantRunning, wantQueued, wantDone int
	}{
		{name: "one core, one long scan", cores: 1, jobs: []float64{10}, dv: time.Second,
			wantScan: 1, wantBusy: 1, wantRunning: 1},
		{name: "a scan holds one core at most", cores: 8, jobs: []float64{10, 10, 10}, dv: 2 * time.Second,
			wantScan: 6, wantBusy: 3, wantRunning: 3},
		{name: "more scans than cores wait", cores: 4, jobs: []float64{10, 10, 10, 10, 10, 10}, dv: time.Second,
			wantScan: 4, wantBusy: 4, wantRunning: 4, wantQueued: 2},
		{name: "a quarter second on two cores", cores: 2, jobs: []float64{10, 10}, dv: 250 * time.Millisecond,
			wantScan: 0.5, wantBusy: 2, wantRunning: 2},
		{name: "a scan ends within the step", cores: 2, jobs: []float64{0.3, 10}, dv: time.Second,
			wantScan: 1.3, wantBusy: 1.3, wantRunning: 1, wantDone: 1},
		{name: "foreground first, scans share the rest", cores: 4, jobs: []float64{10, 10, 10, 10, 10, 10},
			charges: []float64{0.5, 0.5}, dv: time.Second,
			wantScan: 3, wantPoll: 1, wantBusy: 4, wantRunning: 4, wantQueued: 2},
		{name: "foreground leaves nothing", cores: 2, jobs: []float64{10}, charges: []float64{5}, dv: time.Second,
			wantScan: 0, wantPoll: 2, wantBusy: 2, wantRunning: 1},
		{name: "foreground only", cores: 3, charges: []float64{0.25, 0.5}, dv: time.Second,
			wantPoll: 0.75, wantBusy: 0.75},
		{name: "idle", cores: 4, dv: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := 0
			m := newModel(tc.cores, func(*job) { done++ })
			for _, c := range tc.jobs {
				m.Enqueue(c, nil)
			}
			for _, c := range tc.charges {
				m.Charge(workPoll, c)
			}
			m.Advance(tc.dv)

			running, busy, spent := m.Load()
			if !modelNear(spent[workScan], tc.wantScan) {
				t.Errorf("spent[scan] after Advance(%v) = %v, want %v", tc.dv, spent[workScan], tc.wantScan)
			}
			if !modelNear(spent[workPoll], tc.wantPoll) {
				t.Errorf("spent[poll] after Advance(%v) = %v, want %v", tc.dv, spent[workPoll], tc.wantPoll)
			}
			if capacity := float64(tc.cores) * tc.dv.Seconds(); modelSpentTotal(spent) > capacity+1e-9 {
				t.Errorf("core-seconds spent in Advance(%v) = %v, want at most %d cores × %v = %v",
					tc.dv, modelSpentTotal(spent), tc.cores, tc.dv, capacity)
			}
			if !modelNear(busy, tc.wantBusy) {
				t.Errorf("busy cores after Advance(%v) = %v, want %v", tc.dv, busy, tc.wantBusy)
			}
			if running != tc.wantRunning {
				t.Errorf("scans running after Advance(%v) = %d, want %d", tc.dv, running, tc.wantRunning)
			}
			if got := m.QueueLen(); got != tc.wantQueued {
				t.Errorf("QueueLen() after Advance(%v) = %d, want %d", tc.dv, got, tc.wantQueued)
			}
			if done != tc.wantDone {
				t.Errorf("scans completed by Advance(%v) = %d, want %d", tc.dv, done, tc.wantDone)
			}
			if got := m.Now(); got != tc.dv {
				t.Errorf("Now() after Advance(%v) = %v, want %v", tc.dv, got, tc.dv)
			}
		})
	}
}

func TestModelAdvanceNothing(t *testing.T) {
	m := newModel(2, nil)
	m.Enqueue(1, nil)
	for _, dv := range []time.Duration{0, -time.Second} {
		m.Advance(dv)
		if got := m.Now(); got != 0 {
			t.Errorf("Now() after Advance(%v) = %v, want 0", dv, got)
		}
		if running, _, spent := m.Load(); running != 0 || spent[workScan] != 0 {
			t.Errorf("Load() after Advance(%v) = %d running, %v spent, want 0, 0", dv, running, spent[workScan])
		}
	}
}

// TestModelChargePaid checks that each foreground charge is served in arrival order
// and its channel closed in exactly the step that pays its last core-second.
func TestModelChargePaid(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cores    int
		step     time.Duration
		charges  []float64
		paidStep []int // the step after which each charge's channel is closed; 0: at once
	}{
		{"one core, half-steps", 1, 100 * time.Millisecond, []float64{0.05, 0.05, 0.05, 0.05, 0.05}, []int{1, 1, 2, 2, 3}},
		{"a long charge holds back the next ones", 2, 100 * time.Millisecond, []float64{0.3, 0.1, 0.2}, []int{2, 2, 3}},
		{"arrival order, one a step", 1, 100 * time.Millisecond, []float64{0.1, 0.1, 0.1, 0.1}, []int{1, 2, 3, 4}},
		{"eight cores", 8, 10 * time.Millisecond, []float64{0.06, 0.06, 0.06}, []int{1, 2, 3}},
		{"zero cost is paid at once", 1, 100 * time.Millisecond, []float64{0, 0.1, 0}, []int{0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(tc.cores, nil)
			var chans []<-chan struct{}
			for _, c := range tc.charges {
				chans = append(chans, m.Charge(workPoll, c))
			}
			last := slices.Max(tc.paidStep)
			for step := 0; step <= last+1; step++ {
				if step > 0 {
					m.Advance(tc.step)
				}
				for i, ch := range chans {
					if got, want := modelPaid(ch), step >= tc.paidStep[i]; got != want {
						t.Errorf("charge %d (%v core-s) paid after step %d = %t, want %t", i, tc.charges[i], step, got, want)
					}
				}
			}
			_, _, spent := m.Load()
			total := 0.0
			for _, c := range tc.charges {
				total += c
			}
			if !modelNear(spent[workPoll], total) {
				t.Errorf("spent[poll] = %v, want the charges' sum %v", spent[workPoll], total)
			}
		})
	}
}

// TestModelForegroundBeforeScans checks that a scan gets no core time while the
// foreground takes every core, and gets what the foreground leaves once it is paid.
func TestModelForegroundBeforeScans(t *testing.T) {
	m := newModel(1, nil)
	j := m.Enqueue(1, nil)
	var chans []<-chan struct{}
	for range 10 {
		chans = append(chans, m.Charge(workPoll, 0.1))
	}
	for step := 1; step <= 10; step++ {
		m.Advance(100 * time.Millisecond)
		for i, ch := range chans {
			if got, want := modelPaid(ch), i < step; got != want {
				t.Errorf("step %d: charge %d paid = %t, want %t", step, i, got, want)
			}
		}
		if done, _, _ := m.Progress(j); done != 0 {
			t.Errorf("step %d: scan progress under a full foreground = %v, want 0", step, done)
		}
	}
	m.Advance(100 * time.Millisecond)
	if done, _, _ := m.Progress(j); !modelNear(done, 0.1) {
		t.Errorf("scan progress after the foreground = %v, want 0.1", done)
	}
	// A charge booked while the scan runs is served before it, in that step.
	ch := m.Charge(workBatchStatus, 0.04)
	m.Advance(100 * time.Millisecond)
	if !modelPaid(ch) {
		t.Errorf("charge of 0.04 core-s paid after a 100 ms step on 1 core = false, want true")
	}
	if done, _, _ := m.Progress(j); !modelNear(done, 0.16) {
		t.Errorf("scan progress beside a 0.04 core-s charge = %v, want 0.16", done)
	}
}

// TestModelSharing checks that scans share what the foreground leaves equally, one
// core at most each, and that the others wait in the queue.
func TestModelSharing(t *testing.T) {
	m := newModel(4, nil)
	var jobs []*job
	for range 6 {
		jobs = append(jobs, m.Enqueue(2, nil))
	}
	m.Charge(workPoll, 1)
	m.Advance(time.Second)
	for i, j := range jobs {
		done, queued, ahead := m.Progress(j)
		switch {
		case i < 4:
			// 4 core-s - 1 of foreground = 3, shared by 4 scans: 0.75 of 2 core-s each.
			if !modelNear(done, 0.375) || queued {
				t.Errorf("Progress(scan %d) = %v, queued %t, want 0.375, false", i, done, queued)
			}
		default:
			if done != 0 || !queued || ahead != i-4 {
				t.Errorf("Progress(scan %d) = %v, queued %t, ahead %d, want 0, true, %d", i, done, queued, ahead, i-4)
			}
		}
	}
	// Without foreground, a scan still gets one core at most.
	m.Advance(500 * time.Millisecond)
	if done, _, _ := m.Progress(jobs[0]); !modelNear(done, 0.625) {
		t.Errorf("Progress(scan 0) after a free 0.5 s = %v, want 0.625 (one core)", done)
	}
}

// TestModelFIFO checks that queued scans start in arrival order.
func TestModelFIFO(t *testing.T) {
	var order []int
	m := newModel(1, func(j *job) { order = append(order, j.payload.(int)) })
	var jobs []*job
	for i := range 5 {
		jobs = append(jobs, m.Enqueue(0.1, i))
	}
	for i, j := range jobs {
		if _, queued, ahead := m.Progress(j); !queued || ahead != i {
			t.Errorf("Progress(scan %d) before any step: queued %t, ahead %d, want true, %d", i, queued, ahead, i)
		}
	}
	for step := 1; step <= 5; step++ {
		m.Advance(100 * time.Millisecond)
		if want := []int{0, 1, 2, 3, 4}[:step]; !slices.Equal(order, want) {
			t.Errorf("completion order after step %d = %v, want %v", step, order, want)
		}
		for i, j := range jobs[step:] {
			if _, queued, ahead := m.Progress(j); !queued || ahead != i {
				t.Errorf("step %d: Progress(scan %d): queued %t, ahead %d, want true, %d", step, step+i, queued, ahead, i)
			}
		}
	}
}

// TestModelProgressTimes follows two scans on one core through Progress, Times,
// QueueLen and Load.
func TestModelProgressTimes(t *testing.T) {
	var finished []time.Duration
	m := newModel(1, func(j *job) { finished = append(finished, j.finished) })
	a := m.Enqueue(1, "a")
	b := m.Enqueue(1, "b")

	type state struct {
		done          float64
		queued        bool
		ahead         int
		queue, proc   time.Duration
		running       int
		busy, scanned float64
		queueLen      int
	}
	check := func(when string, j *job, name string, want state) {
		t.Helper()
		done, queued, ahead := m.Progress(j)
		if !modelNear(done, want.done) || queued != want.queued || ahead != want.ahead {
			t.Errorf("%s: Progress(%s) = %v, %t, %d, want %v, %t, %d", when, name, done, queued, ahead, want.done, want.queued, want.ahead)
		}
		q, p := m.Times(j)
		if q != want.queue || p != want.proc {
			t.Errorf("%s: Times(%s) = %v, %v, want %v, %v", when, name, q, p, want.queue, want.proc)
		}
		running, busy, spent := m.Load()
		if running != want.running || !modelNear(busy, want.busy) || !modelNear(spent[workScan], want.scanned) {
			t.Errorf("%s: Load() = %d, %v, %v, want %d, %v, %v", when, running, busy, spent[workScan], want.running, want.busy, want.scanned)
		}
		if got := m.QueueLen(); got != want.queueLen {
			t.Errorf("%s: QueueLen() = %d, want %d", when, got, want.queueLen)
		}
	}

	check("at start", a, "a", state{queued: true, ahead: 0, queueLen: 2})
	check("at start", b, "b", state{queued: true, ahead: 1, queueLen: 2})

	m.Advance(250 * time.Millisecond)
	check("at 250ms", a, "a", state{done: 0.25, proc: 250 * time.Millisecond, running: 1, busy: 1, scanned: 0.25, queueLen: 1})
	check("at 250ms", b, "b", state{queued: true, queue: 250 * time.Millisecond, running: 1, busy: 1, scanned: 0.25, queueLen: 1})

	m.Advance(750 * time.Millisecond)
	check("at 1s", a, "a", state{done: 1, proc: time.Second, busy: 1, scanned: 1, queueLen: 1})
	// b takes the free core at the start of the next step, not within this one.
	check("at 1s", b, "b", state{queued: true, queue: time.Second, busy: 1, scanned: 1, queueLen: 1})

	m.Advance(500 * time.Millisecond)
	check("at 1.5s", a, "a", state{done: 1, proc: time.Second, running: 1, busy: 1, scanned: 1.5})
	check("at 1.5s", b, "b", state{done: 0.5, queue: time.Second, proc: 500 * time.Millisecond, running: 1, busy: 1, scanned: 1.5})

	// b needs 0.5 core-s of this 1 s step: it completes at the end of the step, and
	// the core was busy half of it.
	m.Advance(time.Second)
	check("at 2.5s", b, "b", state{done: 1, queue: time.Second, proc: 1500 * time.Millisecond, busy: 0.5, scanned: 2})
	if want := []time.Duration{time.Second, 2500 * time.Millisecond}; !slices.Equal(finished, want) {
		t.Errorf("finish times = %v, want %v", finished, want)
	}

	// A scan of no cost is done from the start.
	z := m.Enqueue(0, nil)
	if done, queued, _ := m.Progress(z); done != 1 || !queued {
		t.Errorf("Progress(zero-cost scan) = %v, queued %t, want 1, true", done, queued)
	}
}

func TestModelCancel(t *testing.T) {
	t.Run("queued", func(t *testing.T) {
		var done []string
		m := newModel(1, func(j *job) { done = append(done, j.payload.(string)) })
		a := m.Enqueue(1, "a")
		b := m.Enqueue(1, "b")
		c := m.Enqueue(1, "c")
		m.Advance(100 * time.Millisecond)
		if !m.Cancel(b) {
			t.Errorf("Cancel(queued b) = false, want true")
		}
		if m.Cancel(b) {
			t.Errorf("Cancel(b) a second time = true, want false")
		}
		if got := m.QueueLen(); got != 1 {
			t.Errorf("QueueLen() after cancelling b = %d, want 1", got)
		}
		if _, queued, ahead := m.Progress(c); !queued || ahead != 0 {
			t.Errorf("Progress(c) after cancelling b: queued %t, ahead %d, want true, 0", queued, ahead)
		}
		for range 30 {
			m.Advance(100 * time.Millisecond)
		}
		if want := []string{"a", "c"}; !slices.Equal(done, want) {
			t.Errorf("completed = %v, want %v", done, want)
		}
		if _, _, spent := m.Load(); !modelNear(spent[workScan], 2) {
			t.Errorf("spent[scan] = %v, want 2 (b never scanned)", spent[workScan])
		}
		if m.Cancel(a) {
			t.Errorf("Cancel(completed a) = true, want false")
		}
	})
	t.Run("running", func(t *testing.T) {
		var done []string
		m := newModel(2, func(j *job) { done = append(done, j.payload.(string)) })
		a := m.Enqueue(1, "a")
		m.Enqueue(1, "b")
		c := m.Enqueue(1, "c")
		m.Advance(500 * time.Millisecond)
		if !m.Cancel(a) {
			t.Errorf("Cancel(running a) = false, want true")
		}
		if running, _, _ := m.Load(); running != 1 {
			t.Errorf("scans running after cancelling a = %d, want 1", running)
		}
		m.Advance(100 * time.Millisecond)
		if done, queued, _ := m.Progress(a); !modelNear(done, 0.5) || queued {
			t.Errorf("Progress(cancelled a) = %v, queued %t, want 0.5, false", done, queued)
		}
		if _, queued, _ := m.Progress(c); queued {
			t.Errorf("Progress(c): queued = true, want false: it takes the core a left")
		}
		for range 20 {
			m.Advance(100 * time.Millisecond)
		}
		if want := []string{"b", "c"}; !slices.Equal(done, want) {
			t.Errorf("completed = %v, want %v", done, want)
		}
		if _, _, spent := m.Load(); !modelNear(spent[workScan], 2.5) {
			t.Errorf("spent[scan] = %v, want 2.5 (half of a, all of b and c)", spent[workScan])
		}
	})
}

// TestModelSpentAddsUp runs a mixed workload to its end and checks that the
// core-seconds spent by each kind of work are what it was charged, and that the busy
// cores of each step add up to the same total.
func TestModelSpentAddsUp(t *testing.T) {
	const cores = 3
	const step = 50 * time.Millisecond
	completed := 0
	m := newModel(cores, func(*job) { completed++ })
	costs := []float64{0.7, 1.3, 2, 0.05, 3.3, 1, 0.45, 2.2}
	var want [numWork]float64
	for _, c := range costs {
		m.Enqueue(c, nil)
		want[workScan] += c
	}
	var chans []<-chan struct{}
	charge := func(w work, c float64) {
		chans = append(chans, m.Charge(w, c))
		want[w] += c
	}
	busyTime := 0.0
	for i := 0; i < 1000; i++ {
		switch i % 7 {
		case 0:
			charge(workPoll, 0.003*float64(i%5+1))
		case 3:
			charge(workReject, 0.0004)
		case 5:
			if i < 100 {
				charge(workBatchStatus, 0.2)
			}
		}
		m.Advance(step)
		_, busy, _ := m.Load()
		if busy < 0 || busy > cores+1e-9 {
			t.Fatalf("busy cores after step %d = %v, want 0..%d", i, busy, cores)
		}
		busyTime += busy * step.Seconds()
		if i > 100 && completed == len(costs) && m.QueueLen() == 0 {
			break
		}
	}
	m.Advance(step) // pays the last charges
	_, busy, spent := m.Load()
	busyTime += busy * step.Seconds()
	if completed != len(costs) {
		t.Fatalf("scans completed = %d, want %d", completed, len(costs))
	}
	for i, ch := range chans {
		if !modelPaid(ch) {
			t.Errorf("charge %d paid = false, want true", i)
		}
	}
	for w := work(0); w < numWork; w++ {
		if !modelNear(spent[w], want[w]) {
			t.Errorf("spent[%v] = %v, want %v", w, spent[w], want[w])
		}
	}
	if !modelNear(busyTime, modelSpentTotal(spent)) {
		t.Errorf("Σ busy × step = %v core-s, want the spent total %v", busyTime, modelSpentTotal(spent))
	}
}

// TestModelOnDoneUnlocked checks that the completion hook runs outside the model's
// lock, so that it may read the model (the emulator's hook does).
func TestModelOnDoneUnlocked(t *testing.T) {
	var m *model
	var got []string
	m = newModel(1, func(j *job) {
		done, _, _ := m.Progress(j)
		got = append(got, fmt.Sprintf("%v %v %d", m.Now(), done, m.QueueLen()))
	})
	m.Enqueue(0.1, nil)
	m.Enqueue(0.1, nil)
	advanced := make(chan struct{})
	go func() {
		defer close(advanced)
		m.Advance(100 * time.Millisecond)
	}()
	select {
	case <-advanced:
	case <-time.After(10 * time.Second):
		t.Fatal("Advance with a hook that reads the model did not return: the hook runs under the lock")
	}
	if want := []string{"100ms 1 1"}; !slices.Equal(got, want) {
		t.Errorf("hook saw (Now, progress, QueueLen) = %q, want %q", got, want)
	}
}

// modelSeedRun is one replay of the seed's workload on the model alone.
type modelSeedRun struct {
	duration         time.Duration
	served, rejected int
	spent            [numWork]float64
}

// modelReplaySeed replays the seed's test steps on a model in steps of 100 ms of
// virtual time: turns of 10 submissions of objects objects a second until files are
// submitted and, when poll is true, every 5 s a poll of every file whose complete
// result the pollers do not have yet (and whose last poll was answered). A poll costs
// what api.result charges: PollCostBase + entries × PollCostEntry, entries = objects
// scanned (at least 1) × engines; over Core's own limit (limit > 0, in virtual time)
// it costs RejectCost instead.
func modelReplaySeed(t *testing.T, cfg Config, files, objects int, poll bool, limit float64) modelSeedRun {
	t.Helper()
	const step = 100 * time.Millisecond
	type file struct {
		j              *job
		complete       bool // the scan ended
		learned        bool // a poller got the complete result
		answer         <-chan struct{}
		answerComplete bool
	}
	var fs []*file
	completed := 0
	m := newModel(cfg.Cores, func(j *job) {
		j.payload.(*file).complete = true
		completed++
	})
	var lim *rate.Limiter
	if limit > 0 {
		lim = rate.NewLimiter(rate.Limit(limit), max(1, int(math.Ceil(limit))))
	}
	epoch := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cost := float64(objects) * cfg.ScanCostObject.Seconds()
	var out modelSeedRun
	for i := 0; ; i++ {
		now := time.Duration(i) * step
		if now%time.Second == 0 {
			for range min(10, files-len(fs)) {
				f := &file{}
				f.j = m.Enqueue(cost, f)
				fs = append(fs, f)
			}
		}
		if poll && now > 0 && now%(5*time.Second) == 0 {
			for _, f := range fs {
				if f.answer != nil {
					if !modelPaid(f.answer) {
						continue // still waiting for its answer
					}
					f.learned = f.learned || f.answerComplete
					f.answer = nil
				}
				if f.learned {
					continue
				}
				if lim != nil && !lim.AllowN(epoch.Add(m.Now()), 1) {
					f.answer, f.answerComplete = m.Charge(workReject, cfg.RejectCost.Seconds()), false
					out.rejected++
					continue
				}
				done, _, _ := m.Progress(f.j)
				scanned := int(done * float64(objects))
				if f.complete {
					scanned = objects
				}
				entries := max(1, scanned) * len(cfg.Engines)
				c := cfg.PollCostBase + time.Duration(entries)*cfg.PollCostEntry
				f.answer, f.answerComplete = m.Charge(workPoll, c.Seconds()), f.complete
				out.served++
			}
		}
		m.Advance(step)
		if len(fs) == files && completed == files {
			out.duration = m.Now()
			break
		}
		if i > 1_000_000 {
			t.Fatalf("the workload did not complete in %v virtual", now)
		}
	}
	_, _, out.spent = m.Load()
	return out
}

// TestModelPollingSlowsScanning is the seed's mechanism on the model alone, with the
// seed's 65 objects a submission: answering polls at will stretches the workload,
// Core's own limit of 1 fetch a second brings its duration back.
func TestModelPollingSlowsScanning(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PollCostBase = 100 * time.Millisecond // see TestPollingSlowsScanning
	const files, objects = 200, 65

	none := modelReplaySeed(t, cfg, files, objects, false, 0)
	polled := modelReplaySeed(t, cfg, files, objects, true, 0)
	capped := modelReplaySeed(t, cfg, files, objects, true, 1)
	t.Logf("no polls: %v; polls every 5 s: %v (%d polls, %.1f core-s); limit 1/s: %v (%d served, %d rejected, %.3f core-s)",
		none.duration, polled.duration, polled.served, polled.spent[workPoll],
		capped.duration, capped.served, capped.rejected, capped.spent[workReject])

	if wantScan := files * objects * cfg.ScanCostObject.Seconds(); !modelNear(none.spent[workScan], wantScan) || !modelNear(polled.spent[workScan], wantScan) {
		t.Errorf("spent[scan] = %v and %v, want %v in both runs", none.spent[workScan], polled.spent[workScan], wantScan)
	}
	if min := time.Duration(float64(none.duration) * 1.2); polled.duration < min {
		t.Errorf("duration with polls answered at will = %v, want at least %v (+20%% over %v)", polled.duration, min, none.duration)
	}
	if d := math.Abs(float64(capped.duration-none.duration)) / float64(none.duration); d > 0.10 {
		t.Errorf("duration under Core's limit of 1/s = %v, want within 10%% of %v (off by %.1f%%)", capped.duration, none.duration, 100*d)
	}
	if total := capped.served + capped.rejected; capped.rejected < total*9/10 {
		t.Errorf("polls under Core's limit of 1/s: %d rejected of %d, want at least 90%%", capped.rejected, total)
	}
	if want := float64(capped.rejected) * cfg.RejectCost.Seconds(); !modelNear(capped.spent[workReject], want) {
		t.Errorf("spent[reject] = %v, want %d × %v = %v", capped.spent[workReject], capped.rejected, cfg.RejectCost, want)
	}
}
