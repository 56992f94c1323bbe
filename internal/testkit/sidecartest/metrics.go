package sidecartest

import (
	"io"
	"maps"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is every sample of a registry or a /metrics page, as the text format writes
// them: a histogram as its _bucket (with le), _sum and _count series, a summary as its
// quantiles, _sum and _count. It is the tests' one reader of metrics: Gather takes a
// registry, ParseMetrics and ScrapeMetrics a page (prometheus/common's text parser).
type Metrics []Sample

// Sample is one series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Gather returns the samples of g, failing t when it cannot gather.
func Gather(t testing.TB, g prometheus.Gatherer) Metrics {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v", err)
	}
	return samples(mfs)
}

// ParseMetrics returns the samples of page, in Prometheus's text format, failing t
// when it does not parse.
func ParseMetrics(t testing.TB, page string) Metrics {
	t.Helper()
	m, err := parse(strings.NewReader(page))
	if err != nil {
		t.Fatalf("parsing a /metrics page: %v\n%s", err, Short(page))
	}
	return m
}

// ScrapeMetrics returns the samples of the /metrics page at url (e.g. an admin
// listener's "http://host:port/metrics"), read with c (nil: a client of its own),
// failing t unless it answers 200 in the text format.
func ScrapeMetrics(t testing.TB, c *http.Client, url string) Metrics {
	t.Helper()
	if c == nil {
		c = NewClient(t)
	}
	code, page := Get(t, c, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d, want 200", url, code)
	}
	return ParseMetrics(t, page)
}

func parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	list := make([]*dto.MetricFamily, 0, len(mfs))
	for _, f := range mfs {
		list = append(list, f)
	}
	return samples(list), nil
}

// samples flattens families into the series the text format writes.
func samples(mfs []*dto.MetricFamily) Metrics {
	var out Metrics
	for _, f := range mfs {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(suffix string, v float64, extra ...string) {
				ls := labels
				if len(extra) > 0 {
					ls = maps.Clone(labels)
					ls[extra[0]] = extra[1]
				}
				out = append(out, Sample{Name: name + suffix, Labels: ls, Value: v})
			}
			switch {
			case m.Counter != nil:
				add("", m.GetCounter().GetValue())
			case m.Gauge != nil:
				add("", m.GetGauge().GetValue())
			case m.Untyped != nil:
				add("", m.GetUntyped().GetValue())
			case m.Histogram != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add("_bucket", float64(b.GetCumulativeCount()), "le", formatFloat(b.GetUpperBound()))
				}
				add("_bucket", float64(h.GetSampleCount()), "le", "+Inf")
				add("_sum", h.GetSampleSum())
				add("_count", float64(h.GetSampleCount()))
			case m.Summary != nil:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add("", q.GetValue(), "quantile", formatFloat(q.GetQuantile()))
				}
				add("_sum", s.GetSampleSum())
				add("_count", float64(s.GetSampleCount()))
			}
		}
	}
	return out
}

func formatFloat(f float64) string {
	if math.IsInf(f, +1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// Value returns the value of series, written as the text format writes one (a name,
// with its labels in braces when it has any: `x_total{code="200",route="a"}`), and
// whether a sample has exactly that name and those labels.
func (ms Metrics) Value(series string) (float64, bool) {
	want, err := parse(strings.NewReader(series + " 0\n"))
	if err != nil || len(want) != 1 {
		return 0, false
	}
	for _, s := range ms {
		if s.Name == want[0].Name && maps.Equal(s.Labels, want[0].Labels) {
			return s.Value, true
		}
	}
	return 0, false
}

// Sum returns the sum of the samples named name whose labels include the pairs
// (label, value, label, value, ...), and how many there are.
func (ms Metrics) Sum(name string, pairs ...string) (sum float64, n int) {
	for _, s := range ms {
		if s.Name == name && s.has(pairs) {
			sum += s.Value
			n++
		}
	}
	return sum, n
}

func (s Sample) has(pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if v, ok := s.Labels[pairs[i]]; !ok || v != pairs[i+1] {
			return false
		}
	}
	return true
}
