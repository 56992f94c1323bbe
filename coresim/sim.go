package coresim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Sim is the emulator: Core's API (Handler) over the resource model, a store of
// scans and batches, Core's own fetch rate limit and callback delivery. Build it with
// New, serve Handler, and Run it. All methods are safe for concurrent use.
type Sim struct {
	cfg   Config
	model *model
	epoch time.Time // wall time of virtual time 0, for timestamps

	mu       sync.Mutex
	scans    map[string]*scan
	byHash   map[string]*scan // md5, sha1 and sha256 of a file to its latest scan
	batches  map[string]*batch
	sessions map[string]bool
	done     []*scan // completed, in order, for retention

	fetch *fetchLimit // Core's own limit, in virtual time; nil when off

	m  *simMetrics
	cb *callbacks
}

// QueueLen returns the files waiting in the scan queue, as GET /stat/nodes gives them
// (total_scan_queue). Safe for concurrent use.
func (s *Sim) QueueLen() int { return s.model.QueueLen() }

// scan is one submission.
type scan struct {
	id          string
	in          *inspection
	name        string
	userAgent   string
	rule        string
	batch       string
	callbackURL string
	metadata    string
	uploaded    time.Duration // virtual
	job         *job

	// Set when the scan ends (under Sim.mu).
	complete bool
	canceled bool
	finished time.Duration // virtual
	hook     *hookStatus
}

// New returns an emulator for cfg, with its metrics registered on reg (nil: none).
func New(cfg Config, reg prometheus.Registerer) (*Sim, error) {
	if err := cfg.validate(nil); err != nil {
		return nil, err
	}
	s := &Sim{
		cfg:      cfg,
		epoch:    time.Now().UTC().Truncate(time.Second),
		scans:    map[string]*scan{},
		byHash:   map[string]*scan{},
		batches:  map[string]*batch{},
		sessions: map[string]bool{},
	}
	s.model = newModel(cfg.Cores, s.scanDone)
	s.model.SetAPIWorkers(cfg.APIWorkers)
	if cfg.FetchLimit > 0 {
		s.fetch = &fetchLimit{lim: rate.NewLimiter(rate.Limit(cfg.FetchLimit), cfg.FetchBurst), wait: cfg.FetchWait}
	}
	s.m = newSimMetrics(reg, s)
	s.cb = newCallbacks(s)
	return s, nil
}

// fetchLimit is Core's own limit on fetches: a token bucket of x/time/rate fed virtual
// instants, where a fetch over the limit may wait for its turn up to wait. It shares no
// code with mdproxy's limiter, the thing the emulator measures. Safe for concurrent use.
type fetchLimit struct {
	mu   sync.Mutex // makes the check and the reservation of ReserveAt one step
	lim  *rate.Limiter
	wait time.Duration // FetchWait, virtual
}

// ReserveAt takes a token for a fetch arriving at the virtual instant now when one is
// free within the wait, and returns how long the fetch must wait for it (0: at once).
// Otherwise it takes nothing and returns ok false. A nil limit allows every fetch.
func (f *fetchLimit) ReserveAt(now time.Time) (delay time.Duration, ok bool) {
	if f == nil {
		return 0, true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if missing := 1 - f.lim.TokensAt(now); missing > 0 {
		if d := time.Duration(missing / float64(f.lim.Limit()) * float64(time.Second)); d > f.wait {
			return d, false
		}
	}
	return f.lim.ReserveN(now, 1).DelayFrom(now), true
}

// Run delivers callbacks until ctx ends and, when drive is true, advances the model
// from the real clock: every Tick, by the real time elapsed × Speedup. With drive
// false virtual time stands still (this package's tests advance it by hand, for exact
// checks). Run returns when ctx ends, after its goroutines have stopped.
func (s *Sim) Run(ctx context.Context, drive bool) {
	var wg sync.WaitGroup
	for range s.cfg.CallbackWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.cb.work(ctx)
		}()
	}
	if drive {
		t := time.NewTicker(s.cfg.Tick)
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				wg.Wait()
				return
			case now := <-t.C:
				dv := time.Duration(float64(now.Sub(last)) * s.cfg.Speedup)
				last = now
				s.advance(dv)
			}
		}
	}
	<-ctx.Done()
	wg.Wait()
}

// advance moves virtual time dv forward: the model serves work, completed scans get
// their results, callbacks fall due, and results past their retention are dropped.
func (s *Sim) advance(dv time.Duration) {
	s.model.Advance(dv)
	now := s.model.Now()
	s.cb.dispatch(now)
	s.expire(now)
}

// coreSeconds converts a cost of the configuration, a virtual duration of one core's
// time, to core-seconds.
func coreSeconds(d time.Duration) float64 { return d.Seconds() }

// scanDone is the model's completion hook.
func (s *Sim) scanDone(j *job) {
	sc := j.payload.(*scan)
	s.mu.Lock()
	sc.complete = true
	sc.finished = j.finished
	s.done = append(s.done, sc)
	hook := sc.callbackURL != ""
	if hook {
		sc.hook = &hookStatus{url: sc.callbackURL}
	}
	s.mu.Unlock()
	s.m.filesCompleted.Inc()
	s.m.objectsScanned.Add(float64(sc.in.Objects()))
	if hook {
		s.cb.schedule(sc, j.finished)
	}
}

// expire drops completed results older than the retention.
func (s *Sim) expire(now time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sc := range s.done {
		if now-sc.finished < s.cfg.Retention {
			break
		}
		delete(s.scans, sc.id)
		for _, h := range []string{sc.in.File.MD5, sc.in.File.SHA1, sc.in.File.SHA256} {
			if s.byHash[h] == sc {
				delete(s.byHash, h)
			}
		}
		n++
	}
	if n > 0 {
		s.done = append(s.done[:0], s.done[n:]...)
	}
}

// scanCost is the virtual core time of scanning every object of in.
func (s *Sim) scanCost(in *inspection) float64 {
	var bytes int64 = in.File.Size
	for _, p := range in.Parts {
		bytes += p.Size
	}
	return float64(in.Objects())*coreSeconds(s.cfg.ScanCostObject) +
		float64(bytes)/(1<<20)*coreSeconds(s.cfg.ScanCostMiB)
}

// wait blocks until the cores have served cost of foreground work w, or ctx ends. It
// reports whether the work was served.
func (s *Sim) wait(ctx context.Context, w work, cost time.Duration) bool {
	select {
	case <-s.model.Charge(w, coreSeconds(cost)):
		return true
	case <-ctx.Done():
		return false
	}
}

// newID returns 32 random hex digits, the shape of Core's data_id and batch_id.
func newID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("coresim: crypto/rand: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// timestamp renders virtual time v as Core renders times (RFC 3339, UTC).
func (s *Sim) timestamp(v time.Duration) string {
	return s.epoch.Add(v).Format(time.RFC3339Nano)
}
