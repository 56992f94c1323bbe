package sidecartest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const page = `# HELP x_total Things.
# TYPE x_total counter
x_total{code="200",route="a"} 3
x_total{code="503",route="a"} 2
x_total{code="200",route="b"} 5
# HELP d_seconds Durations.
# TYPE d_seconds histogram
d_seconds_bucket{route="a",le="0.1"} 1
d_seconds_bucket{route="a",le="+Inf"} 4
d_seconds_sum{route="a"} 1.5
d_seconds_count{route="a"} 4
# HELP up Up.
# TYPE up gauge
up 1
`

func TestMetricsValue(t *testing.T) {
	m := ParseMetrics(t, page)
	for _, tc := range []struct {
		series string
		want   float64
		ok     bool
	}{
		{`x_total{code="200",route="a"}`, 3, true},
		{`x_total{route="a",code="503"}`, 2, true}, // any order of labels
		{`x_total{route="a"}`, 0, false},           // a subset is not the series
		{`x_total{code="404",route="a"}`, 0, false},
		{`d_seconds_count{route="a"}`, 4, true},
		{`d_seconds_bucket{le="0.1",route="a"}`, 1, true},
		{`d_seconds_bucket{le="+Inf",route="a"}`, 4, true},
		{`d_seconds_sum{route="a"}`, 1.5, true},
		{`up`, 1, true},
		{`absent`, 0, false},
	} {
		if got, ok := m.Value(tc.series); got != tc.want || ok != tc.ok {
			t.Errorf("Value(%s) = %v, %t; want %v, %t", tc.series, got, ok, tc.want, tc.ok)
		}
	}
}

func TestMetricsSum(t *testing.T) {
	m := ParseMetrics(t, page)
	for _, tc := range []struct {
		name  string
		pairs []string
		sum   float64
		n     int
	}{
		{"x_total", nil, 10, 3},
		{"x_total", []string{"route", "a"}, 5, 2},
		{"x_total", []string{"code", "200", "route", "b"}, 5, 1},
		{"x_total", []string{"route", "c"}, 0, 0},
		{"d_seconds_count", nil, 4, 1},
	} {
		if sum, n := m.Sum(tc.name, tc.pairs...); sum != tc.sum || n != tc.n {
			t.Errorf("Sum(%s, %q) = %v, %d; want %v, %d", tc.name, tc.pairs, sum, n, tc.sum, tc.n)
		}
	}
}

// TestGatherMatchesScrape: a registry gathered reads as its page parsed does.
func TestGatherMatchesScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "Things."}, []string{"code", "route"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d_seconds", Help: "Durations.", Buckets: []float64{0.1}}, []string{"route"})
	reg.MustRegister(c, h)
	c.WithLabelValues("200", "a").Add(3)
	h.WithLabelValues("a").Observe(0.05)
	h.WithLabelValues("a").Observe(1)
	m := Gather(t, reg)
	for series, want := range map[string]float64{
		`x_total{code="200",route="a"}`:         3,
		`d_seconds_bucket{le="0.1",route="a"}`:  1,
		`d_seconds_bucket{le="+Inf",route="a"}`: 2,
		`d_seconds_count{route="a"}`:            2,
	} {
		if got, ok := m.Value(series); !ok || got != want {
			t.Errorf("Gather: Value(%s) = %v, %t; want %v, true", series, got, ok, want)
		}
	}
}
