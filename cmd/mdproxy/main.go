// Command mdproxy is a rate-limiting reverse proxy deployed as a sidecar in front of
// OPSWAT MetaDefender Core. It forwards Core's REST API, holds the polling routes to
// per-route token buckets and exports Prometheus metrics. Configuration is by MDPROXY_*
// environment variables; see the README. The wiring is package sidecar; this command
// adds the command line (--version, --help), the signals and the exit codes: 2 on a
// bad setting or argument, 1 on any other failure, 0 after a clean shutdown on SIGTERM
// or SIGINT, or after --version or --help. SIGHUP reloads the limits file.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/internal/cli"
	"github.com/mdproxy/mdproxy/sidecar"
)

// gcPercent is mdproxy's garbage collection target when GOGC is not set: the heap may
// grow by 200% of what is live before a collection (Go's default is 100). mdproxy keeps
// about 1 MB live and allocates about 2 KB for each request (mostly net/http's own), so
// at Go's default its heap target is the runtime's 4 MB floor, and under a poll storm it
// collects 40 to 70 times a second, each collection marking that live megabyte again:
// about 5% of its core (store hits measured with GODEBUG=gctrace=1: 1.1 ms of
// collection a thousand answers). At 200 it collects half as often for a third of that
// (0.36 ms a thousand answers), and its heap target at rest is 8 MB instead of 4; the
// uploads' buffers are not part of it (10 concurrent uploads grow the resident memory
// by 12 MiB either way). GOGC in the environment decides instead when set, and
// GOMEMLIMIT caps the heap as usual.
const gcPercent = 200

func main() {
	if code, exit := cli.Parse("mdproxy", help(), usage, os.Args[1:], os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	environ := env.ToMap(os.Environ())
	// net/http's transport writes some events through the standard log package (a Core
	// that sends bytes on an idle connection): one line at WARN, in the format of every
	// line.
	log.SetFlags(0)
	format := sidecar.LogFormat(os.Stderr, environ[sidecar.EnvPrefix+"LOG_FORMAT"])
	log.SetOutput(slog.NewLogLogger(sidecar.LogHandler(os.Stderr, format, nil), slog.LevelWarn).Writer())
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	// SIGHUP reloads the limits file (MDPROXY_LIMITS_FILE); its default action would
	// kill mdproxy, uploads in flight with it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := sidecar.Run(ctx, environ, os.Stderr, nil, sidecar.WithReloadSignals(hup)); err != nil {
		code := 1
		if errors.As(err, new(*sidecar.ConfigError)) {
			code = 2
		}
		// Why mdproxy exits, in the format of every other line (sidecar.LogFailure):
		// level ERROR, msg "mdproxy failed", err (which names the variable of a bad
		// setting) and exit_code.
		sidecar.LogFailure(os.Stderr, environ, err, code)
		os.Exit(code)
	}
}

var usage = cli.Usage("mdproxy", "MDPROXY_")

// help is mdproxy's --help, up to the flags: what it does, then every variable by
// group with its unit, default and first sentence of meaning (sidecar.Settings, the
// table docs/configuration.md is generated from), and each route's default limit.
func help() string {
	var b strings.Builder
	b.WriteString(`mdproxy is a rate-limiting reverse proxy, run as a sidecar in front of OPSWAT
MetaDefender Core. It forwards Core's REST API and holds the polling routes (result
polls, batch status, hash look-ups) to per-route token buckets. Its bridge takes
Core's callbacks for submissions and answers result polls from them. It serves its
own /metrics, /healthz, /readyz and /config (and /debug/pprof/ with MDPROXY_PPROF=true)
on an admin port, shuts down gracefully on SIGTERM or SIGINT (Ctrl-C: /readyz answers
503 for MDPROXY_SHUTDOWN_DELAY, 5s, then requests in flight finish; a second Ctrl-C
skips the delay), and reads its limits file (MDPROXY_LIMITS_FILE) again on SIGHUP.

`)
	b.WriteString(usage)
	b.WriteString(`
Settings are environment variables, not flags (docs/configuration.md has each one's
range and full meaning). An unknown MDPROXY_ variable is named in a warning and ignored.
`)
	group := ""
	for _, s := range sidecar.Settings() {
		if s.Group != group {
			group = s.Group
			fmt.Fprintf(&b, "\n%s:\n", group)
		}
		fmt.Fprintf(&b, "  %s  [%s; default %s%s]\n", s.Name, s.Unit, s.DefaultWords(), map[bool]string{true: "; reloadable"}[s.Reload])
		b.WriteString(cli.Fill(strings.ReplaceAll(firstSentence(s.Meaning), "`", ""), "      ", 80))
	}
	b.WriteString("\n<ROUTE> is a route name in upper case. Each route's default limit (others: none):\n\n")
	fmt.Fprintf(&b, "  %-20s", "route")
	for _, st := range sidecar.LimitSettings() {
		fmt.Fprintf(&b, " %-13s", strings.ToLower(st))
	}
	b.WriteString("\n")
	var unlimited []string
	for _, d := range sidecar.RouteLimitDefaults() {
		if d.Values[0] == "0" && d.Values[3] == "0" {
			unlimited = append(unlimited, d.Route)
			continue
		}
		fmt.Fprintf(&b, "  %-20s", d.Route)
		for _, v := range d.Values {
			fmt.Fprintf(&b, " %-13s", v)
		}
		b.WriteString("\n")
	}
	b.WriteString("\nRoutes without a default limit:\n")
	b.WriteString(cli.Wrap(unlimited))
	b.WriteString(`
Exit status: 0 after a clean shutdown, 2 on a bad setting or argument, 1 on any
other failure.

Flags:
`)
	return b.String()
}

// firstSentence returns s up to the end of its first sentence (". " or its end).
func firstSentence(s string) string {
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}
