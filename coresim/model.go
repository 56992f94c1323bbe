package coresim

import (
	"container/heap"
	"container/list"
	"sync"
	"time"
)

// work names what a virtual core spends time on; it is the label of
// coresim_core_seconds_total.
type work int

const (
	workScan        work = iota // scanning an object with every engine
	workPoll                    // answering GET /file/{data_id} or GET /hash/{hash}
	workBatchStatus             // answering GET /file/batch/{batch_id}
	workReject                  // refusing a request over Core's own rate limit
	numWork
)

// String returns the label value of w.
func (w work) String() string {
	return [...]string{"scan", "poll", "batch_status", "reject"}[w]
}

// model is the resource model of the emulator: V virtual cores shared by scanning and
// by answering requests, in virtual time.
//
// Capacity: in a span dv of virtual time the cores supply V × dv core-seconds. Work is
// served in two classes:
//
//   - foreground (answering a poll, a batch status, a rejection): first, in arrival
//     order, but on at most W cores (SetAPIWorkers; V by default), as Core's web
//     server answers with a bounded pool of worker threads;
//   - scanning: what the foreground leaves, shared equally by the files being scanned,
//     at most one core each (a file's objects are scanned one after another), with up to
//     V files in progress; the rest wait in the scan queue, first in first out.
//
// So every core-second spent answering polls is a core-second not spent scanning: the
// mechanism behind the published benchmark, where unlimited polling stretched a
// 26.9-minute workload to 45.2 minutes.
//
// A model advances only when told (Advance); Run drives it from the real clock at the
// configured speed-up. All methods are safe for concurrent use.
type model struct {
	mu      sync.Mutex
	cores   float64
	fgCores float64       // cores the foreground may use, 1..cores
	vnow    time.Duration // virtual time since the model started
	timers  timerHeap     // After's channels, by due time

	fg      list.List // of *charge, in arrival order
	running []*job
	queue   list.List // of *job waiting for a core, first in first out

	spent  [numWork]float64 // virtual core-seconds spent, by work
	busy   float64          // cores busy during the last Advance, 0..V
	onDone func(*job)       // called, without mu, for each job that completes
	done   []*job           // completed during the current Advance
}

// charge is foreground work waiting for its core time.
type charge struct {
	left float64 // virtual core-seconds still owed
	work work
	paid chan struct{}
	// decide, when set, is called (under the model's lock) once the charge is served,
	// with the virtual instant; it names the work the charge's cost counts as.
	decide func(at time.Duration) work
	total  float64
}

// job is one file's scan: the work of all its objects.
type job struct {
	total, left float64 // virtual core-seconds
	queued      time.Duration
	started     time.Duration // virtual time the scan started; -1 while queued
	finished    time.Duration
	elem        *list.Element // in queue while waiting
	canceled    bool
	payload     any
}

// newModel returns a model of cores virtual cores (cores > 0). onDone, if not nil, is
// called once for each job that completes, outside the model's lock.
func newModel(cores int, onDone func(*job)) *model {
	return &model{cores: float64(cores), fgCores: float64(cores), onDone: onDone}
}

// SetAPIWorkers bounds the cores that foreground work may use at once to w (clamped to
// 1..V): Core's web server answers requests with a pool of worker threads, so polls
// queue for a worker rather than taking every core from the scans.
func (m *model) SetAPIWorkers(w int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fgCores = min(m.cores, max(1, float64(w)))
}

// After returns a channel closed once virtual time d has passed (at the end of the
// first Advance that reaches it). It holds no core: it models waiting, e.g. on the
// network. d <= 0 returns a closed channel.
func (m *model) After(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	if d <= 0 {
		close(c)
		return c
	}
	m.mu.Lock()
	heap.Push(&m.timers, timer{due: m.vnow + d, c: c})
	m.mu.Unlock()
	return c
}

// timer is one pending After.
type timer struct {
	due time.Duration
	c   chan struct{}
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// Now returns the virtual time elapsed since the model started.
func (m *model) Now() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.vnow
}

// Enqueue adds a scan of cost virtual core-seconds at the tail of the scan queue and
// returns it.
func (m *model) Enqueue(cost float64, payload any) *job {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := &job{total: cost, left: cost, queued: m.vnow, started: -1, payload: payload}
	j.elem = m.queue.PushBack(j)
	return j
}

// Cancel removes j from the scan queue or from the running set. It reports whether j
// was still pending.
func (m *model) Cancel(j *job) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j.left <= 0 || j.canceled {
		return false
	}
	j.canceled = true
	j.finished = m.vnow
	if j.elem != nil {
		m.queue.Remove(j.elem)
		j.elem = nil
		return true
	}
	for i, r := range m.running {
		if r == j {
			m.running = append(m.running[:i], m.running[i+1:]...)
			break
		}
	}
	return true
}

