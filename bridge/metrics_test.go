package bridge

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/mdproxy/mdproxy/metrics"
)

// TestRegisterBridge reads the bridge's metrics through metrics.RegisterBridge, as a
// scrape does.
func TestRegisterBridge(t *testing.T) {
	tb := newTestBridge(t, Options{})
	srv := httptest.NewServer(tb.Handler())
	defer srv.Close()
	reg := prometheus.NewPedanticRegistry()
	metrics.RegisterBridge(reg, tb.Bridge, tb.store)

	s1 := tb.submit(t, "m1", alice)
	tb.submit(t, "m2", alice)
	if got := post(t, srv, s1, finalResult("m1")); got != http.StatusOK {
		t.Fatalf("callback = %d", got)
	}
	post(t, srv, flipLast(s1), finalResult("m1"))              // forged
	send(t, srv, http.MethodGet, CallbackPath+s1, http.NoBody) // invalid
	post(t, srv, s1, finalResult("m1"))                        // replay: forged
	tb.store.c.CleanUp()                                       // Bytes follows otter's maintenance

	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	got := map[string][]*dto.Metric{}
	for _, f := range families {
		if f.GetHelp() == "" {
			t.Errorf("%s has no help", f.GetName())
		}
		got[f.GetName()] = f.GetMetric()
	}
	callbacks := map[string]float64{}
	for _, m := range got["mdproxy_bridge_callbacks_total"] {
		if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "outcome" || m.GetCounter() == nil {
			t.Fatalf("mdproxy_bridge_callbacks_total series %v, want a counter by outcome", m)
		}
		callbacks[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	want := map[string]float64{OutcomeStored: 1, OutcomeForged: 2, OutcomeInvalid: 1, OutcomeBusy: 0}
	if len(callbacks) != len(want) {
		t.Errorf("mdproxy_bridge_callbacks_total = %v, want the series %v", callbacks, want)
	}
	for o, n := range want {
		if callbacks[o] != n {
			t.Errorf("mdproxy_bridge_callbacks_total{outcome=%q} = %v, want %v", o, callbacks[o], n)
		}
	}
	gauge := func(name string) float64 {
		t.Helper()
		ms := got[name]
		if len(ms) != 1 || ms[0].GetGauge() == nil {
			t.Fatalf("%s = %v, want one gauge", name, ms)
		}
		return ms[0].GetGauge().GetValue()
	}
	if v := gauge("mdproxy_bridge_pending_ids"); v != 1 {
		t.Errorf("mdproxy_bridge_pending_ids = %v, want 1", v)
	}
	if v, want := gauge("mdproxy_bridge_pending_bytes"), float64(idWeight("m2")); v != want {
		t.Errorf("mdproxy_bridge_pending_bytes = %v, want %v (m2's weight)", v, want)
	}
	if ms := got["mdproxy_bridge_pending_dropped_total"]; len(ms) != 1 || ms[0].GetCounter() == nil || ms[0].GetCounter().GetValue() != 0 {
		t.Errorf("mdproxy_bridge_pending_dropped_total = %v, want one counter at 0", ms)
	}
	if v := gauge("mdproxy_bridge_store_entries"); v != 1 {
		t.Errorf("mdproxy_bridge_store_entries = %v, want 1", v)
	}
	if v, want := gauge("mdproxy_bridge_store_bytes"), float64(tb.store.Bytes()); v != want || v <= float64(len(finalResult("m1"))) {
		t.Errorf("mdproxy_bridge_store_bytes = %v, want Bytes() %v, more than the body", v, want)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) != 0 {
		t.Errorf("GatherAndLint = %v, %v, want no problem", problems, err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 9 {
		t.Errorf("GatherAndCount = %d, %v, want 9 series (4 outcomes, a counter, 4 gauges)", n, err)
	}
}
