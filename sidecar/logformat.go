package sidecar

import (
	"io"
	"log/slog"
	"strings"

	"golang.org/x/term"
)

// The values of MDPROXY_LOG_FORMAT.
const (
	LogJSON = "json" // one JSON object a line (slog.JSONHandler), for log collectors
	LogText = "text" // key=value lines (slog.TextHandler), for a person at a terminal
)

// LogFormat returns the log format that format (MDPROXY_LOG_FORMAT's value) selects
// for lines written to w: format itself when it is LogJSON or LogText; otherwise
// (unset, or a bad value that LoadConfig refuses) LogText when w is a terminal (an
// *os.File, or anything with an Fd method, on a terminal: golang.org/x/term's
// IsTerminal) and LogJSON when it is not (a pipe, a file, a container's log).
func LogFormat(w io.Writer, format string) string {
	switch format {
	case LogJSON, LogText:
		return format
	}
	if f, ok := w.(interface{ Fd() uintptr }); ok && term.IsTerminal(int(f.Fd())) {
		return LogText
	}
	return LogJSON
}

// LogHandler returns the slog handler of mdproxy's lines to w: a TextHandler when
// format is LogText, else a JSONHandler, at level (nil: info). Safe for concurrent use,
// as slog's handlers are.
func LogHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == LogText {
		return slog.NewTextHandler(w, opts)
	}
	return slog.NewJSONHandler(w, opts)
}

// LogFailure logs why mdproxy exits with code, as cmd/mdproxy's main does: level
// ERROR, msg "mdproxy failed", err and exit_code, in the format that environ's
// MDPROXY_LOG_FORMAT selects for w (LogFormat). In JSON it is one line whose err holds
// every bad setting, one a line within it; in text it is one line an error line, so
// that a terminal shows no literal \n.
func LogFailure(w io.Writer, environ map[string]string, err error, code int) {
	format := LogFormat(w, environ[EnvPrefix+"LOG_FORMAT"])
	log := slog.New(LogHandler(w, format, nil))
	if format == LogJSON {
		log.Error("mdproxy failed", "err", err.Error(), "exit_code", code)
		return
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		log.Error("mdproxy failed", "err", line, "exit_code", code)
	}
}