// Charge books cost virtual core-seconds of foreground work and returns a channel
// closed once the cores have served it.
func (m *model) Charge(w work, cost float64) <-chan struct{} {
	c := &charge{left: cost, work: w, paid: make(chan struct{})}
	if cost <= 0 {
		close(c.paid)
		return c.paid
	}
	m.mu.Lock()
	m.fg.PushBack(c)
	m.mu.Unlock()
	return c.paid
}

// Admit books cost virtual core-seconds of foreground work, a request being received
// and checked by one of Core's web server workers, whose kind is decided when it is
// served: decide gets the virtual instant at which its core time was served (precise
// within a step) and returns the work the cost counts as. decide runs under the
// model's lock: it must not call the model. The channel is closed after decide ran.
func (m *model) Admit(cost float64, decide func(at time.Duration) work) <-chan struct{} {
	c := &charge{left: cost, total: max(0, cost), decide: decide, paid: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cost <= 0 {
		m.spent[decide(m.vnow)] += 0
		close(c.paid)
		return c.paid
	}
	m.fg.PushBack(c)
	return c.paid
}

// Progress returns j's state: the fraction of its work done (0..1), whether it is
// still queued and how many scans are ahead of it in the queue.
func (m *model) Progress(j *job) (done float64, queued bool, ahead int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if j.total > 0 {
		done = 1 - j.left/j.total
	} else {
		done = 1
	}
	if j.elem != nil {
		for e := j.elem.Prev(); e != nil; e = e.Prev() {
			ahead++
		}
		return done, true, ahead
	}
	return done, false, 0
}

// Times returns j's queue time and processing time so far, in virtual time.
func (m *model) Times(j *job) (queue, processing time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	end := m.vnow
	if j.left <= 0 || j.canceled {
		end = j.finished
	}
	if j.started < 0 {
		return end - j.queued, 0
	}
	return j.started - j.queued, end - j.started
}

// QueueLen returns the number of scans waiting for a core.
func (m *model) QueueLen() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.queue.Len()
}

// Load returns the scans in progress, the cores busy during the last step (0..V) and
// the virtual core-seconds spent so far by each kind of work.
func (m *model) Load() (running int, busy float64, spent [numWork]float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.running), m.busy, m.spent
}

// Advance moves the model dv of virtual time forward: it serves foreground charges
// first, then the scans, and completes what finished.
func (m *model) Advance(dv time.Duration) {
	if dv <= 0 {
		return
	}
	m.mu.Lock()
	secs := dv.Seconds()
	capacity := m.cores * secs
	used := 0.0

	// Foreground first, in arrival order, on at most fgCores cores.
	fgCapacity := m.fgCores * secs
	for fgCapacity-used > 0 && m.fg.Len() > 0 {
		c := m.fg.Front().Value.(*charge)
		pay := min(c.left, fgCapacity-used)
		c.left -= pay
		used += pay
		if c.decide == nil {
			m.spent[c.work] += pay
		}
		if c.left <= 1e-12 {
			m.fg.Remove(m.fg.Front())
			if c.decide != nil {
				// The instant within the step at which its last core time was served.
				at := m.vnow + time.Duration(float64(dv)*used/fgCapacity)
				m.spent[c.decide(at)] += c.total
			}
			close(c.paid)
		}
	}

	// Then the scans: fill the free cores from the queue, share what is left.
	for len(m.running) < int(m.cores) && m.queue.Len() > 0 {
		j := m.queue.Remove(m.queue.Front()).(*job)
		j.elem = nil
		j.started = m.vnow
		m.running = append(m.running, j)
	}
	if n := len(m.running); n > 0 && capacity-used > 0 {
		share := min(secs, (capacity-used)/float64(n))
		kept := m.running[:0]
		for _, j := range m.running {
			pay := min(j.left, share)
			j.left -= pay
			used += pay
			m.spent[workScan] += pay
			if j.left <= 1e-12 {
				j.left = 0
				j.finished = m.vnow + dv
				m.done = append(m.done, j)
				continue
			}
			kept = append(kept, j)
		}
		clear(m.running[len(kept):])
		m.running = kept
	}
	m.busy = used / secs
	m.vnow += dv
	for m.timers.Len() > 0 && m.timers[0].due <= m.vnow {
		close(heap.Pop(&m.timers).(timer).c)
	}
	done := m.done
	m.done = nil
	m.mu.Unlock()

	if m.onDone != nil {
		for _, j := range done {
			m.onDone(j)
		}
	}
}
