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
// level, without the client's address, as no log line of mdproxy names one (net/http
// names it in the line of a failed TLS handshake and of a handler's panic, and a
// connection's error, such as a reset or a timeout during a handshake, names both ends:
// "read tcp 192.0.2.1:443->192.0.2.7:41886: i/o timeout" is logged "read tcp: i/o
// timeout"). The line for a failed TLS handshake (a scanner or a plain-HTTP client on
// an HTTPS port writes one a connection) is logged at most once a second, with the
// number of handshakes it stands for. Safe for concurrent use.
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

var (
	// handshakeFrom matches the client address in net/http's handshake error line.
	handshakeFrom = regexp.MustCompile(`^http: TLS handshake error from \S+: `)
	// panicServing matches the client address in net/http's line for a handler's panic.
	panicServing = regexp.MustCompile(`^http: panic serving \S+: `)
	// opAddrs matches the addresses in a *net.OpError's text, "op net [source->]addr: ",
	// keeping its operation and network.
	opAddrs = regexp.MustCompile(`\b([a-z]+ (?:tcp|tcp4|tcp6|udp|udp4|udp6|unix|unixpacket)) \S+: `)
)

func (w *serverLogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	msg = opAddrs.ReplaceAllString(msg, "$1: ")
	if !handshakeFrom.MatchString(msg) {
		w.log.Warn(panicServing.ReplaceAllString(msg, "http: panic serving: "))
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
