package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/mdproxy/mdproxy/sidecar"
)

// k8sObject is the part of a Kubernetes object the gateway checks read.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Replicas    *int             `yaml:"replicas"`
		PodSelector map[string]any   `yaml:"podSelector"` // a NetworkPolicy's
		Selector    map[string]any   `yaml:"selector"`    // a Service's labels, or a Deployment's matchLabels
		Ports       []k8sServicePort `yaml:"ports"`
		Template    struct {
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
	SecurityContext *struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
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
		decodeObjects(t, f, b, objects)
	}
	return objects
}

// decodeObjects adds every object of the YAML documents of b (from where) to objects,
// by kind and name, failing t on a document that does not parse, has no kind or name,
// or names an object already there.
func decodeObjects(t *testing.T, where string, b []byte, objects map[string]k8sObject) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if o.Kind == "" && o.Metadata.Name == "" {
			continue // an empty document: a template that rendered nothing
		}
		if o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s: an object without kind or name", where)
			continue
		}
		key := o.Kind + "/" + o.Metadata.Name
		if _, dup := objects[key]; dup {
			t.Errorf("%s: %s twice", where, key)
		}
		objects[key] = o
	}
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
	if !hasKind(objects, "ServiceMonitor") {
		t.Errorf("%s: no ServiceMonitor", dir)
	}
	checkGateway(t, dir, objects, true)
}

// checkGateway checks the objects of a gateway deployment of mdproxy (from dir: a
// directory, or a rendering of the Helm chart) as TestGatewayManifests says; without
// shared (no Redis), one replica and no Redis.
func checkGateway(t *testing.T, dir string, objects map[string]k8sObject, shared bool) {
	t.Helper()
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
	if !shared {
		if len(gateways) != 1 || len(redises) != 0 {
			t.Fatalf("%s: %d Deployments with an mdproxy container and %d with a redis one, want one and none", dir, len(gateways), len(redises))
		}
		checkGatewayReplica(t, dir, objects, gateways[0], nil)
		return
	}
	if len(gateways) != 1 || len(redises) != 1 {
		t.Fatalf("%s: %d Deployments with an mdproxy container and %d with a redis one, want one of each", dir, len(gateways), len(redises))
	}
	gw, rd := gateways[0], redises[0]

	// Redis: its Service, and its configuration file bounded with volatile-lru.
	redisHosts := []string{}
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

	checkGatewayReplica(t, dir, objects, gw, redisHosts)
}

// checkGatewayReplica checks the gateway's Deployment gw among objects: with redisHosts
// (the names of the Services of its Redis), two replicas or more sharing it; with none,
// one replica without Redis.
func checkGatewayReplica(t *testing.T, dir string, objects map[string]k8sObject, gw k8sObject, redisHosts []string) {
	t.Helper()
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
	if redisHosts == nil {
		if replicas != 1 || env["MDPROXY_REDIS_URL"] != "" {
			t.Errorf("%s: Deployment %s: replicas %d, MDPROXY_REDIS_URL %q; want one replica without Redis", dir, gw.Metadata.Name, replicas, env["MDPROXY_REDIS_URL"])
		}
	} else {
		if replicas < 2 || env["MDPROXY_REPLICAS"] != strconv.Itoa(replicas) {
			t.Errorf("%s: Deployment %s: replicas %d, MDPROXY_REPLICAS %q; want 2 or more, and the same number", dir, gw.Metadata.Name, replicas, env["MDPROXY_REPLICAS"])
		}
		checkRedisURL(t, dir+": Deployment "+gw.Metadata.Name, env["MDPROXY_REDIS_URL"], redisHosts, "6379")
	}
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
	if !api || (hasKind(objects, "ServiceMonitor") && !monitored) {
		t.Errorf("%s: a Service whose first port targets api: %t; a ServiceMonitor of the admin port in job mdproxy: %t; want both", dir, api, monitored)
	}
	checkContainer(t, dir, objects, gw, c, env)
	checkSelectors(t, dir, objects)
}

// hasKind reports whether objects holds an object of kind.
func hasKind(objects map[string]k8sObject, kind string) bool {
	for _, o := range objects {
		if o.Kind == kind {
			return true
		}
	}
	return false
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
