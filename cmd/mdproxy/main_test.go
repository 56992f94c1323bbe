package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/internal/child"
	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestMain fails the package when a test leaves a goroutine behind: a server, a
// connection or a paced reader that was not stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { bintest.RemoveBuilt() }))
}

// safety bounds a wait that only a broken program would reach; a test never passes or
// fails because of how long it took.
const safety = sidecartest.Safety

func TestBinary(t *testing.T) {
	t.Parallel()
	// Stamped as the Dockerfile stamps an image, from its VERSION and REVISION.
	const version, revision = "1.2.3-test", "0123456789abcdef"
	bin := bintest.Build(t, bintest.Module+"/cmd/mdproxy", "-ldflags", "-X github.com/mdproxy/mdproxy/metrics.Version="+version+
		" -X github.com/mdproxy/mdproxy/metrics.Revision="+revision)

	// The command line: --version and --help print to stdout and exit 0 without
	// serving; any other argument exits 2 with a usage line on stderr.
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string // each must appear
		stderr []string // each must appear; none: stderr must be empty
	}{
		{args: []string{"--version"}, stdout: []string{"mdproxy " + version + " (revision " + revision + ", " + runtime.Version() + ")\n"}},
		{args: []string{"-version"}, stdout: []string{"mdproxy " + version + " (revision " + revision + ", " + runtime.Version() + ")\n"}},
		{args: []string{"--help"}, stdout: []string{"rate-limiting reverse proxy", "MDPROXY_UPSTREAM_URL", "MDPROXY_<ROUTE>_RATE", "file_result", "docs/configuration.md", "-version"}},
		{args: []string{"-h"}, stdout: []string{"rate-limiting reverse proxy", "MDPROXY_LISTEN_ADDR", "docs/configuration.md"}},
		{args: []string{"--help=false"}, code: 2, stderr: []string{`"--help=false"`, "usage: mdproxy"}},
		{args: []string{"--verbose"}, code: 2, stderr: []string{"-verbose", "usage: mdproxy"}},
		{args: []string{"serve"}, code: 2, stderr: []string{`"serve"`, "usage: mdproxy"}},
		{args: []string{"--version", "now"}, code: 2, stderr: []string{`"now"`, "usage: mdproxy"}},
	} {
		t.Run("args/"+strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			// Should it serve instead, it does so on free ports until the safety bound.
			res := bintest.Run(t, bin, map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0"}, tc.args...)
			stdout, stderr := res.Stdout, res.Stderr
			if res.Code != tc.code {
				t.Errorf("mdproxy %q exit code = %d, want %d; stderr:\n%s", tc.args, res.Code, tc.code, stderr)
			}
			for _, want := range tc.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("mdproxy %q stdout = %q, want it to contain %q", tc.args, stdout, want)
				}
			}
			if len(tc.stdout) == 0 && len(stdout) != 0 {
				t.Errorf("mdproxy %q stdout = %q, want nothing", tc.args, stdout)
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("mdproxy %q stderr = %q, want it to contain %q", tc.args, stderr, want)
				}
			}
			if len(tc.stderr) == 0 && len(stderr) != 0 {
				t.Errorf("mdproxy %q stderr = %q, want nothing", tc.args, stderr)
			}
		})
	}

	// A bad setting: exit 2 before listening, one JSON line on stderr (as every log
	// line) whose err names the variable.
	for _, tc := range []struct{ name, value string }{
		{"MDPROXY_LIMIT_STATUS", "abc"},
		{"MDPROXY_LIMIT_STATUS", "500"},
		{"MDPROXY_UPSTREAM_URL", "ftp://x"},
		{"MDPROXY_LISTEN_ADDR", ""},
		{"MDPROXY_FILE_RESULT_RATE", "-1"},
		{"MDPROXY_HASH_LOOKUP_MAX_WAIT", "5"},
		{"MDPROXY_SHUTDOWN_TIMEOUT", "x"},
		{"MDPROXY_TLS_CERT_FILE", "/nonexistent/tls.crt"},   // without its key
		{"MDPROXY_UPSTREAM_CA_FILE", "/nonexistent/ca.pem"}, // with the default http upstream
		{"MDPROXY_PPROF", "maybe"},
	} {
		t.Run("exit2/"+tc.name+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			res := bintest.Run(t, bin, map[string]string{tc.name: tc.value})
			stdout := res.Stdout
			if res.Code != 2 {
				t.Errorf("mdproxy with %s=%q exit code = %d, want 2; stderr:\n%s", tc.name, tc.value, res.Code, res.Stderr)
			}
			msg := res.Stderr
			if strings.Count(msg, "\n") != 1 || !strings.HasSuffix(msg, "\n") {
				t.Errorf("mdproxy with %s=%q stderr = %q, want one line", tc.name, tc.value, msg)
			}
			var line struct{ Level, Msg, Err string }
			if err := json.Unmarshal([]byte(msg), &line); err != nil {
				t.Errorf("mdproxy with %s=%q stderr = %q, want a JSON line: %v", tc.name, tc.value, msg, err)
			}
			if line.Level != "ERROR" || line.Msg == "" || !sidecartest.NamesVar(line.Err, tc.name) {
				t.Errorf("mdproxy with %s=%q stderr = %q, want level ERROR, a msg and an err naming %s", tc.name, tc.value, msg, tc.name)
			}
			if len(stdout) != 0 {
				t.Errorf("mdproxy with %s=%q stdout = %q, want nothing", tc.name, tc.value, stdout)
			}
		})
	}

	// Several bad settings: exit 2, still one JSON line, whose err names every one of
	// them, one a line within it: a bad value of the environment and of the limits file,
	// and a variable that has no place in the file.
	t.Run("exit2/three bad variables", func(t *testing.T) {
		t.Parallel()
		limits := filepath.Join(t.TempDir(), "limits.env")
		if err := os.WriteFile(limits, []byte("MDPROXY_FILE_RESULT_BURST=-2\nMDPROXY_ADMIN_ADDR=:1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		res := bintest.Run(t, bin, map[string]string{"MDPROXY_CLIENT_KEYS_MAX": "0", "MDPROXY_LIMITS_FILE": limits})
		stdout := res.Stdout
		if res.Code != 2 {
			t.Errorf("mdproxy with three bad variables exit code = %d, want 2; stderr:\n%s", res.Code, res.Stderr)
		}
		msg := res.Stderr
		var line struct{ Level, Err string }
		if strings.Count(msg, "\n") != 1 || json.Unmarshal([]byte(msg), &line) != nil || line.Level != "ERROR" {
			t.Fatalf("mdproxy with three bad variables stderr = %q, want one JSON line of level ERROR", msg)
		}
		for _, want := range []string{
			`MDPROXY_CLIENT_KEYS_MAX="0": want a whole number of client keys per route from 1 to 10000000`,
			"limits file " + limits + `: MDPROXY_FILE_RESULT_BURST="-2": want a whole number of requests >= 0`,
			"limits file " + limits + `: MDPROXY_ADMIN_ADDR=":1": want only route limit variables`,
		} {
			if !strings.Contains(line.Err, want) {
				t.Errorf("mdproxy with three bad variables err = %q, want it to contain %q", line.Err, want)
			}
		}
		if n := strings.Count(line.Err, "\n") + 1; n != 3 {
			t.Errorf("mdproxy with three bad variables err = %q, want 3 lines, one a variable", line.Err)
		}
		if len(stdout) != 0 {
			t.Errorf("mdproxy with three bad variables stdout = %q, want nothing", stdout)
		}
	})

	// Any other failure, here an address in use: exit 1.
	t.Run("exit1/listen address in use", func(t *testing.T) {
		t.Parallel()
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		res := bintest.Run(t, bin, map[string]string{"MDPROXY_LISTEN_ADDR": busy.Addr().String(), "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0"})
		stderr := res.Stderr
		if res.Code != 1 {
			t.Errorf("mdproxy on a busy address exit code = %d, want 1; stderr:\n%s", res.Code, stderr)
		}
		// The log lines, then the failure's, all JSON.
		lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
		var last struct{ Level, Err string }
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Level != "ERROR" || !sidecartest.NamesVar(last.Err, "MDPROXY_LISTEN_ADDR") {
			t.Errorf("mdproxy on a busy address stderr = %q, want a last JSON line of level ERROR whose err names MDPROXY_LISTEN_ADDR (%v)", stderr, err)
		}
		sidecartest.CheckJSONLogs(t, stderr)
	})

	// A signal: graceful shutdown and exit 0.
	for _, sig := range []os.Signal{syscall.SIGTERM, os.Interrupt} {
		t.Run("exit0/"+sig.String(), func(t *testing.T) {
			t.Parallel()
			up := sidecartest.NewUpstream(t)
			c := sidecartest.NewClient(t)
			p := bintest.Start(t, bin, map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_UPSTREAM_URL": up.URL,
				"MDPROXY_SHUTDOWN_DELAY": "0s"}, // the delay is TestShutdownDelay's
				child.Options{Ready: "mdproxy serving"})
			if v, r := p.Field("version"), p.Field("revision"); v != version || r != revision {
				t.Errorf("mdproxy serving line: version %q, revision %q; want %q, %q", v, r, version, revision)
			}
			if code, body := sidecartest.Get(t, c, "http://"+p.Field("listen")+"/file/x"); code != http.StatusOK || body != "upstream /file/x\n" {
				t.Errorf("GET proxy /file/x = %d %q, want 200 from the upstream", code, body)
			}
			if code, _ := sidecartest.Get(t, c, "http://"+p.Field("admin")+"/readyz"); code != http.StatusOK {
				t.Errorf("GET admin /readyz = %d, want 200", code)
			}
			p.Send(t, sig)
			if code := p.Wait(t); code != 0 {
				t.Errorf("mdproxy after %v exit code = %d, want 0", sig, code)
			}
			logs := sidecartest.CheckJSONLogs(t, p.Logs.String())
			if last := logs[len(logs)-1]["msg"]; last != "mdproxy stopped" {
				t.Errorf("mdproxy's last log line = %q, want %q; logs:\n%s", last, "mdproxy stopped", p.Logs.String())
			}
		})
	}
}

// TestGCPercent: mdproxy collects garbage at a 200% heap target (gcPercent) unless GOGC
// is set, which then decides; go_gc_gogc_percent, the Go collector's metric, shows
// the target in effect.
func TestGCPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want float64
	}{
		{nil, gcPercent},
		{map[string]string{"GOGC": "50"}, 50},
		{map[string]string{"GOGC": "100"}, 100},
	} {
		p := startBinary(t, "", tc.env)
		if got := p.metric(t, "go_gc_gogc_percent"); got != tc.want {
			t.Errorf("GOGC %q: go_gc_gogc_percent = %v, want %v", tc.env["GOGC"], got, tc.want)
		}
	}
}
