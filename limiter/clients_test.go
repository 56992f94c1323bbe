package limiter

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// These tests are inside the package: they sweep a share at an instant of their
// choosing (clientCounter.sweep), or fire its timer by advancing the fake clock and
// wait for the sweep that it runs (sweepClock).

// epoch is the first instant of every fake clock, the start of an hour.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newBucketT(t testing.TB, l Limit, clock clockwork.Clock, opts ...Option) *Bucket {
	t.Helper()
	b, err := NewBucket(l, clock, opts...)
	if err != nil {
		t.Fatalf("NewBucket(%+v) = %v, want no error", l, err)
	}
	return b
}

// clientKeys returns b.clientKeys() without its ok, failing t when b has no share.
func clientKeys(t testing.TB, b *Bucket) (tracked int, untracked uint64) {
	t.Helper()
	tracked, untracked, ok := b.clientKeys()
	if !ok {
		t.Fatalf("clientKeys() ok = false, want a per-client share")
	}
	return tracked, untracked
}

// bucketOf returns the *Bucket that s holds for route, failing t when it holds none.
func bucketOf(t testing.TB, s *Set, route string) *Bucket {
	t.Helper()
	b, ok := s.Limiter(route).(*Bucket)
	if !ok {
		t.Fatalf("Set.Limiter(%s) = %T, want a *Bucket", route, s.Limiter(route))
	}
	return b
}

// sweepAt runs the share's sweep at the instant t of its clock.
func (c *clientShare) sweepAt(t time.Time) { c.sweep(int64(t.Sub(c.base))) }

// timerPending reports whether the share of b holds a sweep timer.
func timerPending(b *Bucket) bool {
	b.clients.mu.Lock()
	defer b.clients.mu.Unlock()
	return b.clients.timer != nil
}

// TestClientKeysMemoryFreed is issue 9's eighth case: one million distinct keys on a
// share, then the window passes: once the sweep ran, the keys are gone and the heap is
// back near its baseline, without a further request.
func TestClientKeysMemoryFreed(t *testing.T) {
	if testing.Short() {
		t.Skip("a million keys")
	}
	const keys = 1_000_000
	const window = time.Hour // the timer never fires during the test: the sweep is explicit
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	clock := clockwork.NewFakeClockAt(epoch)
	b := newBucketT(t, Limit{ClientLimit: 5, ClientWindow: window}, clock, WithClientKeysMax(2*keys))
	ctx := context.Background()
	base := heap()
	buf := []byte("apikey-")
	for i := range keys {
		key := string(strconv.AppendInt(buf[:7], int64(i), 10))
		if d := b.Acquire(ctx, key); d.Outcome != Allowed {
			t.Fatalf("Acquire(key %d) = %v, want allowed", i, d.Outcome)
		}
	}
	full := heap()
	if tracked, _ := clientKeys(t, b); tracked != keys {
		t.Fatalf("clientKeys() tracked = %d, want %d", tracked, keys)
	}
	grown := int64(full) - int64(base)
	t.Logf("heap: baseline %d B, with %d keys %+d B (%.1f B a key)", base, keys, grown, float64(grown)/keys)
	if grown < keys*16 {
		t.Fatalf("heap grew by %d B for %d keys, want at least 16 B a key (is the heap measured?)", grown, keys)
	}

	// Still within two windows: nothing is idle, nothing is freed.
	b.clients.sweepAt(clock.Now())
	if tracked, _ := clientKeys(t, b); tracked != keys {
		t.Errorf("after a sweep within the window, clientKeys() tracked = %d, want %d", tracked, keys)
	}
	// Two windows later every key is idle.
	b.clients.sweepAt(clock.Now().Add(2 * window))
	after := heap()
	if tracked, _ := clientKeys(t, b); tracked != 0 {
		t.Errorf("after the window passed, clientKeys() tracked = %d, want 0", tracked)
	}
	if timerPending(b) {
		t.Errorf("after every key was freed, the sweep timer is pending, want none")
	}
	t.Logf("heap after the sweep: %+d B from the baseline", int64(after)-int64(base))
	if limit := uint64(2 << 20); after > base+limit {
		t.Errorf("heap after the sweep = baseline %+d B, want at most %d B above it (of %d B with the keys)",
			int64(after)-int64(base), limit, grown)
	}
	// The share still works after the sweep.
	for i := range 6 {
		want := Allowed
		if i == 5 {
			want = RejectedClient
		}
		if d := b.Acquire(ctx, "again"); d.Outcome != want {
			t.Fatalf("after the sweep, Acquire(again) #%d = %v, want %v", i+1, d.Outcome, want)
		}
	}
	b.clients.sweepAt(clock.Now().Add(2 * window))
}

