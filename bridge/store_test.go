package bridge

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestNewMemoryStoreErrors(t *testing.T) {
	tests := []struct {
		max     int64
		ttl     time.Duration
		wantErr string
	}{
		{0, time.Hour, "maximum size"},
		{-1, time.Hour, "maximum size"},
		{1 << 20, 0, "time to live"},
		{1 << 20, -time.Second, "time to live"},
	}
	for _, tc := range tests {
		s, err := NewMemoryStore(tc.max, tc.ttl)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			if s != nil {
				s.Close()
			}
			t.Errorf("NewMemoryStore(%d, %v) = %v, want an error about the %s", tc.max, tc.ttl, err, tc.wantErr)
		}
	}
}

func TestMemoryStore(t *testing.T) {
	s, err := NewMemoryStore(1<<20, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.Get("a"); ok {
		t.Errorf("Get(a) on an empty store found something")
	}
	want := Result{Body: finalResult("a"), ContentType: "application/json", Owner: alice}
	s.Put("a", want)
	got, ok := s.Get("a")
	if !ok || string(got.Body) != string(want.Body) || got.ContentType != want.ContentType || got.Owner != want.Owner {
		t.Errorf("Get(a) = %+v, %v, want %+v", got, ok, want)
	}
	if n := s.Len(); n != 1 {
		t.Errorf("Len() = %d, want 1", n)
	}
	s.c.CleanUp() // Bytes follows otter's maintenance
	wantBytes := int64(len(want.Body) + len("a") + len(want.ContentType) + entryOverhead)
	if n := s.Bytes(); n != wantBytes {
		t.Errorf("Bytes() = %d, want %d", n, wantBytes)
	}
	// Replaced, not added.
	s.Put("a", Result{Body: infectedResult("a"), Owner: bob})
	if got, _ := s.Get("a"); got.Owner != bob || s.Len() != 1 {
		t.Errorf("after a second Put, Get(a) owner %x and Len() %d, want bob's and 1", got.Owner[:4], s.Len())
	}
	s.Close()
	s.Close() // twice is fine
	if _, ok := s.Get("a"); !ok {
		t.Errorf("Get(a) after Close found nothing, want the store to still answer")
	}
}

// TestMemoryStoreLarge: a result over a sixteenth of the cap is not kept, and one just
// under it is.
func TestMemoryStoreLarge(t *testing.T) {
	const max = 64 << 10
	s, err := NewMemoryStore(max, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fits := max/16 - entryOverhead - len("fits")
	s.Put("fits", Result{Body: make([]byte, fits)})
	s.Put("bigs", Result{Body: make([]byte, fits+1)})
	if _, ok := s.Get("fits"); !ok {
		t.Errorf("a result of exactly max/16 bytes was not kept")
	}
	if _, ok := s.Get("bigs"); ok {
		t.Errorf("a result over max/16 bytes was kept")
	}
}

func TestMemoryStoreExpiry(t *testing.T) {
	clock := newFakeClock()
	const ttl = time.Hour
	s, err := newMemoryStore(1<<20, ttl, clock)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Put("a", Result{Body: finalResult("a")})
	clock.Add(ttl / 2)
	s.Put("b", Result{Body: finalResult("b")})
	if _, ok := s.Get("a"); !ok {
		t.Fatalf("Get(a) at ttl/2 found nothing")
	}
	clock.Add(ttl/2 - time.Nanosecond)
	if _, ok := s.Get("a"); !ok {
		t.Errorf("Get(a) just before ttl found nothing")
	}
	clock.Add(time.Nanosecond)
	if _, ok := s.Get("a"); ok {
		t.Errorf("Get(a) at ttl found it, want it expired")
	}
	if _, ok := s.Get("b"); !ok {
		t.Errorf("Get(b), put ttl/2 later, found nothing")
	}
	// Expiry after write: putting b again gives it another ttl; reading does not.
	s.Put("b", Result{Body: finalResult("b")})
	clock.Add(ttl - time.Nanosecond)
	if _, ok := s.Get("b"); !ok {
		t.Errorf("Get(b) within ttl of its second Put found nothing")
	}
	clock.Add(time.Nanosecond)
	if _, ok := s.Get("b"); ok {
		t.Errorf("Get(b) at ttl after its last Put found it, want it expired (reads do not extend)")
	}
	// otter removes an expired entry when its timer wheel reaches it, which may take one
	// more turn of the wheel's coarsest bucket than the expiry itself: a clean-up within
	// a time to live after the expiry empties the store.
	for i := 0; ; i++ {
		s.c.CleanUp()
		n, b := s.Len(), s.Bytes()
		if n == 0 && b == 0 {
			break
		}
		if i == 100 {
			t.Fatalf("a time to live after expiry and clean-ups: Len() = %d, Bytes() = %d, want 0, 0", n, b)
		}
		clock.Add(ttl / 100)
	}
}

// TestMemoryStoreRealExpiry checks expiry on the real clock, through otter's own
// goroutine that removes expired entries (and which Close stops, for goleak).
func TestMemoryStoreRealExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for otter's clean-up tick (1 s)")
	}
	// A ttl far above the time between the Put and the Get after it, even on a loaded
	// machine (50 ms was not).
	s, err := NewMemoryStore(1<<20, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Put("a", Result{Body: finalResult("a")})
	if _, ok := s.Get("a"); !ok {
		t.Fatalf("Get(a) at once found nothing")
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Len() = %d 30 s after a 1 s ttl, want the entry removed without a read", s.Len())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, ok := s.Get("a"); ok {
		t.Errorf("Get(a) after the ttl found it")
	}
}

// TestMemoryStoreCap puts 100k results of 1 KiB, about 12 times the cap: the store
// holds at most its cap, and so does the heap.
func TestMemoryStoreCap(t *testing.T) {
	const (
		max     = 8 << 20
		results = 100_000
		size    = 1 << 10
	)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	s, err := NewMemoryStore(max, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	missed := 0
	for i := range results {
		id := fmt.Sprintf("%032x", i)
		body := make([]byte, size) // a body of its own, as each callback's is
		copy(body, id)
		s.Put(id, Result{Body: body, ContentType: "application/json", Owner: alice})
		if _, ok := s.Get(id); !ok {
			missed++ // the client's next poll, right after the callback
		}
		if i%10_000 == 0 && s.Bytes() > max+max/16 {
			t.Fatalf("Bytes() = %d after %d results, want at most the cap %d (and one entry of slack)", s.Bytes(), i+1, max)
		}
	}
	s.c.CleanUp()
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)

	entry := int64(size + 32 + len("application/json") + entryOverhead)
	if b := s.Bytes(); b > max || b < max/2 {
		t.Errorf("Bytes() = %d after %d results, want at most the cap %d and near it", b, results, max)
	}
	if n, want := s.Len(), int(max/entry); n > want || n < want/2 {
		t.Errorf("Len() = %d, want at most %d (cap / entry weight) and near it", n, want)
	}
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d results of %d bytes into a %d-byte store: %d entries, Bytes() %d, heap grown by %d bytes", results, size, max, s.Len(), s.Bytes(), grown)
	if grown > max {
		t.Errorf("heap grew by %d bytes, want at most the store's cap %d", grown, max)
	}
	t.Logf("heap per entry: %d bytes, of which %d not body, key or content type", grown/int64(s.Len()), grown/int64(s.Len())-int64(size+32+len("application/json")))
	// otter admits a newcomer through its window (W-TinyLFU), but when writes come
	// faster than its maintenance runs, as in this burst, newcomers leave the window in
	// bulk and compete with older entries for admission, where a tie goes to the
	// resident: measured 17 in 100k, 532 under the race detector. At a realistic rate
	// of results nearly all are kept; the test only checks that most are.
	t.Logf("%d of %d results not found right after they were put", missed, results)
	if missed > results/10 {
		t.Errorf("%d of %d results were not found right after they were put, want at most 10%%", missed, results)
	}
	runtime.KeepAlive(s)
}

// TestCoarseResolution checks how often a MemoryStore reads the clock: a hundredth of
// its time to live, from 1 ms up to 1 s.
func TestCoarseResolution(t *testing.T) {
	tests := []struct{ ttl, want time.Duration }{
		{24 * time.Hour, time.Second}, // MDPROXY_STORE_TTL's default
		{100 * time.Second, time.Second},
		{50 * time.Second, 500 * time.Millisecond},
		{time.Second, 10 * time.Millisecond},
		{50 * time.Millisecond, time.Millisecond},
		{time.Nanosecond, time.Millisecond},
	}
	for _, tc := range tests {
		if got := coarseResolution(tc.ttl); got != tc.want {
			t.Errorf("coarseResolution(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}

// TestMemoryStoreCoarseClock checks that the store reads a clock that moves on its own
// (the coarse clock's goroutine), not one fixed at creation, and that Close stops that
// goroutine and leaves a store that still answers (goleak, TestMain).
func TestMemoryStoreCoarseClock(t *testing.T) {
	s, err := NewMemoryStore(1<<20, 100*time.Millisecond) // read every millisecond
	if err != nil {
		t.Fatal(err)
	}
	if s.clock == nil {
		t.Fatal("NewMemoryStore made no coarse clock")
	}
	first := s.clock.NowNano()
	deadline := time.Now().Add(5 * time.Second)
	for s.clock.NowNano() == first {
		if time.Now().After(deadline) {
			t.Fatal("the coarse clock did not move in 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Put("a", Result{Body: finalResult("a")})
	s.Close()
	s.Close() // twice is fine
	if _, ok := s.Get("a"); !ok {
		t.Errorf("Get(a) after Close found nothing")
	}
}

// BenchmarkMemoryStoreGet measures a Get of a stored result on the store's own (coarse)
// clock, the store's part of a poll answered from memory.
func BenchmarkMemoryStoreGet(b *testing.B) {
	s, err := NewMemoryStore(64<<20, 24*time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("%032x", i)
		s.Put(ids[i], Result{Body: finalResult(ids[i])})
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, ok := s.Get(ids[i%len(ids)]); !ok {
			b.Fatal("Get found nothing")
		}
		i++
	}
}
