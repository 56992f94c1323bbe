package sidecar

import (
	"log"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// serverErrorLog returns the ErrorLog of mdproxy's servers: net/http's lines at warn
// level, but for the one it writes for every failed TLS handshake (a scanner or a
// plain-HTTP client on an HTTPS port writes one a connection), which is logged without
// the client's address, as no log line of mdproxy names one, and at most once a second
// with the number of handshakes it stands for. Safe for concurrent use.
func serverErrorLog(l *slog.Logger) *log.Logger {
	return log.New(&serverLogWriter{log: l}, "", 0)
}

// serverLogWriter is the writer of serverErrorLog.
type serverLogWriter struct {
	log *slog.Logger

	mu       sync.Mutex
	last     time.Time // of the last handshake line written
	unlogged int       // handshake failures since it
}

// handshakeFrom matches the client address in net/http's handshake error line.
var handshakeFrom = regexp.MustCompile(`^http: TLS handshake error from \S+: `)

func (w *serverLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	if !handshakeFrom.MatchString(msg) {
		w.log.Warn(msg)
		return len(p), nil
	}
	reason := handshakeFrom.ReplaceAllString(msg, "")
	w.mu.Lock()
	w.unlogged++
	now := time.Now()
	if now.Sub(w.last) < time.Second {
		w.mu.Unlock()
		return len(p), nil
	}
	n := w.unlogged
	w.last, w.unlogged = now, 0
	w.mu.Unlock()
	w.log.Warn("TLS handshake failed", "reason", reason, "handshakes", n)
	return len(p), nil
}
