package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mdproxy/mdproxy/sidecar"
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

// knownMetrics are the metrics mdproxy exports, as the README's Metrics table lists
// them, with those of issue 12 (shared limits on Redis). The deploy files may use no
// other mdproxy metric; TestAgainstPrometheus checks the dashboard against a running
// mdproxy's /metrics as well.
var knownMetrics = []string{
	"mdproxy_requests_total", "mdproxy_limiter_decisions_total", "mdproxy_request_duration_seconds",
	"mdproxy_upstream_duration_seconds", "mdproxy_upstream_responses_total", "mdproxy_upstream_errors_total",
	"mdproxy_body_timeouts_total", "mdproxy_in_flight_requests", "mdproxy_request_body_bytes_total",
	"mdproxy_response_body_bytes_total", "mdproxy_limit_rate_requests_per_second", "mdproxy_limit_burst_requests",
	"mdproxy_limit_max_wait_seconds", "mdproxy_limiter_client_keys", "mdproxy_limiter_client_untracked_requests_total",
	"mdproxy_config_reloads_total", "mdproxy_bridge_polls_total", "mdproxy_bridge_callbacks_total",
	"mdproxy_bridge_pending_ids", "mdproxy_bridge_store_entries", "mdproxy_bridge_store_bytes", "mdproxy_build_info",
	// Issue 29.
	"mdproxy_bridge_pending_bytes", "mdproxy_bridge_pending_dropped_total",
	// Issue 12.
	"mdproxy_limiter_mode", "mdproxy_redis_request_duration_seconds", "mdproxy_redis_errors_total",
	// Issue 29.
	"mdproxy_limiter_redis_restores_total",
}

// histogramSeries are the series names a histogram adds to its own.
var histogramSeries = regexp.MustCompile(`_(bucket|sum|count)$`)

