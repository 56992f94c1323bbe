package limiter_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

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

func BenchmarkAcquireNil(b *testing.B) {
	benchAcquire(b, nil, limiter.Allowed, oneClient)
}

// BenchmarkAcquireAllow is the allow path of the global bucket: a rate so high and a
// burst so large that every request finds a token.
func BenchmarkAcquireAllow(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: 1e12, Burst: 1 << 40}, nil)
	benchAcquire(b, bucket, limiter.Allowed, oneClient)
}

// BenchmarkAcquireReject is the reject path: the bucket is empty and refills once in
// about 30 years.
func BenchmarkAcquireReject(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: 1e-9, Burst: 1}, nil)
	if d := bucket.Acquire(context.Background(), nil, "c"); d.Outcome != limiter.Allowed {
		b.Fatalf("Acquire() emptying the bucket = %v, want allowed", d.Outcome)
	}
	benchAcquire(b, bucket, limiter.Rejected, oneClient)
}

// clientKeys are the client keys the per-client benchmarks cycle through.
var clientKeys = func() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "apikey-" + strconv.Itoa(i)
	}
	return keys
}()

func cycleClients(i int) string { return clientKeys[i%len(clientKeys)] }

// BenchmarkAcquireClient is the per-client path (httprate) in front of an allowing
// global bucket, over 1024 client keys whose share is never used up.
func BenchmarkAcquireClient(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: 1e12, Burst: 1 << 40, ClientLimit: 1 << 40, ClientWindow: time.Minute}, nil)
	benchAcquire(b, bucket, limiter.Allowed, cycleClients)
}

// BenchmarkAcquireClientReject is the per-client path of a client over its share.
func BenchmarkAcquireClientReject(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{ClientLimit: 1, ClientWindow: time.Hour}, nil)
	if d := bucket.Acquire(context.Background(), newRequest(), "client"); d.Outcome != limiter.Allowed {
		b.Fatalf("Acquire() using the share = %v, want allowed", d.Outcome)
	}
	benchAcquire(b, bucket, limiter.RejectedClient, oneClient)
}
