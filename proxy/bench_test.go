package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// benchHandler returns the whole proxy handler in front of a tiny loopback upstream
// that answers 200 "{}", with limits (nil: unlimited). Servers close with b.Cleanup.
func benchHandler(b *testing.B, limits map[string]limiter.Limit) http.Handler {
	b.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "{}")
	}))
	b.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	tr := NewTransport(TransportOptions{})
	b.Cleanup(tr.CloseIdleConnections)
	set, err := limiter.NewSet(limits, nil)
	if err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()), Transport: tr, Limits: set})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

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

// rejectHandler is the proxy with file_result's bucket empty for good: every poll is
// rejected.
func rejectHandler(b *testing.B) (http.Handler, *http.Request) {
	h := benchHandler(b, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}})
	req := httptest.NewRequest(http.MethodGet, "/file/61dffeaa728844adbf49eb090e4ece0e", nil)
	h.ServeHTTP(httptest.NewRecorder(), req) // takes the only token
	return h, req
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
