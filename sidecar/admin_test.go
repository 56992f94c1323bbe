package sidecar

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/proxy"
)

func TestRunConfigEndpoint(t *testing.T) {
	t.Parallel()
	ca := sidecartest.NewCA(t, "test CA")
	server := ca.Issue(t, "mdproxy", "127.0.0.1")
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_TLS_CERT_FILE":              server.CertFile,
		"MDPROXY_TLS_KEY_FILE":               server.KeyFile,
		"MDPROXY_TRUSTED_PROXIES":            "10.1.2.3/8",
		"MDPROXY_UPSTREAM_TIMEOUT":           "90s",
		"MDPROXY_LOG_LEVEL":                  "INFO",
		"MDPROXY_FILE_RESULT_RATE":           "3", // burst 0: filled in as 3
		"MDPROXY_FILE_RESULT_BURST":          "0",
		"MDPROXY_FILE_RESULT_MAX_WAIT":       "2s",
		"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT":   "5",  // window 0: 1s
		"MDPROXY_SUBMIT_MAX_WAIT":            "1s", // no bucket: no effect
		"MDPROXY_BATCH_STATUS_CLIENT_LIMIT":  "2",
		"MDPROXY_BATCH_STATUS_CLIENT_WINDOW": "1m",
		"MDPROXY_BATCH_STATUS_DRY_RUN":       "true",
		"MDPROXY_REDIS_URL":                  "redis://:s3cret@127.0.0.1:1/0", // nothing listens: fallback
	})
	c := sidecartest.NewClient(t)
	resp, err := c.Get(in.adminURL + "/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("GET admin /config = %d, Content-Type %q; want 200 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatalf("GET admin /config: %v", err)
	}
	var got effectiveSettings
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("GET admin /config = %s: %v", raw, err)
	}

	// Every variable of Config, and nothing secret.
	for _, name := range envconf.Names[Config](EnvPrefix) {
		if _, ok := got.Variables[name]; !ok {
			t.Errorf("GET admin /config has no variable %s", name)
		}
	}
	if len(got.Variables) != len(envconf.Names[Config](EnvPrefix)) {
		t.Errorf("GET admin /config has %d variables, want %d: %v", len(got.Variables), len(envconf.Names[Config](EnvPrefix)), got.Variables)
	}
	for name, want := range map[string]any{
		"MDPROXY_UPSTREAM_URL":          up.URL,
		"MDPROXY_TLS_CERT_FILE":         server.CertFile,
		"MDPROXY_TLS_KEY_FILE":          server.KeyFile,
		"MDPROXY_TRUSTED_PROXIES":       []any{"10.0.0.0/8"},
		"MDPROXY_UPSTREAM_TIMEOUT":      "1m30s",
		"MDPROXY_UPSTREAM_DIAL_TIMEOUT": "5s",
		"MDPROXY_LIMIT_STATUS":          float64(503),
		"MDPROXY_LOG_LEVEL":             "info",
		"MDPROXY_PPROF":                 false,
		"MDPROXY_UPSTREAM_CA_FILE":      "",
		"MDPROXY_REDIS_URL":             "redis://:xxxxx@127.0.0.1:1/0",
		"MDPROXY_REPLICAS":              float64(1),
	} {
		if v := got.Variables[name]; !reflect.DeepEqual(v, want) {
			t.Errorf("GET admin /config: %s = %#v, want %#v", name, v, want)
		}
	}
	key, err := os.ReadFile(server.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if body := string(raw); strings.Contains(body, "s3cret") || strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, string(key[40:80])) {
		t.Errorf("GET admin /config = %s, want no password nor key", raw)
	}

	// Every route's effective limit.
	if len(got.Routes) != len(proxy.RouteNames()) {
		t.Errorf("GET admin /config has %d routes, want %d (every route)", len(got.Routes), len(proxy.RouteNames()))
	}
	for route, want := range map[string]routeLimit{
		"file_result":  {Rate: 3, Burst: 3, MaxWait: "2s", ClientWindow: "0s"},
		"hash_lookup":  {Rate: 10, Burst: 20, MaxWait: "0s", ClientLimit: 5, ClientWindow: "1s"},
		"batch_status": {Rate: 2, Burst: 4, MaxWait: "0s", ClientLimit: 2, ClientWindow: "1m0s", DryRun: true},
		"submit":       {MaxWait: "0s", ClientWindow: "0s"},
		"other":        {MaxWait: "0s", ClientWindow: "0s"},
	} {
		if got := got.Routes[route]; got != want {
			t.Errorf("GET admin /config: route %s = %+v, want %+v", route, got, want)
		}
	}

	// The start-up lines "settings" (one a group) and "route limits" have the same
	// content: every variable once, and every limited route.
	if err := in.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	vars := map[string]any{}
	var groups int
	var routeLines []map[string]json.RawMessage
	for _, l := range strings.Split(strings.TrimSpace(in.logs.String()), "\n") {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %s: %v", l, err)
		}
		switch string(rec["msg"]) {
		case `"settings"`:
			groups++
			for k, v := range rec {
				if strings.HasPrefix(k, EnvPrefix) {
					var x any
					_ = json.Unmarshal(v, &x)
					vars[k] = x
				}
			}
		case `"route limits"`:
			routeLines = append(routeLines, rec)
		}
	}
	if groups != len(SettingGroups) {
		t.Errorf("logs have %d settings lines, want %d (one a group):\n%s", groups, len(SettingGroups), in.logs)
	}
	if !reflect.DeepEqual(vars, got.Variables) {
		t.Errorf("settings lines = %v, want /config's %v", vars, got.Variables)
	}
	if len(routeLines) != 1 {
		t.Fatalf("logs have %d route limits lines, want 1:\n%s", len(routeLines), in.logs)
	}
	for route, want := range got.Routes {
		raw, ok := routeLines[0][route]
		if ok != want.limited() {
			t.Errorf("route limits line names %s: %v, want %v", route, ok, want.limited())
			continue
		}
		var l routeLimit
		if ok && (json.Unmarshal(raw, &l) != nil || l != want) {
			t.Errorf("route limits line: %s = %s, want %+v", route, raw, want)
		}
	}
}

