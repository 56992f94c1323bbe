package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/mdproxy/mdproxy/internal/child"
	"github.com/mdproxy/mdproxy/proxy"
	"github.com/mdproxy/mdproxy/sidecar"
)

// chartDir is mdproxy's Helm chart.
var chartDir = filepath.Join("helm", "mdproxy")

// renderer is the chart's renderer, tools/helm (Helm's own packages, in a module of its
// own), built once for the package's tests and removed by TestMain.
var renderer struct {
	once      sync.Once
	dir, path string
	err       error
}

// helmTool returns the path of the renderer, building it on first use. When it cannot
// be built (no module proxy and an empty module cache) the test is skipped saying so,
// except on CI (CI set), where .ci/run built it already and a failure is a failure.
func helmTool(t *testing.T) string {
	t.Helper()
	renderer.once.Do(func() {
		if renderer.dir, renderer.err = os.MkdirTemp("", "helmtool-"); renderer.err != nil {
			return
		}
		// tools/helm is a module of its own, built from its directory.
		renderer.path, renderer.err = child.Build(context.Background(), renderer.dir, filepath.Join("..", "tools", "helm"))
	})
	if renderer.err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the Helm chart's renderer: %v", renderer.err)
		}
		t.Skipf("the Helm chart's renderer cannot be built, so the chart is not checked: %v", renderer.err)
	}
	return renderer.path
}

// removeHelmTool removes the renderer that helmTool built.
func removeHelmTool() {
	if renderer.dir != "" {
		os.RemoveAll(renderer.dir)
	}
}

// helmRun runs the renderer with args, returning its stdout, stderr and whether it
// exited 0.
func helmRun(t *testing.T, args ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(helmTool(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		if _, exit := err.(*exec.ExitError); !exit {
			t.Fatalf("helm %q: %v", args, err)
		}
	}
	return out.String(), errOut.String(), err == nil
}

// renderChart renders the chart with the --set expressions and returns its objects.
func renderChart(t *testing.T, sets ...string) map[string]k8sObject {
	t.Helper()
	args := []string{"template"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, errOut, ok := helmRun(t, append(args, chartDir)...)
	if !ok {
		t.Fatalf("helm template %v: %s", sets, errOut)
	}
	objects := map[string]k8sObject{}
	decodeObjects(t, fmt.Sprintf("helm template %v", sets), []byte(out), objects)
	return objects
}

// chartCases are the values the chart is checked with: its defaults, and two replicas
// sharing the chart's Redis with a ServiceMonitor.
var chartCases = []struct {
	name   string
	sets   []string
	shared bool
}{
	{"defaults", nil, false},
	{"redis", []string{"redis.enabled=true", "replicaCount=2", "serviceMonitor.enabled=true"}, true},
}

// TestHelmLint: helm lint --strict's rules pass on the chart, with each case's values.
func TestHelmLint(t *testing.T) {
	for _, tc := range chartCases {
		args := []string{"lint"}
		for _, s := range tc.sets {
			args = append(args, "--set", s)
		}
		if out, errOut, ok := helmRun(t, append(args, chartDir)...); !ok {
			t.Errorf("helm lint %v: %s%s", tc.sets, out, errOut)
		}
	}
}

// TestHelmChart checks the chart's manifests, rendered with its defaults and with
// Redis, as the gateway's raw ones (checkGateway: probes, resources, limits file,
// shutdown, Services, ServiceMonitor, security settings, known variables, selectors),
// and that every object the cases name is there.
func TestHelmChart(t *testing.T) {
	want := map[string][]string{
		"defaults": {"Deployment/mdproxy", "Service/mdproxy", "Service/mdproxy-admin", "ConfigMap/mdproxy", "ConfigMap/mdproxy-limits", "NetworkPolicy/mdproxy"},
		"redis": {"Deployment/mdproxy", "Deployment/mdproxy-redis", "Service/mdproxy-redis", "Secret/mdproxy-redis", "ConfigMap/mdproxy-redis",
			"NetworkPolicy/mdproxy-redis", "PodDisruptionBudget/mdproxy", "ServiceMonitor/mdproxy"},
	}
	for _, tc := range chartCases {
		t.Run(tc.name, func(t *testing.T) {
			objects := renderChart(t, tc.sets...)
			for _, key := range want[tc.name] {
				if _, ok := objects[key]; !ok {
					t.Errorf("helm template %v: no %s", tc.sets, key)
				}
			}
			if !tc.shared && hasKind(objects, "PodDisruptionBudget") {
				t.Errorf("helm template %v: a PodDisruptionBudget of one replica blocks every drain", tc.sets)
			}
			checkGateway(t, "helm template "+strings.Join(tc.sets, ","), objects, tc.shared)
		})
	}
}

// TestHelmChartRefuses: values that cannot work stop the rendering with a message that
// names the value.
func TestHelmChartRefuses(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"replicaCount=2", "replicaCount 2"},
		{"env.MDPROXY_LISTEN_ADDR=:1", "ports.api"},
		{"env.GOMEMLIMIT=1GiB", "env.GOMEMLIMIT"},
		{"limits.FILE_RESULT_RATE=1", "limits.FILE_RESULT_RATE"},
	} {
		if _, errOut, ok := helmRun(t, "template", "--set", tc.set, chartDir); ok || !strings.Contains(errOut, tc.want) {
			t.Errorf("helm template --set %s: exit 0 %t, stderr %q; want a failure naming %s", tc.set, ok, errOut, tc.want)
		}
	}
}

