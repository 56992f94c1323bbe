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
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

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
	} {
		if !strings.Contains(all.String(), m) {
			t.Errorf("no panel query uses %s", m)
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
	for _, want := range []string{"MdproxyDown", "MdproxyRejectionRatioHigh", "MdproxyUpstreamErrors", "CoreScanQueueFull", "MdproxyUpstreamLatencyHigh", "MdproxyBridgeCallbacksStopped"} {
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
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].TargetPort != "api" {
		t.Errorf("Service ports %+v, want the API port to target the proxy (api)", svc.Spec.Ports)
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