// TestRunConfigAfterReload: /config shows the limits in force, those of the limits
// file once reloaded, not those at start.
func TestRunConfigAfterReload(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "limits.env")
	sidecartest.WriteFile(t, file, []byte("MDPROXY_FILE_RESULT_RATE=10\n"))
	in := startRun(t, sidecartest.NewUpstream(t).URL, map[string]string{"MDPROXY_LIMITS_FILE": file})
	c := sidecartest.NewClient(t)
	rateOf := func() float64 {
		t.Helper()
		_, body := sidecartest.Get(t, c, in.adminURL+"/config")
		var got effectiveSettings
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatalf("GET admin /config = %q: %v", sidecartest.Short(body), err)
		}
		return got.Routes["file_result"].Rate
	}
	if got := rateOf(); got != 10 {
		t.Errorf("GET admin /config: file_result rate %v at start, want 10", got)
	}
	reloaded := in.logs.Written(`"msg":"limits reloaded"`)
	sidecartest.WriteFile(t, file, []byte("MDPROXY_FILE_RESULT_RATE=3\n"))
	select {
	case <-reloaded:
	case <-time.After(safety):
		t.Fatalf("no reload logged within %v of the file's change; logs:\n%s", safety, in.logs)
	}
	if got := rateOf(); got != 3 {
		t.Errorf("GET admin /config: file_result rate %v after the reload, want 3", got)
	}
}

func TestLoadConfigPprof(t *testing.T) {
	for value, want := range map[string]bool{"": false, "false": false, "true": true, "1": true} {
		env := map[string]string{"MDPROXY_PPROF": value}
		c, err := LoadConfig(env)
		if err != nil || c.Pprof != want {
			t.Errorf("LoadConfig(%v) = Pprof %v, %v; want %v, nil", env, c != nil && c.Pprof, err, want)
		}
	}
	env := map[string]string{"MDPROXY_PPROF": "maybe"}
	_, err := LoadConfig(env)
	if !errors.As(err, new(*ConfigError)) || !sidecartest.NamesVar(err.Error(), "MDPROXY_PPROF") || !strings.Contains(err.Error(), "want") {
		t.Errorf("LoadConfig(%v) error = %v, want a *ConfigError naming MDPROXY_PPROF and what it accepts", env, err)
	}
}

