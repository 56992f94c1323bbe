package limiter_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

// epoch is the first instant of every fake clock.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a clock that moves only when told to. It is safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: epoch} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// mustBucket returns limiter.NewBucket(l, now), failing t on an error.
func mustBucket(t testing.TB, l limiter.Limit, now func() time.Time) *limiter.Bucket {
	t.Helper()
	b, err := limiter.NewBucket(l, now)
	if err != nil {
		t.Fatalf("NewBucket(%+v) = %v, want no error", l, err)
	}
	return b
}

// newRequest is the request handed to Acquire; httprate reads only its context.
func newRequest() *http.Request {
	return httptest.NewRequest(http.MethodGet, "/file/abc", nil)
}

// acquire calls b.Acquire with a background context.
func acquire(b *limiter.Bucket, client string) limiter.Decision {
	return b.Acquire(context.Background(), newRequest(), client)
}

// canceledCtx returns a context that is already done.
func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// near reports whether got is within tol of want.
func near(got, want, tol time.Duration) bool {
	d := got - want
	return d >= -tol && d <= tol
}

// waitQueued waits until b has n requests waiting, failing t after a bound that only a
// broken bucket reaches.
func waitQueued(t *testing.T, b *limiter.Bucket, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.Waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("Waiting() = %d after 10 s, want %d", b.Waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// benchAcquire measures Acquire on b, serially and from parallel goroutines, and fails
// if a decision is not want. client gives the client key of the i-th request.
func benchAcquire(b *testing.B, bucket *limiter.Bucket, want limiter.Outcome, client func(i int) string) {
	b.Helper()
	ctx := context.Background()
	r := newRequest()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if d := bucket.Acquire(ctx, r, client(i)); d.Outcome != want {
				b.Fatalf("Acquire() = %v, want %v", d.Outcome, want)
			}
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1)) * 1_000_000 // each goroutine its own run of keys
			for pb.Next() {
				if d := bucket.Acquire(ctx, r, client(i)); d.Outcome != want {
					b.Errorf("Acquire() = %v, want %v", d.Outcome, want)
					return
				}
				i++
			}
		})
	})
}

func oneClient(int) string { return "client" }

// clientKeys are the client keys the per-client benchmarks cycle through.
var clientKeys = func() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "apikey-" + strconv.Itoa(i)
	}
	return keys
}()

func cycleClients(i int) string { return clientKeys[i%len(clientKeys)] }
