package limiter_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/limiter"
)

func BenchmarkAcquireNil(b *testing.B) {
	benchAcquire(b, nil, limiter.Allowed, oneClient)
}

// The benchmarks run on the real clock (nil): they measure a decision, and none waits.

// BenchmarkAcquireAllow is the allow path of the global bucket: a rate so high and a
// burst so large that every request finds a token.
func BenchmarkAcquireAllow(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: limiter.MaxRate, Burst: 1 << 40}, nil)
	benchAcquire(b, bucket, limiter.Allowed, oneClient)
}

// BenchmarkAcquireReject is the reject path: the bucket is empty and refills once in
// 27.8 hours (MinRate).
func BenchmarkAcquireReject(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: limiter.MinRate, Burst: 1}, nil)
	if d := bucket.Acquire(context.Background(), "c"); d.Outcome != limiter.Allowed {
		b.Fatalf("Acquire() emptying the bucket = %v, want allowed", d.Outcome)
	}
	benchAcquire(b, bucket, limiter.Rejected, oneClient)
}

// BenchmarkAcquireClient is the per-client path (a GCRA per key) in front of an allowing
// global bucket, over 1024 client keys whose share is never used up.
func BenchmarkAcquireClient(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{Rate: limiter.MaxRate, Burst: 1 << 40, ClientLimit: math.MaxInt32, ClientWindow: time.Minute}, nil)
	benchAcquire(b, bucket, limiter.Allowed, cycleClients)
}

// BenchmarkAcquireClientReject is the per-client path of a client over its share.
func BenchmarkAcquireClientReject(b *testing.B) {
	bucket := mustBucket(b, limiter.Limit{ClientLimit: 1, ClientWindow: time.Hour}, nil)
	if d := bucket.Acquire(context.Background(), "client"); d.Outcome != limiter.Allowed {
		b.Fatalf("Acquire() using the share = %v, want allowed", d.Outcome)
	}
	benchAcquire(b, bucket, limiter.RejectedClient, oneClient)
}