// TestClientKeysCap checks the bound: keys beyond it pass the per-client check untracked
// and counted, keys within it keep their share, and the route's global bucket still
// decides for every key.
func TestClientKeysCap(t *testing.T) {
	const window = time.Hour
	ctx := context.Background()
	clock := clockwork.NewFakeClockAt(epoch) // it never moves: the sweeps say when they run
	later := func() time.Time { return clock.Now().Add(2 * window) }

	t.Run("beyond the bound the share is skipped", func(t *testing.T) {
		const max, keys = 10, 25
		b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, clock, WithClientKeysMax(max))
		defer b.clients.sweepAt(later())
		for i := range keys {
			key := "k" + strconv.Itoa(i)
			want := []Outcome{Allowed, RejectedClient}
			if i >= max {
				want = []Outcome{Allowed, Allowed}
			}
			for j, w := range want {
				if d := b.Acquire(ctx, key); d.Outcome != w {
					t.Fatalf("Acquire(%s) #%d = %v, want %v", key, j+1, d.Outcome, w)
				}
			}
		}
		tracked, untracked := clientKeys(t, b)
		if tracked != max || untracked != 2*(keys-max) {
			t.Errorf("clientKeys() = %d, %d; want %d, %d", tracked, untracked, max, 2*(keys-max))
		}
		// Freed keys make room: a new key gets its share again.
		b.clients.sweepAt(later())
		if d := b.Acquire(ctx, "new"); d.Outcome != Allowed {
			t.Fatalf("after the sweep, Acquire(new) #1 = %v, want allowed", d.Outcome)
		}
		if d := b.Acquire(ctx, "new"); d.Outcome != RejectedClient {
			t.Fatalf("after the sweep, Acquire(new) #2 = %v, want rejected_client (tracked again)", d.Outcome)
		}
	})

	t.Run("the global bucket still applies", func(t *testing.T) {
		b := newBucketT(t, Limit{Rate: 1, Burst: 3, ClientLimit: 1, ClientWindow: window}, clock, WithClientKeysMax(1))
		defer b.clients.sweepAt(later())
		steps := []struct {
			key  string
			want Outcome
		}{
			{"a", Allowed},        // tracked, first global token
			{"a", RejectedClient}, // over its share
			{"b", Allowed},        // untracked, second token
			{"b", Allowed},        // untracked, third token
			{"c", Rejected},       // the global bucket is empty
		}
		for i, s := range steps {
			if d := b.Acquire(ctx, s.key); d.Outcome != s.want {
				t.Fatalf("step %d: Acquire(%s) = %v, want %v", i+1, s.key, d.Outcome, s.want)
			}
		}
	})

	t.Run("concurrent keys and sweeps", func(t *testing.T) {
		const max, goroutines, keys = 300, 8, 2000
		b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, clock, WithClientKeysMax(max))
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range keys {
					if d := b.Acquire(ctx, strconv.Itoa(g)+"-"+strconv.Itoa(i)); d.Outcome != Allowed {
						t.Errorf("Acquire(%d-%d) = %v, want allowed (a new key)", g, i, d.Outcome)
						return
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		for sweeping := true; sweeping; {
			select {
			case <-done:
				sweeping = false
			default:
			}
			if tracked, _ := clientKeys(t, b); tracked > max {
				t.Fatalf("clientKeys() tracked = %d, want at most %d", tracked, max)
			}
			b.clients.sweepAt(later())
		}
		if tracked, _ := clientKeys(t, b); tracked != 0 {
			t.Errorf("after the last sweep, clientKeys() tracked = %d, want 0", tracked)
		}
	})
}

