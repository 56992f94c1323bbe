package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// readYAML parses path into v, failing t on error.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// dashboard is the part of the Grafana dashboard the tests read.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name, Type string
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int         `json:"id"`
		Title      string      `json:"title"`
		Type       string      `json:"type"`
		GridPos    gridPos     `json:"gridPos"`
		Datasource *datasource `json:"datasource"`
		Targets    []struct {
			Expr       string      `json:"expr"`
			Datasource *datasource `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

// gridPos is a panel's place on the dashboard's grid: 24 columns, rows of 30 pixels.
type gridPos struct{ X, Y, W, H int }

// datasource is a panel's or a query's data source.
type datasource struct{ Type, UID string }

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("grafana", "dashboards", "mdproxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	return d
}

// panelQueries returns every panel query, with the dashboard's variables substituted as
// Grafana would for "All" routes.
func panelQueries(d dashboard) map[string]string {
	out := map[string]string{}
	r := strings.NewReplacer(`$route`, `.*`, `$__rate_interval`, `1m`)
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out[p.Title+" #"+string(rune('A'+i))] = r.Replace(tg.Expr)
		}
	}
	return out
}

func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: want both", d.UID, d.Title)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["route"] != "query" {
		t.Errorf("dashboard variables %v, want a datasource variable and a route query variable", vars)
	}
	q := panelQueries(d)
	if len(q) < 15 {
		t.Errorf("%d panel queries, want the whole set (decisions, ratio, codes, latency, errors, in-flight, bytes, config, seed figures)", len(q))
	}
	for name, expr := range q {
		if strings.Contains(expr, "$") {
			t.Errorf("panel %s: variable left after substitution: %s", name, expr)
		}
	}
	// The bridge's metrics each have a panel (through a recording rule for the polls'
	// share).
	var all strings.Builder
	for _, expr := range q {
		all.WriteString(expr + "\n")
	}
	for _, m := range []string{
		"mdproxy_bridge_polls_total", "mdproxy:bridge_polls_without_core_ratio:rate5m",
		"mdproxy_bridge_callbacks_total", "mdproxy_bridge_pending_ids",
		"mdproxy_bridge_store_entries", "mdproxy_bridge_store_bytes",
		// Replicas sharing Redis (issue 12): the limiter's mode per instance, Redis's
		// latency (p50 and p99 by command) and errors, the dry-run's would_reject.
		"mdproxy_limiter_mode", "command:mdproxy_redis_request_duration_seconds:p50_5m",
		"command:mdproxy_redis_request_duration_seconds:p99_5m", "instance_command:mdproxy_redis_errors:rate5m",
		`decision="would_reject"`,
	} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("no panel query uses %s", m)
		}
	}
	for name, expr := range q {
		if strings.Contains(expr, "mdproxy_limiter_mode") && !regexp.MustCompile(`by \(instance\)`).MatchString(expr) {
			t.Errorf("panel %s: %s; want the limiter mode by instance (each replica has its own)", name, expr)
		}
	}
}

// TestDashboardLayout checks the dashboard's conventions: every panel has an id of its
// own, sits within the grid's 24 columns without overlapping another, and every panel
// and query reads the data source variable, never a fixed data source.
func TestDashboardLayout(t *testing.T) {
	d := loadDashboard(t)
	ids := map[int]string{}
	for i, p := range d.Panels {
		if p.ID <= 0 {
			t.Errorf("panel %q: id %d, want one above 0", p.Title, p.ID)
		} else if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q: both id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v, want a place within the 24 columns", p.Title, g)
		}
		for _, o := range d.Panels[:i] {
			h := o.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q %+v and %q %+v overlap", o.Title, h, p.Title, g)
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: query %s has datasource %+v, want uid ${datasource}", p.Title, tg.Expr, tg.Datasource)
			}
		}
	}
}

// knownMetrics returns the metrics mdproxy exports, as docs/metrics.md (generated from
// the collectors metrics/ registers, and checked against them) lists them.
func knownMetrics(t *testing.T) []string {
	t.Helper()
	page, err := os.ReadFile(filepath.Join("..", "docs", "metrics.md"))
	if err != nil {
		t.Fatalf("reading docs/metrics.md: %v", err)
	}
	var names []string
	for _, m := range metricRow.FindAllSubmatch(page, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) == 0 {
		t.Fatal("docs/metrics.md lists no mdproxy_ metric")
	}
	return names
}

// metricRow is a row of docs/metrics.md's table of metrics.
var metricRow = regexp.MustCompile("(?m)^\\| `(mdproxy_[a-z_]+)` \\|")

// histogramSeries are the series names a histogram adds to its own.
var histogramSeries = regexp.MustCompile(`_(bucket|sum|count)$`)

// TestDeployMetricsKnown checks that every mdproxy metric that the dashboard, the
// recording and alerting rules and their promtool tests name is one mdproxy exports
// (knownMetrics, from docs/metrics.md), or a recording rule's, so that a misspelt name cannot leave a panel or
// an alert without data unnoticed.
func TestDeployMetricsKnown(t *testing.T) {
	records := map[string]bool{}
	for _, r := range recordingRules(t) {
		records[r] = true
	}
	texts := map[string]string{}
	for name, expr := range panelQueries(loadDashboard(t)) {
		texts["dashboard panel "+name] = expr
	}
	for _, f := range []string{"recording.yml", "alerts.yml"} {
		var rf ruleFile
		readYAML(t, filepath.Join("prometheus", "rules", f), &rf)
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				texts[f+" "+r.Record+r.Alert] = r.Expr
			}
		}
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
		} `yaml:"tests"`
	}
	readYAML(t, filepath.Join("prometheus", "tests", "alerts_test.yml"), &tests)
	for i, tc := range tests.Tests {
		for _, in := range tc.InputSeries {
			texts[fmt.Sprintf("alerts_test.yml test %d", i+1)] += in.Series + "\n"
		}
	}
	known := knownMetrics(t)
	quoted := regexp.MustCompile(`"[^"]*"`) // label values
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	for where, text := range texts {
		for _, m := range ident.FindAllString(quoted.ReplaceAllString(text, `""`), -1) {
			if !strings.HasPrefix(m, "mdproxy_") || records[m] {
				continue
			}
			if !slices.Contains(known, m) && !slices.Contains(known, histogramSeries.ReplaceAllString(m, "")) {
				t.Errorf("%s: %s is no metric of mdproxy's (knownMetrics)", where, m)
			}
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record      string            `yaml:"record"`
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertRules returns the names of the alerting rules.
func alertRules(t *testing.T) []string {
	var rf ruleFile
	readYAML(t, filepath.Join("prometheus", "rules", "alerts.yml"), &rf)
	var names []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	return names
}

// recordingRules returns the names of the recording rules.
func recordingRules(t *testing.T) []string {
	var rf ruleFile
	readYAML(t, filepath.Join("prometheus", "rules", "recording.yml"), &rf)
	var names []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Record)
		}
	}
	return names
}

