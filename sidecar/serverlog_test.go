package sidecar

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestServerErrorLog: net/http's line for a failed TLS handshake is logged without the
// client's address and at most once a second, with the number of handshakes it stands
// for; other lines pass unchanged.
func TestServerErrorLog(t *testing.T) {
	var buf bytes.Buffer
	l := serverErrorLog(slog.New(slog.NewJSONHandler(&buf, nil)))
	for i := range 50 {
		l.Printf("http: TLS handshake error from 192.0.2.%d:41886: client sent an HTTP request to an HTTPS server", i)
	}
	l.Printf("http: Accept error: too many open files")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log lines = %d:\n%s\nwant 2 (one handshake line, one accept error)", len(lines), buf.String())
	}
	if strings.Contains(buf.String(), "192.0.2.") {
		t.Errorf("logs = %s, want no client address", buf.String())
	}
	var first struct {
		Msg, Reason string
		Handshakes  int
	}
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first.Msg != "TLS handshake failed" ||
		first.Reason != "client sent an HTTP request to an HTTPS server" || first.Handshakes != 1 {
		t.Errorf("first line = %s, %v; want the handshake line with its reason", lines[0], err)
	}
	if !strings.Contains(lines[1], `"msg":"http: Accept error: too many open files"`) {
		t.Errorf("second line = %s, want the accept error unchanged", lines[1])
	}
}
