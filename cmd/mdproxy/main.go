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
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/internal/cli"
	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/proxy"
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
	// net/http's transport writes some events through the standard log package (a Core
	// that sends bytes on an idle connection): one JSON line at WARN, as every line.
	log.SetFlags(0)
	log.SetOutput(slog.NewLogLogger(slog.NewJSONHandler(os.Stderr, nil), slog.LevelWarn).Writer())
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
	if err := sidecar.Run(ctx, env.ToMap(os.Environ()), os.Stderr, nil, sidecar.WithReloadSignals(hup)); err != nil {
		code := 1
		if errors.As(err, new(*sidecar.ConfigError)) {
			code = 2
		}
		failed(os.Stderr, err, code)
		os.Exit(code)
	}
}

// failed writes why mdproxy exits with code as one JSON line, as every other log line
// is: level ERROR, msg "mdproxy failed", err (which names the variable of a bad
// setting; several bad settings are one err, one a line within it) and exit_code.
func failed(w io.Writer, err error, code int) {
	slog.New(slog.NewJSONHandler(w, nil)).Error("mdproxy failed", "err", err.Error(), "exit_code", code)
}

var usage = cli.Usage("mdproxy", "MDPROXY_")

// help is mdproxy's --help, up to the flags.
func help() string {
	return `mdproxy is a rate-limiting reverse proxy, run as a sidecar in front of OPSWAT
MetaDefender Core. It forwards Core's REST API and holds the polling routes (result
polls, batch status, hash look-ups) to per-route token buckets. Its bridge takes
Core's callbacks for submissions and answers result polls from them. It serves its
own /metrics, /healthz, /readyz and /config (and /debug/pprof/ with MDPROXY_PPROF=true)
on an admin port, shuts down gracefully on SIGTERM or SIGINT, and reads its limits
file (MDPROXY_LIMITS_FILE) again on SIGHUP.

` + usage + `
Settings are environment variables, not flags; the README's "Configuration" section
gives each one's unit, default and meaning. The variables:

` + cli.Wrap(envconf.Names[sidecar.Config](sidecar.EnvPrefix)) + `
and each route's limit, MDPROXY_<ROUTE>_RATE, _BURST, _MAX_WAIT, _CLIENT_LIMIT,
_CLIENT_WINDOW and _DRY_RUN, where <ROUTE> is one of these route names in upper case:

` + cli.Wrap(proxy.RouteNames()) + `
Exit status: 0 after a clean shutdown, 2 on a bad setting or argument, 1 on any
other failure.

Flags:
`
}