func TestAlertsHaveSummaryAndDescription(t *testing.T) {
	var rf ruleFile
	readYAML(t, filepath.Join("prometheus", "rules", "alerts.yml"), &rf)
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: annotations %v, want a summary and a description", r.Alert, r.Annotations)
			}
		}
	}
	for _, want := range []string{"MdproxyDown", "MdproxyUpstreamDown", "MdproxyAdaptiveAtFloor", "MdproxyRejectionRatioHigh", "MdproxyUpstreamErrors", "CoreScanQueueFull", "MdproxyUpstreamLatencyHigh", "MdproxyBridgeCallbacksStopped", "MdproxyLimiterFallback"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s in alerts.yml", want)
		}
	}
	// Every alert has a unit test that fires it and one that keeps it quiet.
	b, err := os.ReadFile(filepath.Join("prometheus", "tests", "alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		tests := regexp.MustCompile(`alertname: `+a+`\n\s+exp_alerts:(\s*\[\])?`).FindAllStringSubmatch(string(b), -1)
		fires, quiet := false, false
		for _, m := range tests {
			if m[1] != "" {
				quiet = true
			} else {
				fires = true
			}
		}
		if !fires || !quiet {
			t.Errorf("alert %s: promtool tests fire it %t, keep it quiet %t; want both", a, fires, quiet)
		}
	}
}