// TestClientLimitWithoutRate checks a route with a per-client share and no rate, the
// one that grew without bound: its keys are bounded and freed too, and the Set reports
// them by route.
func TestClientLimitWithoutRate(t *testing.T) {
	const window = time.Minute
	clock := clockwork.NewFakeClockAt(epoch)
	s, err := NewSet(map[string]Limit{
		"hash_lookup": {ClientLimit: 2, ClientWindow: window},
		"file_result": {Rate: 10},
	}, clock, WithClientKeysMax(100))
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	b := bucketOf(t, s, "hash_lookup")
	defer b.clients.sweepAt(clock.Now().Add(2 * window))
	for i := range 1000 {
		if d := b.Acquire(context.Background(), "key-"+strconv.Itoa(i)); d.Outcome != Allowed {
			t.Fatalf("Acquire(key-%d) = %v, want allowed", i, d.Outcome)
		}
	}
	got := map[string][2]uint64{}
	s.ClientKeys(func(route string, tracked int, untracked uint64) {
		got[route] = [2]uint64{uint64(tracked), untracked}
	})
	if len(got) != 1 || got["hash_lookup"] != [2]uint64{100, 900} {
		t.Errorf("Set.ClientKeys() reported %v, want only hash_lookup: 100 tracked, 900 untracked", got)
	}
	b.clients.sweepAt(clock.Now().Add(2 * window))
	if tracked, _ := clientKeys(t, b); tracked != 0 {
		t.Errorf("after the window passed, clientKeys() tracked = %d, want 0", tracked)
	}
	if _, _, ok := bucketOf(t, s, "file_result").clientKeys(); ok {
		t.Errorf("clientKeys() of a bucket without a share: ok = true, want false")
	}
}

// sweepClock is a fake clock whose AfterFunc functions, the sweeps of the shares on
// it, report on swept once they have run: Advance fires a sweep's timer and the sweep
// runs in a goroutine of its own, which a test waits for before it looks.
type sweepClock struct {
	*clockwork.FakeClock
	swept chan struct{}
}

func newSweepClock() *sweepClock {
	return &sweepClock{FakeClock: clockwork.NewFakeClockAt(epoch), swept: make(chan struct{}, 16)}
}

func (c *sweepClock) AfterFunc(d time.Duration, f func()) clockwork.Timer {
	return c.FakeClock.AfterFunc(d, func() {
		f()
		c.swept <- struct{}{}
	})
}

// advanceTo moves the clock to epoch+at. When sweep is true it waits for the sweep
// that the move fires, failing t if none has run after a bound that only a broken share
// reaches; a sweep that runs when sweep is false fails t too.
func (c *sweepClock) advanceTo(t *testing.T, at time.Duration, sweep bool) {
	t.Helper()
	c.Advance(at - c.Since(epoch))
	if !sweep {
		select {
		case <-c.swept:
			t.Fatalf("at +%v: a sweep ran, want none before its period", at)
		default:
		}
		return
	}
	select {
	case <-c.swept:
	case <-time.After(10 * time.Second):
		t.Fatalf("at +%v: no sweep ran, want one", at)
	}
}

// timers reports whether c holds at least n timers, without waiting.
func (c *sweepClock) timers(n int) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return c.BlockUntilContext(ctx, n) == nil
}

// TestClientKeysSweepTimer checks that the keys are freed by the timer of the share's
// clock, with no further request, once their bucket is full again (here a window after
// their last request: a share of 1 a second), and that the timer stops once the share
// is empty: an idle share holds no timer (and so no goroutine). The sweeps run when
// Advance reaches their timer.
func TestClientKeysSweepTimer(t *testing.T) {
	const window = time.Second // the sweep runs every window, at most once a second
	clock := newSweepClock()
	b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, clock)
	if timerPending(b) || clock.timers(1) {
		t.Fatalf("new share: timer pending %v, on the clock %v; want none", timerPending(b), clock.timers(1))
	}
	ctx := context.Background()
	for i := range 100 {
		if d := b.Acquire(ctx, strconv.Itoa(i)); d.Outcome != Allowed {
			t.Fatalf("Acquire(%d) = %v, want allowed", i, d.Outcome)
		}
	}
	if !timerPending(b) || !clock.timers(1) || clock.timers(2) {
		t.Fatalf("share with keys: timer pending %v, one on the clock %v, two %v; want one sweep scheduled",
			timerPending(b), clock.timers(1), clock.timers(2))
	}
	steps := []struct {
		at      time.Duration
		sweep   bool
		request string // a request of this key after the sweep, if any
		tracked int    // keys tracked after the sweep (and the request)
	}{
		{500 * time.Millisecond, false, "late", 101}, // late's bucket is full again at 1.5 s
		{999 * time.Millisecond, false, "", 101},     // no sweep before its period
		{time.Second, true, "", 1},                   // the first 100 are full again: freed
		{1999 * time.Millisecond, false, "", 1},
		{2 * time.Second, true, "", 0}, // late is full too: the share is empty
	}
	for _, s := range steps {
		clock.advanceTo(t, s.at, s.sweep)
		if s.request != "" {
			if d := b.Acquire(ctx, s.request); d.Outcome != Allowed {
				t.Fatalf("at +%v: Acquire(%s) = %v, want allowed", s.at, s.request, d.Outcome)
			}
		}
		if tracked, _ := clientKeys(t, b); tracked != s.tracked {
			t.Errorf("at +%v: clientKeys() tracked = %d, want %d", s.at, tracked, s.tracked)
		}
		if want := s.tracked > 0; timerPending(b) != want || clock.timers(1) != want {
			t.Errorf("at +%v: timer pending %v, on the clock %v; want %v with %d keys", s.at, timerPending(b), clock.timers(1), want, s.tracked)
		}
	}
	// The share works on after it emptied, and schedules a sweep again.
	for i, want := range []Outcome{Allowed, RejectedClient} {
		if d := b.Acquire(ctx, "0"); d.Outcome != want {
			t.Errorf("after the share emptied, Acquire(0) #%d = %v, want %v", i+1, d.Outcome, want)
		}
	}
	if !timerPending(b) || !clock.timers(1) {
		t.Errorf("after a new key: timer pending %v, on the clock %v; want a sweep scheduled", timerPending(b), clock.timers(1))
	}
	clock.advanceTo(t, 3*time.Second, true)
	if tracked, _ := clientKeys(t, b); tracked != 0 || timerPending(b) {
		t.Errorf("a window later: clientKeys() tracked = %d, timer pending %v; want 0, false", tracked, timerPending(b))
	}
}