// TestDeployMetricsKnown checks that every mdproxy metric that the dashboard, the
// recording and alerting rules and their promtool tests name is one mdproxy exports
// (knownMetrics), or a recording rule's, so that a misspelt name cannot leave a panel or
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
	quoted := regexp.MustCompile(`"[^"]*"`) // label values
	ident := regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	for where, text := range texts {
		for _, m := range ident.FindAllString(quoted.ReplaceAllString(text, `""`), -1) {
			if !strings.HasPrefix(m, "mdproxy_") || records[m] {
				continue
			}
			if !slices.Contains(knownMetrics, m) && !slices.Contains(knownMetrics, histogramSeries.ReplaceAllString(m, "")) {
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
	for _, want := range []string{"MdproxyDown", "MdproxyRejectionRatioHigh", "MdproxyUpstreamErrors", "CoreScanQueueFull", "MdproxyUpstreamLatencyHigh", "MdproxyBridgeCallbacksStopped", "MdproxyLimiterFallback"} {
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

// TestManifestsParse checks the compose file, the Kubernetes manifests and the Grafana
// provisioning files parse and hold what the README promises.
func TestManifestsParse(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			NetworkMode string            `yaml:"network_mode"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	readYAML(t, "compose.yaml", &compose)
	for _, s := range []string{"core", "mdproxy", "prometheus", "grafana"} {
		if _, ok := compose.Services[s]; !ok {
			t.Errorf("compose.yaml: no service %s", s)
		}
	}
	if m := compose.Services["mdproxy"]; m.NetworkMode != "service:core" || m.Environment["MDPROXY_UPSTREAM_URL"] != "http://127.0.0.1:8008" {
		t.Errorf("compose.yaml: mdproxy network_mode %q, upstream %q; want Core's namespace and 127.0.0.1:8008", m.NetworkMode, m.Environment["MDPROXY_UPSTREAM_URL"])
	}
	if img := compose.Services["core"].Image; !strings.Contains(img, "${CORE_IMAGE") {
		t.Errorf("compose.yaml: core image %q, want it set by CORE_IMAGE", img)
	}

	kinds := map[string]map[string]any{}
	files, _ := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	for _, f := range files {
		var m map[string]any
		readYAML(t, f, &m)
		kinds[m["kind"].(string)] = m
	}
	for _, k := range []string{"Deployment", "Service", "ConfigMap", "ServiceMonitor"} {
		if kinds[k] == nil {
			t.Errorf("kubernetes/: no %s", k)
		}
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name           string `yaml:"name"`
						ReadinessProbe struct {
							HTTPGet struct {
								Path string `yaml:"path"`
								Port string `yaml:"port"`
							} `yaml:"httpGet"`
						} `yaml:"readinessProbe"`
						LivenessProbe struct {
							HTTPGet struct {
								Port string `yaml:"port"`
							} `yaml:"httpGet"`
						} `yaml:"livenessProbe"`
						EnvFrom   []map[string]any `yaml:"envFrom"`
						Resources struct {
							Requests map[string]string `yaml:"requests"`
						} `yaml:"resources"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	readYAML(t, filepath.Join("kubernetes", "deployment.yaml"), &dep)
	names := []string{}
	for _, c := range dep.Spec.Template.Spec.Containers {
		names = append(names, c.Name)
		if c.Resources.Requests["cpu"] == "" {
			t.Errorf("container %s: no CPU request", c.Name)
		}
		if c.Name == "mdproxy" && (c.ReadinessProbe.HTTPGet.Port != "admin" || c.LivenessProbe.HTTPGet.Port != "admin" || len(c.EnvFrom) == 0) {
			t.Errorf("mdproxy container: probes on %q/%q, envFrom %v; want the admin port and the ConfigMap", c.ReadinessProbe.HTTPGet.Port, c.LivenessProbe.HTTPGet.Port, c.EnvFrom)
		}
	}
	if !slices.Equal(names, []string{"core", "mdproxy"}) {
		t.Errorf("Deployment containers %v, want core and mdproxy in one Pod", names)
	}
	var svc struct {
		Spec struct {
			Ports []struct {
				Name       string `yaml:"name"`
				TargetPort string `yaml:"targetPort"`
			} `yaml:"ports"`
		} `yaml:"spec"`
	}
	readYAML(t, filepath.Join("kubernetes", "service.yaml"), &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort != "api" {
		t.Errorf("clients' Service ports %+v, want the API port alone, to the proxy (api): the admin port (/config) is not for clients", svc.Spec.Ports)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	readYAML(t, filepath.Join("kubernetes", "configmap.yaml"), &cm)
	for k := range cm.Data {
		if !strings.HasPrefix(k, "MDPROXY_") {
			t.Errorf("ConfigMap key %s: want MDPROXY_ variables only", k)
		}
	}
	for _, f := range []string{
		filepath.Join("grafana", "provisioning", "datasources", "prometheus.yaml"),
		filepath.Join("grafana", "provisioning", "dashboards", "mdproxy.yaml"),
		filepath.Join("prometheus", "prometheus.yml"),
	} {
		var m map[string]any
		readYAML(t, f, &m)
		if len(m) == 0 {
			t.Errorf("%s: empty", f)
		}
	}
}

// The shutdown budget (issue 9): on SIGTERM mdproxy answers 503 on /readyz and keeps
// serving for MDPROXY_SHUTDOWN_DELAY, then drains in-flight requests for up to
// MDPROXY_SHUTDOWN_TIMEOUT. The orchestrator's grace period must cover both, or SIGKILL
// cuts the uploads the drain was for.

// mdproxy's defaults of the shutdown variables (README, Configuration).
const (
	defaultShutdownDelay   = 5 * time.Second
	defaultShutdownTimeout = 30 * time.Second
)

// graceMargin is the least time a grace period must leave beyond the shutdown's phases:
// the process's exit, the kubelet's and the runtime's own steps.
const graceMargin = 5 * time.Second

// podShutdown is what decides whether mdproxy can shut down cleanly in a Pod or a
// compose project.
type podShutdown struct {
	grace          time.Duration // terminationGracePeriodSeconds, or compose's stop_grace_period
	preStop        time.Duration // mdproxy's preStop sleep before its SIGTERM; 0: none
	delay, timeout time.Duration // MDPROXY_SHUTDOWN_DELAY and MDPROXY_SHUTDOWN_TIMEOUT
	// coreServes is how long Core keeps serving once the stop begins (the preStop sleep
	// of its container, which shares the grace period); below 0: until mdproxy exited
	// (compose stops a service before those it depends on).
	coreServes time.Duration
}

// problems returns what is wrong with the budget, nil when nothing is.
func (p podShutdown) problems() []string {
	var out []string
	need := p.preStop + p.delay + p.timeout
	if p.grace < need+graceMargin {
		out = append(out, fmt.Sprintf("grace period %v is shorter than preStop %v + MDPROXY_SHUTDOWN_DELAY %v + MDPROXY_SHUTDOWN_TIMEOUT %v + margin %v = %v",
			p.grace, p.preStop, p.delay, p.timeout, graceMargin, need+graceMargin))
	}
	if p.coreServes >= 0 {
		if p.coreServes < need {
			out = append(out, fmt.Sprintf("Core stops serving %v into the stop, before mdproxy's drain may end (%v)", p.coreServes, need))
		}
		if p.grace < p.coreServes+graceMargin {
			out = append(out, fmt.Sprintf("grace period %v leaves Core less than %v to stop after its preStop of %v", p.grace, graceMargin, p.coreServes))
		}
	}
	return out
}

func TestManifestShutdownBudget(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name string
		p    podShutdown
		want int // problems
	}{
		{"enough", podShutdown{grace: 90 * s, delay: 5 * s, timeout: 60 * s, coreServes: 65 * s}, 0},
		{"compose order", podShutdown{grace: 45 * s, delay: 5 * s, timeout: 30 * s, coreServes: -1}, 0},
		{"no margin", podShutdown{grace: 35 * s, delay: 5 * s, timeout: 30 * s, coreServes: -1}, 1},
		{"delay forgotten", podShutdown{grace: 75 * s, delay: 5 * s, timeout: 70 * s, coreServes: -1}, 1},
		{"preStop counted", podShutdown{grace: 75 * s, preStop: 10 * s, delay: 5 * s, timeout: 60 * s, coreServes: -1}, 1},
		{"Core stops first", podShutdown{grace: 90 * s, delay: 5 * s, timeout: 60 * s, coreServes: 5 * s}, 1},
		{"Core has no time", podShutdown{grace: 82 * s, delay: 5 * s, timeout: 60 * s, coreServes: 80 * s}, 1},
	} {
		if got := tc.p.problems(); len(got) != tc.want {
			t.Errorf("%s: %+v.problems() = %q, want %d problems", tc.name, tc.p, got, tc.want)
		}
	}
}

// shutdownVars returns MDPROXY_SHUTDOWN_DELAY and _TIMEOUT from env, mdproxy's defaults
// when unset. A compose value ${VAR:-default} counts as its default.
func shutdownVars(t *testing.T, where string, env map[string]string) (delay, timeout time.Duration) {
	t.Helper()
	interpolated := regexp.MustCompile(`^\$\{[A-Za-z0-9_]+:?-(.*)\}$`)
	get := func(name string, def time.Duration) time.Duration {
		v, ok := env[name]
		if !ok {
			return def
		}
		if m := interpolated.FindStringSubmatch(v); m != nil {
			v = m[1]
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			t.Fatalf("%s: %s = %q, want a duration >= 0", where, name, v)
		}
		return d
	}
	return get("MDPROXY_SHUTDOWN_DELAY", defaultShutdownDelay), get("MDPROXY_SHUTDOWN_TIMEOUT", defaultShutdownTimeout)
}

// TestManifestsShutdownGrace checks that the Kubernetes Pod's and the compose file's
// grace periods cover mdproxy's shutdown delay and timeout as configured there.
func TestManifestsShutdownGrace(t *testing.T) {
	type preStop struct {
		Sleep *struct {
			Seconds int `yaml:"seconds"`
		} `yaml:"sleep"`
		Exec *struct {
			Command []string `yaml:"command"`
		} `yaml:"exec"`
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
					Containers                    []struct {
						Name      string `yaml:"name"`
						Lifecycle struct {
							PreStop *preStop `yaml:"preStop"`
						} `yaml:"lifecycle"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	readYAML(t, filepath.Join("kubernetes", "deployment.yaml"), &dep)
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	readYAML(t, filepath.Join("kubernetes", "configmap.yaml"), &cm)

	pod := dep.Spec.Template.Spec
	k8s := podShutdown{grace: 30 * time.Second, coreServes: 0} // Kubernetes' default grace
	if pod.TerminationGracePeriodSeconds != nil {
		k8s.grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	k8s.delay, k8s.timeout = shutdownVars(t, "kubernetes/configmap.yaml", cm.Data)
	sleep := func(p *preStop) time.Duration {
		if p == nil || p.Sleep == nil {
			return 0
		}
		return time.Duration(p.Sleep.Seconds) * time.Second
	}
	found := map[string]bool{}
	for _, c := range pod.Containers {
		found[c.Name] = true
		switch c.Name {
		case "mdproxy":
			if p := c.Lifecycle.PreStop; p != nil && p.Exec != nil {
				t.Errorf("deployment.yaml: mdproxy preStop exec %q: the image is distroless, with no shell nor sleep; MDPROXY_SHUTDOWN_DELAY replaces it", p.Exec.Command)
			}
			k8s.preStop = sleep(c.Lifecycle.PreStop)
		case "core":
			k8s.coreServes = sleep(c.Lifecycle.PreStop)
		}
	}
	if !found["mdproxy"] || !found["core"] {
		t.Fatalf("deployment.yaml: containers %v, want core and mdproxy", found)
	}
	for _, p := range k8s.problems() {
		t.Errorf("kubernetes/deployment.yaml with configmap.yaml: %s", p)
	}

	var compose struct {
		Services map[string]struct {
			StopGracePeriod string            `yaml:"stop_grace_period"`
			Environment     map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	readYAML(t, "compose.yaml", &compose)
	m, ok := compose.Services["mdproxy"]
	if !ok {
		t.Fatal("compose.yaml: no service mdproxy")
	}
	dc := podShutdown{grace: 10 * time.Second, coreServes: -1} // compose's default grace
	if m.StopGracePeriod != "" {
		d, err := time.ParseDuration(m.StopGracePeriod)
		if err != nil {
			t.Fatalf("compose.yaml: mdproxy stop_grace_period %q: %v", m.StopGracePeriod, err)
		}
		dc.grace = d
	}
	dc.delay, dc.timeout = shutdownVars(t, "compose.yaml", m.Environment)
	for _, p := range dc.problems() {
		t.Errorf("compose.yaml, service mdproxy: %s", p)
	}
}

// TestManifestLimitsFile checks that the Kubernetes manifests give mdproxy its limits
// file as a reloadable ConfigMap: MDPROXY_LIMITS_FILE names a file in a directory that
// the mdproxy container mounts whole (a subPath mount is never updated) from the
// ConfigMap that holds the file, and mdproxy accepts the settings with that file.
func TestManifestLimitsFile(t *testing.T) {
	type manifest struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name         string `yaml:"name"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
							SubPath   string `yaml:"subPath"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
					Volumes []struct {
						Name      string `yaml:"name"`
						ConfigMap *struct {
							Name string `yaml:"name"`
						} `yaml:"configMap"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	configMaps := map[string]manifest{}
	var dep manifest
	files, _ := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	for _, f := range files {
		var m manifest
		readYAML(t, f, &m)
		switch m.Kind {
		case "ConfigMap":
			configMaps[m.Metadata.Name] = m
		case "Deployment":
			dep = m
		}
	}
	settings := configMaps["mdproxy"].Data
	path := settings["MDPROXY_LIMITS_FILE"]
	if path == "" || !filepath.IsAbs(path) {
		t.Fatalf("ConfigMap mdproxy: MDPROXY_LIMITS_FILE = %q, want an absolute path", path)
	}
	volume := ""
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name != "mdproxy" {
			continue
		}
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == filepath.Dir(path) {
				volume = vm.Name
				if vm.SubPath != "" {
					t.Errorf("deployment.yaml: mdproxy mounts %s with subPath %q: a subPath mount is never updated", vm.MountPath, vm.SubPath)
				}
			}
		}
	}
	if volume == "" {
		t.Fatalf("deployment.yaml: mdproxy mounts nothing at %s, MDPROXY_LIMITS_FILE's directory", filepath.Dir(path))
	}
	cmName := ""
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == volume && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	content, ok := configMaps[cmName].Data[filepath.Base(path)]
	if !ok {
		t.Fatalf("deployment.yaml: volume %q is ConfigMap %q, which has no key %s", volume, cmName, filepath.Base(path))
	}

	// mdproxy accepts the settings and the file, and limits file_result from it.
	local := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(local, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	environ := map[string]string{}
	for k, v := range settings {
		environ[k] = v
	}
	environ["MDPROXY_LIMITS_FILE"] = local
	c, err := sidecar.LoadConfig(environ)
	if err != nil {
		t.Fatalf("ConfigMaps %s and %s: mdproxy's LoadConfig = %v, want no error", "mdproxy", cmName, err)
	}
	if l := c.Limits["file_result"]; l.Rate <= 0 {
		t.Errorf("ConfigMap %s: file_result's limit %+v, want a rate", cmName, l)
	}
	for k := range configMaps[cmName].Data {
		if k != filepath.Base(path) {
			t.Errorf("ConfigMap %s: key %s, want only %s", cmName, k, filepath.Base(path))
		}
	}
}

// composeService is the part of a compose service the replica checks read.
type composeService struct {
	Image           string            `yaml:"image"`
	NetworkMode     string            `yaml:"network_mode"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
}

// composeDefaults returns env with each ${VAR:-default} value replaced by its default,
// as compose gives it when VAR is unset.
func composeDefaults(env map[string]string) map[string]string {
	interpolated := regexp.MustCompile(`\$\{[A-Za-z0-9_]+:?-([^}]*)\}`)
	out := map[string]string{}
	for k, v := range env {
		out[k] = interpolated.ReplaceAllString(v, "$1")
	}
	return out
}

// redisSettings returns the maxmemory and maxmemory-policy of a redis-server command
// line or configuration file: "--name value" arguments or "name value" lines.
func redisSettings(words []string) (maxmemory, policy string) {
	for i := 0; i+1 < len(words); i++ {
		switch strings.TrimPrefix(words[i], "--") {
		case "maxmemory":
			maxmemory = words[i+1]
		case "maxmemory-policy":
			policy = words[i+1]
		}
	}
	return maxmemory, policy
}

// redisBytes returns a Redis memory size ("256mb", "1gb", "1048576") in bytes, 0 when
// it does not parse.
func redisBytes(v string) int64 {
	v = strings.ToLower(v)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			if x, err := strconv.ParseInt(n, 10, 64); err == nil {
				return x * u.mult
			}
			return 0
		}
	}
	return 0
}

// quantityBytes returns a Kubernetes memory quantity ("384Mi", "1Gi") in bytes, 0 when
// it is not one of the binary suffixes these manifests use.
func quantityBytes(v string) int64 {
	for suffix, mult := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(v, suffix); ok {
			if x, err := strconv.ParseInt(n, 10, 64); err == nil {
				return x * mult
			}
		}
	}
	return 0
}

// checkRedisURL checks that raw is a redis:// or rediss:// URL whose host is one of
// hosts, on port, and returns the host.
func checkRedisURL(t *testing.T, where, raw string, hosts []string, port string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		t.Errorf("%s: MDPROXY_REDIS_URL %q, want a redis:// or rediss:// URL", where, raw)
		return ""
	}
	if !slices.Contains(hosts, u.Hostname()) || u.Port() != port {
		t.Errorf("%s: MDPROXY_REDIS_URL %q reaches %s:%s, want the Redis of the example (%v, port %s)", where, raw, u.Hostname(), u.Port(), hosts, port)
	}
	return u.Hostname()
}

// TestComposeReplicas checks compose's gateway example: its replicas share a Redis of
// the project whose memory is bounded with the volatile-lru policy, MDPROXY_REPLICAS is
// the number of replicas sharing it, each gives Core a callback URL of its own, every
// mdproxy service (the sidecar too) is scraped by Prometheus and has settings that
// mdproxy accepts, and every shutdown fits its grace period.
func TestComposeReplicas(t *testing.T) {
	var compose struct {
		Services map[string]composeService `yaml:"services"`
	}
	readYAML(t, "compose.yaml", &compose)
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, filepath.Join("prometheus", "prometheus.yml"), &prom)
	scraped := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				scraped[sc.JobName+" "+target] = true
			}
		}
	}

	redisServices := []string{}
	for name, s := range compose.Services {
		if strings.HasPrefix(s.Image, "redis:") {
			redisServices = append(redisServices, name)
			if m, p := redisSettings(s.Command); redisBytes(m) == 0 || p != "volatile-lru" {
				t.Errorf("compose.yaml: service %s: maxmemory %q, maxmemory-policy %q; want a bound and volatile-lru (the bridge's results are bounded by Redis's eviction)", name, m, p)
			}
		}
	}
	if len(redisServices) == 0 {
		t.Fatal("compose.yaml: no Redis service (image redis:...)")
	}

	sharing := map[string][]string{} // MDPROXY_REDIS_URL: the services that share it
	callbacks := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(compose.Services)) {
		s := compose.Services[name]
		if !strings.HasPrefix(s.Image, "mdproxy:") || s.Environment == nil {
			continue
		}
		env := composeDefaults(s.Environment)
		// Prometheus reaches the admin port by the service's name, or by Core's for a
		// sidecar in Core's network namespace.
		host := name
		if c, ok := strings.CutPrefix(s.NetworkMode, "service:"); ok {
			host = c
		}
		_, port, err := net.SplitHostPort(env["MDPROXY_ADMIN_ADDR"])
		if err != nil {
			t.Errorf("compose.yaml: service %s: MDPROXY_ADMIN_ADDR %q: %v", name, env["MDPROXY_ADMIN_ADDR"], err)
		} else if !scraped["mdproxy "+net.JoinHostPort(host, port)] {
			t.Errorf("compose.yaml: service %s: prometheus.yml's job mdproxy does not scrape %s", name, net.JoinHostPort(host, port))
		}
		if _, err := sidecar.LoadConfig(env); err != nil {
			t.Errorf("compose.yaml: service %s: mdproxy's LoadConfig = %v, want no error", name, err)
		}
		dc := podShutdown{grace: 10 * time.Second, coreServes: -1} // compose's default grace
		if s.StopGracePeriod != "" {
			if dc.grace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
				t.Fatalf("compose.yaml: %s stop_grace_period %q: %v", name, s.StopGracePeriod, err)
			}
		}
		dc.delay, dc.timeout = shutdownVars(t, "compose.yaml", s.Environment)
		for _, p := range dc.problems() {
			t.Errorf("compose.yaml, service %s: %s", name, p)
		}
		raw, ok := env["MDPROXY_REDIS_URL"]
		if !ok {
			continue
		}
		checkRedisURL(t, "compose.yaml: service "+name, raw, redisServices, "6379")
		sharing[raw] = append(sharing[raw], name)
		cb, err := url.Parse(env["MDPROXY_BRIDGE_CALLBACK_URL"])
		if env["MDPROXY_BRIDGE"] != "false" && (err != nil || cb.Hostname() != name) {
			t.Errorf("compose.yaml: service %s: MDPROXY_BRIDGE_CALLBACK_URL %q, want the service's own name, which Core reaches", name, env["MDPROXY_BRIDGE_CALLBACK_URL"])
		}
		if other, ok := callbacks[cb.String()]; ok {
			t.Errorf("compose.yaml: services %s and %s give Core the same callback URL %s", other, name, cb)
		}
		callbacks[cb.String()] = name
	}
	if len(sharing) == 0 {
		t.Fatal("compose.yaml: no mdproxy service with MDPROXY_REDIS_URL (the gateway example)")
	}
	for raw, names := range sharing {
		if len(names) < 2 {
			t.Errorf("compose.yaml: only %v use %s; want two replicas sharing it", names, raw)
		}
		for _, name := range names {
			if n := composeDefaults(compose.Services[name].Environment)["MDPROXY_REPLICAS"]; n != strconv.Itoa(len(names)) {
				t.Errorf("compose.yaml: service %s: MDPROXY_REPLICAS %q, want %d, the services sharing %s (%v)", name, n, len(names), raw, names)
			}
		}
	}
}

// k8sObject is the part of a Kubernetes object the gateway checks read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Replicas *int             `yaml:"replicas"`
		Selector map[string]any   `yaml:"selector"` // a Service's labels, or a Deployment's matchLabels
		Ports    []k8sServicePort `yaml:"ports"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
		Endpoints []struct {
			Port        string `yaml:"port"`
			Relabelings []struct {
				TargetLabel string `yaml:"targetLabel"`
				Replacement string `yaml:"replacement"`
			} `yaml:"relabelings"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
	Containers                    []k8sContainer `yaml:"containers"`
	Volumes                       []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

// readObjects returns every object of the YAML files of dir, by kind and name; a file
// may hold several, separated by ---.
func readObjects(t *testing.T, dir string) map[string]k8sObject {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("%s: no manifests", dir)
	}
	objects := map[string]k8sObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s: an object without kind or name", f)
				continue
			}
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objects[key]; dup {
				t.Errorf("%s: %s twice in %s", f, key, dir)
			}
			objects[key] = o
		}
	}
	return objects
}

// podEnv returns the environment the kubelet gives container c: its ConfigMaps' data,
// then its env entries with $(VAR) references expanded, a Secret's value read as
// "secret" and the Pod's IP as 10.1.2.3. It fails t when a ConfigMap is missing.
func podEnv(t *testing.T, objects map[string]k8sObject, c k8sContainer) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		cm, ok := objects["ConfigMap/"+ef.ConfigMapRef.Name]
		if !ok {
			t.Fatalf("container %s: envFrom ConfigMap %s, which the directory does not hold", c.Name, ef.ConfigMapRef.Name)
		}
		maps.Copy(env, cm.Data)
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			v = "secret"
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = "10.1.2.3"
		}
		env[e.Name] = ref.ReplaceAllStringFunc(v, func(m string) string {
			if x, ok := env[ref.FindStringSubmatch(m)[1]]; ok {
				return x
			}
			return m // the kubelet leaves a reference to an undefined variable as written
		})
	}
	return env
}

// TestGatewayManifests checks the Kubernetes gateway example (kubernetes/gateway/): two
// mdproxy replicas, MDPROXY_REPLICAS their number, sharing the Redis of the directory
// through MDPROXY_REDIS_URL, with settings mdproxy accepts, probes on the admin port,
// resources, a reloadable limits file, a shutdown that fits the grace period and each
// replica's own callback URL; a Redis with maxmemory, the volatile-lru policy, a memory
// limit above maxmemory and probes; a Service to the API port; a ServiceMonitor in
// job mdproxy, which the alerts select.
func TestGatewayManifests(t *testing.T) {
	dir := filepath.Join("kubernetes", "gateway")
	objects := readObjects(t, dir)
	var gateways, redises []k8sObject
	for _, o := range objects {
		if o.Kind != "Deployment" {
			continue
		}
		for _, c := range o.Spec.Template.Spec.Containers {
			switch c.Name {
			case "mdproxy":
				gateways = append(gateways, o)
			case "redis":
				redises = append(redises, o)
			}
		}
	}
	if len(gateways) != 1 || len(redises) != 1 {
		t.Fatalf("%s: %d Deployments with an mdproxy container and %d with a redis one, want one of each", dir, len(gateways), len(redises))
	}
	gw, rd := gateways[0], redises[0]

	// Redis: its Service, and its configuration file bounded with volatile-lru.
	var redisHosts []string
	for _, o := range objects {
		if o.Kind == "Service" && labelsMatch(o.Spec.Selector, rd.Spec.Template.Metadata.Labels) {
			for _, p := range o.Spec.Ports {
				if p.Port == 6379 {
					redisHosts = append(redisHosts, o.Metadata.Name)
				}
			}
		}
	}
	if len(redisHosts) == 0 {
		t.Errorf("%s: no Service on port 6379 selects Deployment %s", dir, rd.Metadata.Name)
	}
	rc := rd.Spec.Template.Spec.Containers[0]
	var conf []string
	if len(rc.Args) > 0 {
		for _, vm := range rc.VolumeMounts {
			if filepath.Dir(rc.Args[0]) != vm.MountPath {
				continue
			}
			for _, v := range rd.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name && v.ConfigMap != nil {
					conf = strings.Fields(objects["ConfigMap/"+v.ConfigMap.Name].Data[filepath.Base(rc.Args[0])])
				}
			}
		}
	}
	maxmemory, policy := redisSettings(append(conf, rc.Args...))
	if redisBytes(maxmemory) == 0 || policy != "volatile-lru" {
		t.Errorf("%s: Redis's configuration (args %q and the file they name): maxmemory %q, maxmemory-policy %q; want a bound and volatile-lru", dir, rc.Args, maxmemory, policy)
	}
	if limit := quantityBytes(rc.Resources.Limits["memory"]); limit < redisBytes(maxmemory)*5/4 {
		t.Errorf("%s: Redis's memory limit %q, want a quarter above maxmemory %s at least (Redis's overhead is not in maxmemory)", dir, rc.Resources.Limits["memory"], maxmemory)
	}
	if rc.ReadinessProbe == nil || rc.LivenessProbe == nil || rc.Resources.Requests["cpu"] == "" || rc.Resources.Requests["memory"] == "" {
		t.Errorf("%s: redis container: readiness %v, liveness %v, requests %v; want both probes and CPU and memory requests", dir, rc.ReadinessProbe, rc.LivenessProbe, rc.Resources.Requests)
	}

	// The gateway's replicas.
	pod := gw.Spec.Template.Spec
	var c k8sContainer
	for _, x := range pod.Containers {
		if x.Name == "mdproxy" {
			c = x
		}
	}
	env := podEnv(t, objects, c)
	replicas := 1 // Kubernetes' default
	if gw.Spec.Replicas != nil {
		replicas = *gw.Spec.Replicas
	}
	if replicas < 2 || env["MDPROXY_REPLICAS"] != strconv.Itoa(replicas) {
		t.Errorf("%s: Deployment %s: replicas %d, MDPROXY_REPLICAS %q; want 2 or more, and the same number", dir, gw.Metadata.Name, replicas, env["MDPROXY_REPLICAS"])
	}
	checkRedisURL(t, dir+": Deployment "+gw.Metadata.Name, env["MDPROXY_REDIS_URL"], redisHosts, "6379")
	if cb := env["MDPROXY_BRIDGE_CALLBACK_URL"]; env["MDPROXY_BRIDGE"] != "false" && !strings.Contains(cb, "10.1.2.3") {
		t.Errorf("%s: MDPROXY_BRIDGE_CALLBACK_URL %q, want the Pod's own IP (status.podIP), so that Core reaches the replica that submitted", dir, cb)
	}
	for k := range objects["ConfigMap/"+c.EnvFrom[0].ConfigMapRef.Name].Data {
		if !strings.HasPrefix(k, "MDPROXY_") {
			t.Errorf("%s: ConfigMap key %s: want MDPROXY_ variables only", dir, k)
		}
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port != "admin" {
		t.Errorf("%s: mdproxy readiness probe %+v, want /readyz on the admin port", dir, p)
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port != "admin" {
		t.Errorf("%s: mdproxy liveness probe %+v, want /healthz on the admin port", dir, p)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: mdproxy resources %+v, want CPU and memory requests and a memory limit", dir, c.Resources)
	}

	// The limits file: a ConfigMap mounted whole; mdproxy accepts it with the settings.
	path := env["MDPROXY_LIMITS_FILE"]
	content, found := "", false
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != filepath.Dir(path) {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("%s: mdproxy mounts %s with subPath %q: a subPath mount is never updated", dir, vm.MountPath, vm.SubPath)
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				content, found = objects["ConfigMap/"+v.ConfigMap.Name].Data[filepath.Base(path)]
			}
		}
	}
	if path == "" || !found {
		t.Fatalf("%s: MDPROXY_LIMITS_FILE %q is no file of a ConfigMap mounted by the mdproxy container", dir, path)
	}
	local := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(local, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	env["MDPROXY_LIMITS_FILE"] = local
	if cfg, err := sidecar.LoadConfig(env); err != nil {
		t.Errorf("%s: mdproxy's LoadConfig of the gateway's settings = %v, want no error", dir, err)
	} else if l := cfg.Limits["file_result"]; l.Rate <= 0 {
		t.Errorf("%s: file_result's limit %+v, want a rate", dir, l)
	}

	// The shutdown: no other container in the Pod, no preStop.
	k8s := podShutdown{grace: 30 * time.Second, coreServes: -1}
	if g := pod.TerminationGracePeriodSeconds; g != nil {
		k8s.grace = time.Duration(*g) * time.Second
	}
	k8s.delay, k8s.timeout = shutdownVars(t, dir, env)
	for _, p := range k8s.problems() {
		t.Errorf("%s: Deployment %s: %s", dir, gw.Metadata.Name, p)
	}

	// The Service to the API, without the admin port (/config is not for clients), and
	// Prometheus's scrape in job mdproxy.
	api, monitored := false, false
	for _, o := range objects {
		switch {
		case o.Kind == "Service" && labelsMatch(o.Spec.Selector, gw.Spec.Template.Metadata.Labels):
			if len(o.Spec.Ports) > 0 && o.Spec.Ports[0].TargetPort == "api" {
				api = true
				for _, p := range o.Spec.Ports {
					if p.TargetPort == "admin" {
						t.Errorf("%s: the clients' Service %s has the admin port too", dir, o.Metadata.Name)
					}
				}
			}
		case o.Kind == "ServiceMonitor":
			for _, ep := range o.Spec.Endpoints {
				for _, r := range ep.Relabelings {
					monitored = monitored || ep.Port == "admin" && r.TargetLabel == "job" && r.Replacement == "mdproxy"
				}
			}
		}
	}
	if !api || !monitored {
		t.Errorf("%s: a Service whose first port targets api: %t; a ServiceMonitor of the admin port in job mdproxy: %t; want both", dir, api, monitored)
	}
}

// labelsMatch reports whether selector (a Service's labels, or a Deployment's
// {matchLabels: ...}) selects labels.
func labelsMatch(selector map[string]any, labels map[string]string) bool {
	if ml, ok := selector["matchLabels"].(map[string]any); ok {
		selector = ml
	}
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != fmt.Sprint(v) {
			return false
		}
	}
	return true
}
