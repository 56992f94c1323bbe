package coresim

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// simMetrics are the emulator's own Prometheus metrics, namespace "coresim", so that a
// benchmark can read Core-side figures. Label values come from fixed sets.
type simMetrics struct {
	submissions      *prometheus.CounterVec // result: accepted, busy
	fetches          *prometheus.CounterVec // kind: result, batch_status; result: served, rejected, not_found
	filesCompleted   prometheus.Counter
	objectsScanned   prometheus.Counter
	callbacks        *prometheus.CounterVec // result: delivered, failed (retries used up)
	callbackAttempts *prometheus.CounterVec // result: ok, error
}

func newSimMetrics(reg prometheus.Registerer, s *Sim) *simMetrics {
	if reg == nil {
		reg = prometheus.NewRegistry() // unexported, so the metrics still work
	}
	f := promauto.With(reg)
	const ns = "coresim"
	m := &simMetrics{
		submissions: f.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "submissions_total",
			Help: "POST /file answers by result: accepted, busy (scan queue full, 503)."}, []string{"result"}),
		fetches: f.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "fetches_total",
			Help: "Result polls and batch status requests by kind and result: served, rejected (Core's own rate limit, 503), not_found."}, []string{"kind", "result"}),
		filesCompleted: f.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "files_completed_total",
			Help: "Submissions whose scan completed."}),
		objectsScanned: f.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "objects_scanned_total",
			Help: "Objects scanned: each submission and each part extracted from it (the benchmark's processed files)."}),
		callbacks: f.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "callbacks_total",
			Help: "Callbacks by outcome: delivered, failed (every retry used up)."}, []string{"result"}),
		callbackAttempts: f.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "callback_attempts_total",
			Help: "Callback delivery attempts by result: ok (2xx), error."}, []string{"result"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "queue_files",
		Help: "Files waiting in the scan queue."}, func() float64 { return float64(s.model.QueueLen()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "scanning_files",
		Help: "Files being scanned."}, func() float64 { n, _, _ := s.model.Load(); return float64(n) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "busy_cores",
		Help: "Virtual cores busy during the last model step."}, func() float64 { _, b, _ := s.model.Load(); return b })
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "virtual_seconds",
		Help: "Virtual time elapsed since the emulator started, in seconds."}, func() float64 { return s.model.Now().Seconds() })
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "cores",
		Help: "Virtual cores of the model."}, func() float64 { return float64(s.cfg.Cores) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "speedup",
		Help: "Virtual seconds per real second."}, func() float64 { return s.cfg.Speedup })
	for w := work(0); w < numWork; w++ {
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "core_seconds_total",
			Help:        "Virtual core-seconds spent, by work: scan, poll, batch_status, reject.",
			ConstLabels: prometheus.Labels{"work": w.String()}},
			func() float64 { _, _, spent := s.model.Load(); return spent[w] })
	}
	return m
}
