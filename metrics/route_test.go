package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRouteLabelPolicy: a route exports no series until used; methods outside Methods
// count as OTHER; the bridge's miss and overdue count as core; a route never limited
// has no limit gauges, and one whose limit is removed reads 0.
func TestRouteLabelPolicy(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	r := m.Route("file_result").WithBridgePolls(m)
	if n := testutil.CollectAndCount(m.Requests); n != 0 {
		t.Fatalf("requests series before any use = %d, want 0", n)
	}
	r.Answered("PROPFIND", 200, 10, time.Millisecond)
	r.Answered("GET", 503, 67, time.Millisecond)
	r.Decided("rejected")
	r.Decided("no such decision")
	r.BridgePoll("miss")
	r.BridgePoll("overdue")
	r.BridgePoll("store")
	r.UpstreamError("not a kind")
	for _, tc := range []struct {
		c    prometheus.Collector
		want float64
		lv   []string
	}{
		{m.Requests, 1, []string{"file_result", "OTHER", "200"}},
		{m.Requests, 1, []string{"file_result", "GET", "503"}},
		{m.Decisions, 1, []string{"file_result", "rejected"}},
		{m.BridgePolls, 2, []string{SourceCore}},
		{m.BridgePolls, 1, []string{SourceStore}},
		{m.BridgePolls, 0, []string{SourcePending}},
		{m.UpstreamErrors, 1, []string{"file_result", KindOther}},
		{m.ResponseBytes, 77, []string{"file_result"}},
	} {
		vec := tc.c.(interface {
			WithLabelValues(...string) prometheus.Counter
		})
		if got := testutil.ToFloat64(vec.WithLabelValues(tc.lv...)); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.lv, got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(m.Decisions); n != 1 {
		t.Errorf("decision series = %d, want 1 (an unknown decision is not counted)", n)
	}
	other := m.Route("version")
	other.SetLimit(false, 0, 0, 0)
	if n := testutil.CollectAndCount(m.LimitRate); n != 0 {
		t.Errorf("limit gauges of a route never limited = %d series, want 0", n)
	}
	other.SetLimit(true, 5, 10, time.Second)
	other.SetLimit(false, 0, 0, 0)
	if got := testutil.ToFloat64(m.LimitRate.WithLabelValues("version")); got != 0 {
		t.Errorf("rate gauge after the limit was removed = %v, want 0", got)
	}
}
