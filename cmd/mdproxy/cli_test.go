package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/joho/godotenv"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/sidecar"
)

// TestHelpListsEverySetting: --help names every variable of the settings table with
// its unit and default, and every route's default limit.
func TestHelpListsEverySetting(t *testing.T) {
	h := help()
	for _, s := range sidecar.Settings() {
		want := s.Name + "  [" + s.Unit + "; default " + s.DefaultWords()
		if !strings.Contains(h, want) {
			t.Errorf("--help has no %q", want)
		}
	}
	for _, d := range sidecar.RouteLimitDefaults() {
		if !strings.Contains(h, d.Route) {
			t.Errorf("--help does not name route %s", d.Route)
		}
	}
	if !strings.Contains(h, "file_result          10            20") {
		t.Errorf("--help does not give file_result's default limit (10/s, burst 20):\n%s", h)
	}
}

// TestBinaryUnknownVariables: a misspelt limit is named with the variable it most
// likely meant, a lower-case one too; Kubernetes' variables of a Service named mdproxy
// are not reported; /config lists the unknown ones; the format is text when asked.
func TestBinaryUnknownVariables(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	p := startBinary(t, up.URL, map[string]string{
		"MDPROXY_FILE_RESULT_RAT":  "1",
		"mdproxy_hash_lookup_rate": "1",
		"MDPROXY_PORT":             "tcp://10.0.0.1:8009", "MDPROXY_PORT_8009_TCP": "tcp://10.0.0.1:8009",
		"MDPROXY_PORT_8009_TCP_PROTO": "tcp", "MDPROXY_PORT_8009_TCP_PORT": "8009",
		"MDPROXY_PORT_8009_TCP_ADDR": "10.0.0.1", "MDPROXY_SERVICE_HOST": "10.0.0.1",
		"MDPROXY_SERVICE_PORT": "8009", "MDPROXY_SERVICE_PORT_HTTP": "8009",
	})
	c := sidecartest.NewClient(t)
	_, body := sidecartest.Get(t, c, p.adminURL+"/config")
	var cfg struct {
		Unknown []string `json:"unknown_variables"`
	}
	if err := json.Unmarshal([]byte(body), &cfg); err != nil {
		t.Fatalf("GET /config: %v\n%s", err, body)
	}
	if want := []string{"MDPROXY_FILE_RESULT_RAT", "mdproxy_hash_lookup_rate"}; !reflect.DeepEqual(cfg.Unknown, want) {
		t.Errorf("/config unknown_variables = %v, want %v", cfg.Unknown, want)
	}
	select { // the last of the warnings, logged after "mdproxy serving"
	case <-p.logs.Written("did you mean MDPROXY_HASH_LOOKUP_RATE?"):
	case <-time.After(safety):
		t.Fatalf("no warning naming mdproxy_hash_lookup_rate within %v:\n%s", safety, p.logs)
	}
	logs := p.logs.String()
	lines := sidecartest.CheckJSONLogs(t, logs)
	hints := map[string]string{}
	for _, l := range lines {
		if l["msg"] == "unknown variable ignored" {
			if l["level"] != "WARN" {
				t.Errorf("unknown variable line at %v, want WARN", l["level"])
			}
			v, _ := l["variable"].(string)
			h, _ := l["hint"].(string)
			if _, twice := hints[v]; twice {
				t.Errorf("%s warned of twice", v)
			}
			hints[v] = h
		}
	}
	want := map[string]string{
		"MDPROXY_FILE_RESULT_RAT":  "did you mean MDPROXY_FILE_RESULT_RATE?",
		"mdproxy_hash_lookup_rate": "did you mean MDPROXY_HASH_LOOKUP_RATE?",
	}
	if !maps.Equal(hints, want) {
		t.Errorf("unknown variable warnings = %v, want %v (Kubernetes' variables silent)\n%s", hints, want, logs)
	}
}

// TestBinaryExampleSettings starts mdproxy with deploy/mdproxy.env, every line
// uncommented (the addresses and Core set for the test), and wants it to start and
// answer /config as mdproxy started without it does (unknown_variables empty
// included): the file holds every variable at its default.
func TestBinaryExampleSettings(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "mdproxy.env"))
	if err != nil {
		t.Fatal(err)
	}
	var uncommented []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "#MDPROXY_") {
			uncommented = append(uncommented, strings.TrimPrefix(line, "#"))
		}
	}
	if len(uncommented) < len(sidecar.Settings()) {
		t.Fatalf("deploy/mdproxy.env has %d variables, want at least %d", len(uncommented), len(sidecar.Settings()))
	}
	file, err := godotenv.Unmarshal(strings.Join(uncommented, "\n"))
	if err != nil {
		t.Fatalf("deploy/mdproxy.env uncommented: %v", err)
	}
	for _, s := range sidecar.Settings() {
		if _, ok := file[s.Name]; !ok && !strings.Contains(s.Name, "<ROUTE>") {
			t.Errorf("deploy/mdproxy.env leaves out %s", s.Name)
		}
	}
	// Set for the test: free ports, and a Core that answers.
	for _, k := range []string{"MDPROXY_LISTEN_ADDR", "MDPROXY_ADMIN_ADDR", "MDPROXY_BRIDGE_LISTEN_ADDR", "MDPROXY_UPSTREAM_URL", "MDPROXY_LOG_FORMAT"} {
		delete(file, k)
	}
	up := sidecartest.NewUpstream(t)
	config := func(env map[string]string) map[string]any {
		p := startBinary(t, up.URL, env)
		_, body := sidecartest.Get(t, sidecartest.NewClient(t), p.adminURL+"/config")
		var got map[string]any
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("GET /config: %v\n%s", err, body)
		}
		vars := got["variables"].(map[string]any)
		for _, k := range []string{"MDPROXY_LISTEN_ADDR", "MDPROXY_ADMIN_ADDR", "MDPROXY_BRIDGE_LISTEN_ADDR"} {
			delete(vars, k) // free ports, the same setting in both
		}
		return got
	}
	// startBinary turns the check of Core off and the shutdown delay to 0 unless told;
	// the file holds their defaults.
	withFile, without := config(file), config(map[string]string{"MDPROXY_UPSTREAM_CHECK_INTERVAL": "10s", "MDPROXY_SHUTDOWN_DELAY": "5s"})
	if !reflect.DeepEqual(withFile, without) {
		t.Errorf("/config with deploy/mdproxy.env = %v\nwant as without it: %v", withFile, without)
	}
}
