package sidecar

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestUpstreamUnreachableWarned: a Core that cannot be reached at start is named in a
// warning, mdproxy_upstream_up is 0 and /readyz still answers 200; once Core answers,
// the gauge is 1 (checked on a Core that is up).
func TestUpstreamUnreachableWarned(t *testing.T) {
	// A port that refuses: listened on, then closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	in := startRun(t, dead, map[string]string{"MDPROXY_UPSTREAM_CHECK_INTERVAL": "10s"})
	select {
	case <-in.logs.Written("Core cannot be reached at start"):
	case <-time.After(safety):
		t.Fatalf("no warning that Core cannot be reached within %v:\n%s", safety, in.logs)
	}
	c := sidecartest.NewClient(t)
	if code, body := sidecartest.Get(t, c, in.adminURL+"/metrics"); code != 200 || !strings.Contains(body, "mdproxy_upstream_up 0") {
		t.Errorf("GET /metrics = %d, want mdproxy_upstream_up 0 in it:\n%s", code, sidecartest.Short(body))
	}
	if code, _ := sidecartest.Get(t, c, in.adminURL+"/readyz"); code != 200 {
		t.Errorf("GET /readyz = %d with Core away, want 200 (readiness does not follow Core)", code)
	}

	seen := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			select {
			case seen <- struct{}{}:
			default:
			}
		}
		w.WriteHeader(http.StatusServiceUnavailable) // busy, but reachable
	}))
	defer up.Close()
	in2 := startRun(t, up.URL, map[string]string{"MDPROXY_UPSTREAM_CHECK_INTERVAL": "10s"})
	select {
	case <-seen:
	case <-time.After(safety):
		t.Fatalf("Core's /readyz not asked within %v", safety)
	}
	// The gauge is set once the answer is read; scrape until it is.
	deadline := time.Now().Add(safety)
	for {
		_, body := sidecartest.Get(t, c, in2.adminURL+"/metrics")
		if v, ok := sidecartest.ParseMetrics(t, body).Value("mdproxy_upstream_up"); ok && v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mdproxy_upstream_up not 1 within %v", safety)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Contains(in2.logs.String(), "cannot be reached") {
		t.Errorf("a warning that Core cannot be reached, with Core answering 503:\n%s", in2.logs)
	}
}

// TestLogFormat: MDPROXY_LOG_FORMAT=text writes key=value lines, none of them JSON,
// the settings one line a group; a bad value stops start-up naming the variable; the
// default for a writer that is no terminal is JSON.
func TestLogFormat(t *testing.T) {
	in := startRun(t, "http://127.0.0.1:1", map[string]string{"MDPROXY_LOG_FORMAT": "text", "MDPROXY_FILE_RESULT_RAT": "1"})
	if err := in.stop(t); err != nil {
		t.Fatalf("Run = %v", err)
	}
	logs := in.logs.String()
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if strings.HasPrefix(line, "{") || !strings.Contains(line, "level=") || len(line) > 2000 {
			t.Errorf("MDPROXY_LOG_FORMAT=text: line %q, want a key=value line under 2000 bytes", line)
		}
	}
	for _, want := range []string{`msg=settings group="Timeouts and shutdown"`, "MDPROXY_UPSTREAM_TIMEOUT=1m0s",
		`msg="route limits" file_result.rate_per_s=10`,
		`level=WARN msg="unknown variable ignored" variable=MDPROXY_FILE_RESULT_RAT hint="did you mean MDPROXY_FILE_RESULT_RATE?"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("MDPROXY_LOG_FORMAT=text: no %q in the logs:\n%s", want, logs)
		}
	}
	if _, err := LoadConfig(map[string]string{"MDPROXY_LOG_FORMAT": "yaml"}); err == nil || !strings.Contains(err.Error(), "MDPROXY_LOG_FORMAT") {
		t.Errorf("LoadConfig(MDPROXY_LOG_FORMAT=yaml) = %v, want an error naming it", err)
	}
	if got := LogFormat(&bytes.Buffer{}, ""); got != LogJSON {
		t.Errorf("LogFormat(a buffer, unset) = %q, want %q", got, LogJSON)
	}
	var b bytes.Buffer
	LogFailure(&b, map[string]string{"MDPROXY_LOG_FORMAT": "text"}, errors.New("MDPROXY_A=\"x\": want y\nMDPROXY_B=\"z\": want w"), 2)
	if got := b.String(); strings.Count(got, "\n") != 2 || strings.Contains(got, `\n`) || !strings.Contains(got, "exit_code=2") {
		t.Errorf("LogFailure in text = %q, want two lines, no literal \\n, exit_code=2", got)
	}
}
