package main

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

// metric is one metric as docs/metrics.md lists it.
type metric struct {
	name, typ, help string
	labels          []string
}

// recorder is a Registerer that keeps what is registered on it, for docgen to
// describe; it registers nothing anywhere.
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// Reporters that give one series of each collector metrics/ reads at scrape time, so
// that its type shows.
type oneOfEach struct{}

func (oneOfEach) ClientKeys(f func(string, int, uint64)) { f("file_result", 0, 0) }
func (oneOfEach) PendingLen() int                        { return 0 }
func (oneOfEach) PendingBytes() int64                    { return 0 }
func (oneOfEach) PendingDropped() uint64                 { return 0 }
func (oneOfEach) Callbacks() map[string]float64          { return map[string]float64{bridge.OutcomeStored: 0} }
func (oneOfEach) Len() int                               { return 0 }
func (oneOfEach) Bytes() int64                           { return 0 }
func (oneOfEach) Held() int64                            { return 0 }
func (oneOfEach) Restores(f func(string, string, uint64)) {
	f("file_result", "route", 0)
}

// collectMetrics returns every metric mdproxy registers (metrics.New and the
// Register functions that sidecar calls, Redis's and the bridge's included), sorted
// by name; the Go and process collectors' are left out (the page names them).
func collectMetrics() ([]metric, error) {
	r := &recorder{}
	metrics.New(r)
	metrics.NewRedis(r)
	metrics.NewUpstreamUp(r)
	metrics.NewAdaptive(r, nil)
	metrics.RegisterLimiterMode(r, []string{"local"}, func() string { return "local" })
	metrics.RegisterClientKeys(r, oneOfEach{})
	metrics.RegisterLimiterRestores(r, oneOfEach{})
	metrics.RegisterBridge(r, oneOfEach{}, oneOfEach{})
	metrics.RegisterBridgeAnswers(r, oneOfEach{})
	byName := map[string]metric{}
	for _, c := range r.collectors {
		types := map[string]string{} // by name, from the samples collected
		ch := make(chan prometheus.Metric, 64)
		go func() { c.Collect(ch); close(ch) }()
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				return nil, err
			}
			name, _, _, err := parseDesc(m.Desc())
			if err != nil {
				return nil, err
			}
			types[name] = typeOf(&pb)
		}
		descs := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(descs); close(descs) }()
		for d := range descs {
			name, help, labels, err := parseDesc(d)
			if err != nil {
				return nil, err
			}
			if !strings.HasPrefix(name, metrics.Namespace+"_") {
				continue
			}
			typ := types[name]
			if typ == "" {
				typ = vecType(c)
			}
			if typ == "" {
				return nil, fmt.Errorf("the type of %s is unknown: no series collected and not a *Vec", name)
			}
			byName[name] = metric{name: name, typ: typ, help: help, labels: labels}
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range byName {
			if !yield(n) {
				return
			}
		}
	})
	out := make([]metric, len(names))
	for i, n := range names {
		out[i] = byName[n]
	}
	return out, nil
}

// typeOf returns the Prometheus type of a collected sample.
func typeOf(m *dto.Metric) string {
	switch {
	case m.Counter != nil:
		return "counter"
	case m.Gauge != nil:
		return "gauge"
	case m.Histogram != nil:
		return "histogram"
	case m.Summary != nil:
		return "summary"
	}
	return "untyped"
}

// vecType returns the type of a *Vec collector, which collects nothing before its
// first series; "" for another collector.
func vecType(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec, prometheus.Counter:
		return "counter"
	case *prometheus.GaugeVec, prometheus.Gauge:
		return "gauge"
	case *prometheus.HistogramVec, prometheus.Histogram:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// descPattern reads client_golang's Desc.String():
// Desc{fqName: "...", help: "...", unit: "...", constLabels: {...}, variableLabels: {a,b}}.
var descPattern = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), unit: "(?:[^"\\]|\\.)*", constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

// parseDesc returns a Desc's name, help and label names: its variable labels, then
// its constant labels' names (a Desc has no exported accessors). An error when the
// Desc cannot be read, e.g. after a change of client_golang's format.
func parseDesc(d *prometheus.Desc) (name, help string, labels []string, err error) {
	m := descPattern.FindStringSubmatch(d.String())
	if m == nil {
		return "", "", nil, fmt.Errorf("cannot read %s", d)
	}
	if name, err = strconv.Unquote(m[1]); err != nil {
		return "", "", nil, err
	}
	if help, err = strconv.Unquote(m[2]); err != nil {
		return "", "", nil, err
	}
	if m[4] != "" {
		labels = strings.Split(m[4], ",")
	}
	if m[3] != "" {
		for _, kv := range strings.Split(m[3], ",") {
			k, _, _ := strings.Cut(kv, "=")
			labels = append(labels, k)
		}
	}
	return name, help, labels, nil
}