// knownVariable reports whether mdproxy reads the variable name: one of sidecar.Settings,
// or a route's limit variable, MDPROXY_<ROUTE>_<SETTING> with a SETTING of
// sidecar.LimitSettings.
func knownVariable(name string) bool {
	for _, s := range sidecar.Settings() {
		if s.Name == name {
			return true
		}
	}
	for _, route := range proxy.RouteNames() {
		for _, setting := range sidecar.LimitSettings() {
			if name == sidecar.EnvPrefix+strings.ToUpper(route)+"_"+setting {
				return true
			}
		}
	}
	return false
}

func TestKnownVariable(t *testing.T) {
	for name, want := range map[string]bool{
		"MDPROXY_FILE_RESULT_RATE": true, "MDPROXY_HASH_LOOKUP_DRY_RUN": true, "MDPROXY_STORE_TTL": true,
		"MDPROXY_FILE_RESULT_RAT": false, "MDPROXY_NO_SUCH_ROUTE_RATE": false, "MDPROXY_STORE_TT": false,
	} {
		if got := knownVariable(name); got != want {
			t.Errorf("knownVariable(%s) = %t, want %t", name, got, want)
		}
	}
}

// checkContainer checks the mdproxy container c of Deployment d, whose environment is
// env: probes on a port it declares, the security settings of deploy/kubernetes/, and
// every MDPROXY_ variable of its environment and limits file one that mdproxy reads.
func checkContainer(t *testing.T, where string, objects map[string]k8sObject, d k8sObject, c k8sContainer, env map[string]string) {
	t.Helper()
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for _, p := range []*k8sProbe{c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && p.HTTPGet != nil && !ports[p.HTTPGet.Port] {
			t.Errorf("%s: %s: a probe on port %q, which the container does not declare", where, d.Metadata.Name, p.HTTPGet.Port)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("%s: %s: mdproxy's securityContext %+v, want runAsNonRoot, no privilege escalation, a read-only root file system and every capability dropped", where, d.Metadata.Name, sc)
	}
	names := []string{}
	for k := range env {
		names = append(names, k)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		for _, content := range objects["ConfigMap/"+v.ConfigMap.Name].Data {
			for line := range strings.SplitSeq(content, "\n") {
				if k, _, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
					names = append(names, k)
				}
			}
		}
	}
	for _, k := range names {
		if strings.HasPrefix(strings.ToUpper(k), sidecar.EnvPrefix) && !knownVariable(k) {
			t.Errorf("%s: %s: %s is no variable of mdproxy's", where, d.Metadata.Name, k)
		}
	}
}

// checkSelectors checks that every Deployment's selector selects its Pods, that every
// Service, NetworkPolicy and PodDisruptionBudget selects the Pods of exactly one
// Deployment, and that every ServiceMonitor selects a Service with the port it scrapes.
func checkSelectors(t *testing.T, where string, objects map[string]k8sObject) {
	t.Helper()
	pods := map[string]map[string]string{} // Deployment: its Pods' labels
	for key, o := range objects {
		if o.Kind == "Deployment" {
			pods[key] = o.Spec.Template.Metadata.Labels
			if !labelsMatch(o.Spec.Selector, o.Spec.Template.Metadata.Labels) {
				t.Errorf("%s: %s: selector %v does not select its Pods' labels %v", where, key, o.Spec.Selector, o.Spec.Template.Metadata.Labels)
			}
		}
	}
	selected := func(selector map[string]any) []string {
		var out []string
		for d, labels := range pods {
			if labelsMatch(selector, labels) {
				out = append(out, d)
			}
		}
		return out
	}
	for key, o := range objects {
		var sel map[string]any
		switch o.Kind {
		case "Service", "PodDisruptionBudget":
			sel = o.Spec.Selector
		case "NetworkPolicy":
			sel = o.Spec.PodSelector
		case "ServiceMonitor":
			found := false
			for _, svc := range objects {
				if svc.Kind != "Service" || !labelsMatch(o.Spec.Selector, svc.Metadata.Labels) {
					continue
				}
				for _, ep := range o.Spec.Endpoints {
					found = found || slices.ContainsFunc(svc.Spec.Ports, func(p k8sServicePort) bool { return p.Name == ep.Port })
				}
			}
			if !found {
				t.Errorf("%s: %s selects no Service with the port it scrapes", where, key)
			}
			continue
		default:
			continue
		}
		if d := selected(sel); len(d) != 1 {
			t.Errorf("%s: %s selects the Pods of %v, want those of one Deployment", where, key, d)
		}
	}
}

// TestHelmChartMemory: the chart's mdproxy container, with its defaults and with Redis,
// sets GOMEMLIMIT and its memory limit by the memory table of docs/operations.md, as
// the raw manifests do (checkMemory).
func TestHelmChartMemory(t *testing.T) {
	total := readmeMemoryTotal(t)
	for _, tc := range chartCases {
		if n := checkMemory(t, "helm template "+strings.Join(tc.sets, ","), renderChart(t, tc.sets...), total); n != 1 {
			t.Errorf("helm template %v: %d mdproxy containers, want 1", tc.sets, n)
		}
	}
}
