package limiter

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// These tests are inside the package: they sweep a share at an instant of their
// choosing (clientCounter.sweep) instead of waiting for its timer.

func newBucketT(t testing.TB, l Limit, now func() time.Time, opts ...Option) *Bucket {
	t.Helper()
	b, err := NewBucket(l, now, opts...)
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

// timerPending reports whether the share of b holds a sweep timer.
func timerPending(b *Bucket) bool {
	b.clients.mu.Lock()
	defer b.clients.mu.Unlock()
	return b.clients.timer != nil
}

// TestClientCounterWindows checks the counts the counter gives httprate's sliding window
// as windows pass: the current window's, the previous window's, nothing older.
func TestClientCounterWindows(t *testing.T) {
	const w = time.Minute
	w0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(n int) time.Time { return w0.Add(time.Duration(n) * w) }
	type inc struct{ window, n int }
	tests := []struct {
		name             string
		incs             []inc
		get              int // window of the Get
		wantCur, wantPrv int
	}{
		{"nothing counted", nil, 0, 0, 0},
		{"same window", []inc{{0, 3}}, 0, 3, 0},
		{"next window sees it as previous", []inc{{0, 3}}, 1, 0, 3},
		{"two windows later it is gone", []inc{{0, 3}}, 2, 0, 0},
		{"rolled by an increment", []inc{{0, 3}, {1, 2}}, 1, 2, 3},
		{"rolled twice", []inc{{0, 3}, {1, 2}, {2, 1}}, 2, 1, 2},
		{"reset after a gap", []inc{{0, 3}, {2, 1}}, 2, 1, 0},
		{"previous of a reset", []inc{{0, 3}, {2, 1}}, 3, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClientCounter(w, 10, slog.New(slog.DiscardHandler))
			defer c.sweep(at(100)) // frees the key and stops the timer
			for _, i := range tt.incs {
				if err := c.IncrementBy("k", at(i.window), i.n); err != nil {
					t.Fatalf("IncrementBy(k, w%d, %d) = %v, want nil", i.window, i.n, err)
				}
			}
			cur, prev, err := c.Get("k", at(tt.get), at(tt.get-1))
			if cur != tt.wantCur || prev != tt.wantPrv || err != nil {
				t.Errorf("Get(k, w%d) = %d, %d, %v; want %d, %d, nil", tt.get, cur, prev, err, tt.wantCur, tt.wantPrv)
			}
			if cur, prev, _ := c.Get("other", at(tt.get), at(tt.get-1)); cur != 0 || prev != 0 {
				t.Errorf("Get(other, w%d) = %d, %d; want 0, 0", tt.get, cur, prev)
			}
		})
	}
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
	b := newBucketT(t, Limit{ClientLimit: 5, ClientWindow: window}, nil, WithClientKeysMax(2*keys))
	ctx := context.Background()
	r := httptest.NewRequest("GET", "/file/abc", nil)
	base := heap()
	buf := []byte("apikey-")
	for i := range keys {
		key := string(strconv.AppendInt(buf[:7], int64(i), 10))
		if d := b.Acquire(ctx, r, key); d.Outcome != Allowed {
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
	b.clients.sweep(time.Now())
	if tracked, _ := clientKeys(t, b); tracked != keys {
		t.Errorf("after a sweep within the window, clientKeys() tracked = %d, want %d", tracked, keys)
	}
	// Two windows later every key is idle.
	b.clients.sweep(time.Now().Add(2 * window))
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
		if d := b.Acquire(ctx, r, "again"); d.Outcome != want {
			t.Fatalf("after the sweep, Acquire(again) #%d = %v, want %v", i+1, d.Outcome, want)
		}
	}
	b.clients.sweep(time.Now().Add(2 * window))
}

// TestClientKeysCap checks the bound: keys beyond it pass the per-client check untracked
// and counted, keys within it keep their share, and the route's global bucket still
// decides for every key.
func TestClientKeysCap(t *testing.T) {
	const window = time.Hour
	ctx := context.Background()
	r := httptest.NewRequest("GET", "/file/abc", nil)
	later := func() time.Time { return time.Now().Add(2 * window) }

	t.Run("beyond the bound the share is skipped", func(t *testing.T) {
		const max, keys = 10, 25
		b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, nil, WithClientKeysMax(max))
		defer b.clients.sweep(later())
		for i := range keys {
			key := "k" + strconv.Itoa(i)
			want := []Outcome{Allowed, RejectedClient}
			if i >= max {
				want = []Outcome{Allowed, Allowed}
			}
			for j, w := range want {
				if d := b.Acquire(ctx, r, key); d.Outcome != w {
					t.Fatalf("Acquire(%s) #%d = %v, want %v", key, j+1, d.Outcome, w)
				}
			}
		}
		tracked, untracked := clientKeys(t, b)
		if tracked != max || untracked != 2*(keys-max) {
			t.Errorf("clientKeys() = %d, %d; want %d, %d", tracked, untracked, max, 2*(keys-max))
		}
		// Freed keys make room: a new key gets its share again.
		b.clients.sweep(later())
		if d := b.Acquire(ctx, r, "new"); d.Outcome != Allowed {
			t.Fatalf("after the sweep, Acquire(new) #1 = %v, want allowed", d.Outcome)
		}
		if d := b.Acquire(ctx, r, "new"); d.Outcome != RejectedClient {
			t.Fatalf("after the sweep, Acquire(new) #2 = %v, want rejected_client (tracked again)", d.Outcome)
		}
	})

	t.Run("the global bucket still applies", func(t *testing.T) {
		frozen := func() time.Time { return time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC) }
		b := newBucketT(t, Limit{Rate: 1, Burst: 3, ClientLimit: 1, ClientWindow: window}, frozen, WithClientKeysMax(1))
		defer b.clients.sweep(later())
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
			if d := b.Acquire(ctx, r, s.key); d.Outcome != s.want {
				t.Fatalf("step %d: Acquire(%s) = %v, want %v", i+1, s.key, d.Outcome, s.want)
			}
		}
	})

	t.Run("concurrent keys and sweeps", func(t *testing.T) {
		const max, goroutines, keys = 300, 8, 2000
		b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, nil, WithClientKeysMax(max))
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range keys {
					if d := b.Acquire(ctx, r, strconv.Itoa(g)+"-"+strconv.Itoa(i)); d.Outcome != Allowed {
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
			b.clients.sweep(later())
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
	s, err := NewSet(map[string]Limit{
		"hash_lookup": {ClientLimit: 2, ClientWindow: window},
		"file_result": {Rate: 10},
	}, nil, WithClientKeysMax(100))
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	b := s.Bucket("hash_lookup")
	defer b.clients.sweep(time.Now().Add(2 * window))
	r := httptest.NewRequest("GET", "/hash/x", nil)
	for i := range 1000 {
		if d := b.Acquire(context.Background(), r, "key-"+strconv.Itoa(i)); d.Outcome != Allowed {
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
	b.clients.sweep(time.Now().Add(2 * window))
	if tracked, _ := clientKeys(t, b); tracked != 0 {
		t.Errorf("after the window passed, clientKeys() tracked = %d, want 0", tracked)
	}
	if _, _, ok := s.Bucket("file_result").clientKeys(); ok {
		t.Errorf("clientKeys() of a bucket without a share: ok = true, want false")
	}
}

// TestClientKeysSweepTimer checks that the keys are freed by the timer, with no
// further request, and that the timer stops once the share is empty: an idle share
// holds no timer (and so no goroutine).
func TestClientKeysSweepTimer(t *testing.T) {
	const window = 20 * time.Millisecond
	b := newBucketT(t, Limit{ClientLimit: 1, ClientWindow: window}, nil)
	b.clients.sweepEvery = window // the production floor is a second
	if timerPending(b) {
		t.Fatalf("new share: timer pending, want none")
	}
	r := httptest.NewRequest("GET", "/file/abc", nil)
	for i := range 100 {
		b.Acquire(context.Background(), r, strconv.Itoa(i))
	}
	if !timerPending(b) {
		t.Fatalf("share with keys: no timer pending, want a sweep scheduled")
	}
	// Waits for the timer, not for a limiter decision; the bound is only a safety net.
	deadline := time.Now().Add(10 * time.Second)
	for {
		tracked, _ := clientKeys(t, b)
		if tracked == 0 && !timerPending(b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the last request: clientKeys() tracked = %d, timer pending %v; want 0, false",
				tracked, timerPending(b))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientKeysWarning checks that requests left untracked are logged once per sweep,
// with the route and how many, and not again without new ones.
func TestClientKeysWarning(t *testing.T) {
	const window = time.Hour
	var buf bytes.Buffer
	var mu sync.Mutex // the handler writes from the caller's goroutine; guards buf
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil))
	s, err := NewSet(map[string]Limit{"batch_status": {ClientLimit: 1, ClientWindow: window}}, nil,
		WithClientKeysMax(1), WithLogger(log))
	if err != nil {
		t.Fatalf("NewSet() = %v, want no error", err)
	}
	b := s.Bucket("batch_status")
	defer b.clients.sweep(time.Now().Add(2 * window))
	r := httptest.NewRequest("GET", "/file/batch/1", nil)
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
		b.Acquire(context.Background(), r, key)
	}
	if got := records(); len(got) != 0 {
		t.Errorf("before a sweep: %d log records, want 0 (logged by the sweep only)", len(got))
	}
	now := time.Now()
	b.clients.sweep(now)
	b.clients.sweep(now) // nothing new: no second record
	got := records()
	if len(got) != 1 {
		t.Fatalf("after two sweeps: %d log records %+v, want 1", len(got), got)
	}
	if rec := got[0]; rec.Level != "WARN" || rec.Route != "batch_status" || rec.Untracked != 3 || rec.Max != 1 {
		t.Errorf("log record = %+v, want WARN, route batch_status, untracked_requests 3, client_keys_max 1", rec)
	}
	b.Acquire(context.Background(), r, "e")
	b.clients.sweep(now)
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