// labelValues says the values each label takes, from the code that sets them.
func labelValues() map[string]string {
	code := func(vs ...string) string {
		for i, v := range vs {
			vs[i] = "`" + v + "`"
		}
		return strings.Join(vs, ", ")
	}
	var decisions []string
	for o := range limiter.Outcomes {
		decisions = append(decisions, limiter.Outcome(o).String())
	}
	var modes []string
	for _, m := range limiter.Modes {
		modes = append(modes, m.String())
	}
	return map[string]string{
		"route":     code(proxy.RouteNames()...),
		"method":    code(append(slices.Clone(metrics.Methods), "OTHER")...),
		"code":      "an HTTP status code sent; `499`: the client went away first",
		"decision":  code(decisions...),
		"kind":      code(metrics.KindRefused, metrics.KindReset, metrics.KindTimeout, metrics.KindCanceled, metrics.KindOther),
		"peer":      code(metrics.PeerClient, metrics.PeerCore),
		"result":    code(metrics.ReloadSuccess, metrics.ReloadError),
		"source":    code("store", "pending", "core"),
		"outcome":   code(bridge.OutcomeStored, bridge.OutcomeForged, bridge.OutcomeInvalid, bridge.OutcomeBusy),
		"mode":      code(modes...),
		"bucket":    code("route", "client"),
		"direction": code(metrics.Directions...),
		"command":   "the Redis command: `evalsha` for a limit decision, the result store's commands",
		"version":   "mdproxy's version (`--version`)",
		"revision":  "the VCS revision it was built from",
		"goversion": "the Go version it was built with",
	}
}

// metricsPage renders docs/metrics.md: every metric with its type, labels and help,
// then each label's values.
func metricsPage() ([]byte, error) {
	ms, err := collectMetrics()
	if err != nil {
		return nil, err
	}
	values := labelValues()
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Metrics\n\n<!-- %s -->\n\n", generated)
	b.WriteString(metricsIntro)
	b.WriteString("\n| metric | type | labels | meaning |\n|---|---|---|---|\n")
	used := map[string]bool{}
	for _, m := range ms {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.name, m.typ, strings.Join(m.labels, ", "), cell(m.help))
		for _, l := range m.labels {
			used[l] = true
		}
	}
	b.WriteString("| `go_*`, `process_*` | | | Go's runtime and process collectors (client_golang's) |\n")
	b.WriteString("\n## Label values\n\nEvery label takes its values from a fixed set:\n\n| label | values |\n|---|---|\n")
	for _, l := range slices.Sorted(func(yield func(string) bool) {
		for l := range used {
			if !yield(l) {
				return
			}
		}
	}) {
		v, ok := values[l]
		if !ok {
			return nil, fmt.Errorf("label %s has no values in labelValues", l)
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", l, v)
	}
	b.WriteString(metricsOutro)
	return b.Bytes(), nil
}

const metricsIntro = `mdproxy serves its metrics at ` + "`/metrics`" + ` on the admin port (` + "`MDPROXY_ADMIN_ADDR`" + `, ` + "`:9009`" + `),
never on the proxy port, where ` + "`/metrics`" + ` and ` + "`/readyz`" + ` belong to Core. A label's value comes
from a fixed set (below): a path, ` + "`data_id`" + `, apikey or address is never a label. With
` + "`MDPROXY_BRIDGE=false`" + ` there is no ` + "`mdproxy_bridge_*`" + ` series; the Redis ones need
` + "`MDPROXY_REDIS_URL`" + `; ` + "`mdproxy_limiter_client_*`" + ` exist for routes with a per-client share only;
` + "`mdproxy_body_timeouts_total`" + `'s series appear on first use.
`

const metricsOutro = `
## Core reachable: mdproxy_upstream_up

mdproxy asks Core's ` + "`/readyz`" + ` at start and then every ` + "`MDPROXY_UPSTREAM_CHECK_INTERVAL`" + ` (10 s; 0 turns it off), through its transport to
Core (its TLS settings), within ` + "`MDPROXY_UPSTREAM_DIAL_TIMEOUT`" + ` plus ` + "`MDPROXY_UPSTREAM_TIMEOUT`" + `, 5 s
at most. Any answer, whatever its status, means Core can be reached (a busy Core says so
itself on its ` + "`/readyz`" + `, which the proxy port forwards): ` + "`mdproxy_upstream_up`" + ` is 1. No answer
sets it to 0 and logs a warning (` + "`Core cannot be reached at start`" + ` at start, ` + "`Core cannot be\nreached`" + ` later; ` + "`Core can be reached again`" + ` at info when it comes back): requests are
answered 502 meanwhile. mdproxy's own ` + "`/readyz`" + ` does not follow it: taking every replica out
of a Service because Core is away helps no client, and one failed request never flips
readiness. Alert on ` + "`mdproxy_upstream_up == 0`" + ` for a minute or more.

## Health

` + "`/healthz`" + ` answers 200 while the process runs; ` + "`/readyz`" + ` answers 200 until shutdown starts,
then 503. ` + "`/config`" + ` answers the effective settings as JSON (docs/configuration.md).
`
