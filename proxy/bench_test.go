package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkHandlerAllow measures a poll on an unlimited route, forwarded to a tiny
// upstream over loopback: routing, metrics, the reverse proxy and one round trip.
func BenchmarkHandlerAllow(b *testing.B) {
	h := benchHandler(b, nil)
	req := httptest.NewRequest(http.MethodGet, "/file/61dffeaa728844adbf49eb090e4ece0e", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status = %d, want 200", rec.Code)
		}
	}
}

// BenchmarkHandlerReject measures the answer to a poll whose bucket is empty: routing,
// the bucket check, metrics and the 503 body. Rejected polls are retried at once by
// clients, so this path must stay cheap.
func BenchmarkHandlerReject(b *testing.B) {
	h, req := rejectHandler(b)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable {
			b.Fatalf("status = %d, want 503", rec.Code)
		}
	}
}

// BenchmarkHandlerRejectParallel is BenchmarkHandlerReject from GOMAXPROCS goroutines:
// the contention on one route's bucket and counters.
func BenchmarkHandlerRejectParallel(b *testing.B) {
	h, req := rejectHandler(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusServiceUnavailable {
				b.Errorf("status = %d, want 503", rec.Code)
				return
			}
		}
	})
}

// BenchmarkHandlerStoreHit measures a poll answered by the bridge from its store: the
// path every poll of a finished scan takes with the bridge on. It must cost no more than
// BenchmarkHandlerReject, the limit answer it replaces for such polls.
func BenchmarkHandlerStoreHit(b *testing.B) {
	h, req := storeHitHandler(b)
	benchAnswer(b, h, req, http.StatusOK)
}

// BenchmarkHandlerRejectLean is BenchmarkHandlerReject through the discardWriter of
// BenchmarkHandlerStoreHit, to compare the two answers the handler gives itself.
func BenchmarkHandlerRejectLean(b *testing.B) {
	h, req := rejectHandler(b)
	benchAnswer(b, h, req, http.StatusServiceUnavailable)
}

// benchAnswer serves req with h once per iteration into a discardWriter and checks the
// status.
func benchAnswer(b *testing.B, h http.Handler, req *http.Request, want int) {
	w := &discardWriter{header: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		w.reset()
		h.ServeHTTP(w, req)
		if w.code != want {
			b.Fatalf("status = %d, want %d", w.code, want)
		}
	}
}
