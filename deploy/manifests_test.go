package deploy

import (
	"fmt"
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

	"github.com/mdproxy/mdproxy/sidecar"
)

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

// mdproxy's defaults of the shutdown variables (docs/configuration.md).
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