func TestRunPprof(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string // "" leaves MDPROXY_PPROF unset
		want  int
	}{
		{"", http.StatusNotFound},
		{"false", http.StatusNotFound},
		{"true", http.StatusOK},
	} {
		env := map[string]string{}
		if tc.value != "" {
			env["MDPROXY_PPROF"] = tc.value
		}
		in := startRun(t, sidecartest.NewUpstream(t).URL, env)
		c := sidecartest.NewClient(t)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap"} {
			if code, body := sidecartest.Get(t, c, in.adminURL+path); code != tc.want {
				t.Errorf("MDPROXY_PPROF=%q: GET admin %s = %d %q, want %d", tc.value, path, code, sidecartest.Short(body), tc.want)
			}
		}
		if tc.value == "true" {
			// GET and HEAD only (POST to /symbol, as go tool pprof asks it).
			for _, m := range []struct{ method, path, allow string }{
				{http.MethodPost, "/debug/pprof/heap", "GET, HEAD"}, {http.MethodDelete, "/debug/pprof/trace", "GET, HEAD"},
				{http.MethodPut, "/debug/pprof/cmdline", "GET, HEAD"}, {http.MethodDelete, "/debug/pprof/symbol", "GET, HEAD, POST"},
			} {
				req, _ := http.NewRequest(m.method, in.adminURL+m.path, nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if allow := resp.Header.Values("Allow"); resp.StatusCode != http.StatusMethodNotAllowed || len(allow) != 1 || allow[0] != m.allow {
					t.Errorf("%s admin %s = %d (Allow %q), want 405 with Allow: %s", m.method, m.path, resp.StatusCode, allow, m.allow)
				}
			}
			req, _ := http.NewRequest(http.MethodHead, in.adminURL+"/debug/pprof/heap", nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("HEAD admin /debug/pprof/heap = %d, want 200", resp.StatusCode)
			}
			req, _ = http.NewRequest(http.MethodPost, in.adminURL+"/debug/pprof/symbol", strings.NewReader("0x1"))
			resp, err = c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("POST admin /debug/pprof/symbol = %d, want 200", resp.StatusCode)
			}
		}
		// Never on the proxy port: there it is Core's path.
		if code, body := sidecartest.Get(t, c, in.proxyURL+"/debug/pprof/"); code != http.StatusOK || body != "upstream /debug/pprof/\n" {
			t.Errorf("MDPROXY_PPROF=%q: GET proxy /debug/pprof/ = %d %q, want the upstream's answer", tc.value, code, sidecartest.Short(body))
		}
		if err := in.stop(t); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	}
}

func TestRunDebugLog(t *testing.T) {
	t.Parallel()
	const apikey, dataID = "apikey-0123456789abcdef", "d4t41d0123456789"
	for _, level := range []string{"info", "debug"} {
		up := sidecartest.NewUpstream(t)
		in := startRun(t, up.URL, map[string]string{
			"MDPROXY_LOG_LEVEL":                level,
			"MDPROXY_FILE_RESULT_RATE":         "1",
			"MDPROXY_FILE_RESULT_BURST":        "1",
			"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT": "10",
		})
		c := sidecartest.NewClient(t)
		get := func(path string) int {
			req, err := http.NewRequest(http.MethodGet, in.proxyURL+path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("apikey", apikey)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		// Allowed, then rejected by the bucket of 1; a per-client share keyed by the
		// apikey; a path refused before the limiter.
		codes := []int{get("/file/" + dataID), get("/file/" + dataID + "?x=1"), get("/hash/" + dataID), get("/file/%2F" + dataID)}
		if want := []int{200, 503, 200, 400}; !reflect.DeepEqual(codes, want) {
			t.Errorf("MDPROXY_LOG_LEVEL=%s: answers %v, want %v", level, codes, want)
		}
		if err := in.stop(t); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
		logs := in.logs.String()
		if strings.Contains(logs, apikey) || strings.Contains(logs, dataID) {
			t.Errorf("MDPROXY_LOG_LEVEL=%s: logs hold the apikey or a data_id:\n%s", level, logs)
		}
		var requests []map[string]any
		for _, l := range sidecartest.CheckJSONLogs(t, logs) {
			if l["msg"] == "request" {
				requests = append(requests, l)
			}
		}
		if level == "info" {
			if len(requests) != 0 {
				t.Errorf("MDPROXY_LOG_LEVEL=info: %d request lines, want none: %v", len(requests), requests)
			}
			continue
		}
		want := []struct {
			route, decision string
			status          float64
		}{
			{"file_result", "allowed", 200}, {"file_result", "rejected", 503},
			{"hash_lookup", "allowed", 200}, {"other", "none", 400},
		}
		if len(requests) != len(want) {
			t.Fatalf("MDPROXY_LOG_LEVEL=debug: %d request lines, want %d:\n%s", len(requests), len(want), logs)
		}
		for i, l := range requests {
			w := want[i]
			if l["level"] != "DEBUG" || l["route"] != w.route || l["method"] != "GET" || l["decision"] != w.decision || l["status"] != w.status {
				t.Errorf("request line %d = %v, want level DEBUG, route %s, method GET, decision %s, status %v", i, l, w.route, w.decision, w.status)
			}
			for _, key := range []string{"duration_s", "request_bytes", "response_bytes"} {
				if _, ok := l[key].(float64); !ok {
					t.Errorf("request line %d = %v, want a number %s", i, l, key)
				}
			}
			if l["status"] == float64(200) && l["response_bytes"] == float64(0) {
				t.Errorf("request line %d = %v, want the bytes of the upstream's answer", i, l)
			}
		}
	}
}
