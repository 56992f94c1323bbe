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
// for; other lines pass unchanged but for the client's address.
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

// TestServerErrorLogNoAddress: no line names the client's address, whether net/http puts
// it in the line (a handshake, a panic) or in a connection's error (a handshake that
// times out or is reset names both ends: "read tcp local->remote: ..."), IPv6 included.
func TestServerErrorLogNoAddress(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"http: TLS handshake error from 192.0.2.7:41886: read tcp 198.51.100.1:8008->192.0.2.7:41886: read: connection reset by peer",
			"read tcp: read: connection reset by peer"},
		{"http: TLS handshake error from 192.0.2.7:41886: read tcp 198.51.100.1:8008->192.0.2.7:41886: i/o timeout",
			"read tcp: i/o timeout"},
		{"http: TLS handshake error from [2001:db8::7]:41886: write tcp6 [2001:db8::1]:8008->[2001:db8::7]:41886: write: broken pipe",
			"write tcp6: write: broken pipe"},
		{"http: panic serving 192.0.2.7:41886: runtime error: index out of range\ngoroutine 7 [running]:",
			"http: panic serving: runtime error: index out of range\ngoroutine 7 [running]:"},
		{"http: Accept error: accept tcp 198.51.100.1:8008: accept4: too many open files; retrying in 5ms",
			"http: Accept error: accept tcp: accept4: too many open files; retrying in 5ms"},
	} {
		var buf bytes.Buffer
		serverErrorLog(slog.New(slog.NewJSONHandler(&buf, nil))).Print(tc.line)
		var got struct{ Msg, Reason string }
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("%q logged %s: %v", tc.line, buf.String(), err)
		}
		if text := got.Reason + got.Msg; strings.Contains(buf.String(), "192.0.2.7") || strings.Contains(buf.String(), "2001:db8") ||
			strings.Contains(buf.String(), "198.51.100.1") || !strings.Contains(text, tc.want) {
			t.Errorf("%q logged %s, want it without addresses, saying %q", tc.line, buf.String(), tc.want)
		}
	}
}