// TestClientKeysWarning checks that requests left untracked are logged once per sweep,
// with the route and how many, and not again without new ones.
func TestClientKeysWarning(t *testing.T) {
	const window = time.Hour
	var buf bytes.Buffer
	var mu sync.Mutex // the handler writes from the caller's goroutine; guards buf
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil))
	clock := clockwork.NewFakeClockAt(epoch)
	s, err := NewSet(map[string]Limit{"batch_status": {ClientLimit: 1, ClientWindow: window}}, clock,
		WithClientKeysMax(1), WithLogger(log))
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	b := bucketOf(t, s, "batch_status")
	defer b.clients.sweepAt(clock.Now().Add(2 * window))
	type record struct {
		Level, Msg, Route string
		Untracked         int `json:"untracked_requests"`
		Max               int `json:"client_keys_max"`
	}
	records := func() []record {
		mu.Lock()
		defer mu.Unlock()
		var out []record
		for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatalf("log line %q: %v", line, err)
			}
			out = append(out, rec)
		}
		return out
	}
	for _, key := range []string{"a", "b", "c", "d"} { // b, c and d are beyond the bound
		b.Acquire(context.Background(), key)
	}
	if got := records(); len(got) != 0 {
		t.Errorf("before a sweep: %d log records, want 0 (logged by the sweep only)", len(got))
	}
	now := clock.Now()
	b.clients.sweepAt(now)
	b.clients.sweepAt(now) // nothing new: no second record
	got := records()
	if len(got) != 1 {
		t.Fatalf("after two sweeps: %d log records %+v, want 1", len(got), got)
	}
	if rec := got[0]; rec.Level != "WARN" || rec.Route != "batch_status" || rec.Untracked != 3 || rec.Max != 1 {
		t.Errorf("log record = %+v, want WARN, route batch_status, untracked_requests 3, client_keys_max 1", rec)
	}
	b.Acquire(context.Background(), "e")
	b.clients.sweepAt(now)
	if got := records(); len(got) != 2 || got[1].Untracked != 1 {
		t.Errorf("after one more untracked request and a sweep: records %+v, want a second with untracked_requests 1", got)
	}
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestShareOfReplicas: in fallback each of N replicas takes rate/N, burst/N (at least
// 1), and a client's share over a window N times as long, so that the replicas
// together hold a client to its limit on average even when the limit is below N.
func TestShareOfReplicas(t *testing.T) {
	l := Limit{Rate: 100, Burst: 100, ClientLimit: 1, ClientWindow: 2 * time.Second}
	got := l.share(3)
	want := Limit{Rate: 100.0 / 3, Burst: 33, ClientLimit: 1, ClientWindow: 6 * time.Second}
	if got != want {
		t.Errorf("share(3) of %+v = %+v, want %+v", l, got, want)
	}
	if got := (Limit{Rate: 1, Burst: 2, ClientLimit: 5}).share(4); got.Burst != 1 || got.ClientLimit != 5 || got.ClientWindow != 4*time.Second {
		t.Errorf("share(4) = %+v, want burst 1 and 5 per 4s (the window of 0, 1s, times 4)", got)
	}
	if got := l.share(1); got != l {
		t.Errorf("share(1) = %+v, want the limit itself", got)
	}
}
