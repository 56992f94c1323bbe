// Command coresim emulates OPSWAT MetaDefender Core: its REST API, and how it spends its
// CPUs, so that polling slows scanning as it does on a real Core. Configuration is by
// CORESIM_* environment variables (see package coresim, whose Run this command is,
// behind the command line (--version, --help), signals and exit codes). It exits 2 on a
// bad setting or argument, 1 on any other failure, 0 after SIGTERM or SIGINT, or after
// --version or --help.
package main

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/cli"
	"github.com/mdproxy/mdproxy/internal/envconf"
)

func main() {
	if code, exit := cli.Parse("coresim", help(), usage, os.Args[1:], os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	// net/http writes some events through the standard log package: one JSON line at
	// WARN, as every line.
	log.SetFlags(0)
	log.SetOutput(slog.NewLogLogger(slog.NewJSONHandler(os.Stderr, nil), slog.LevelWarn).Writer())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := coresim.Run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		code := 1
		if errors.As(err, new(*envconf.Error)) {
			code = 2
		}
		// One JSON line, as coresim's other log lines.
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("coresim failed", "err", err.Error(), "exit_code", code)
		os.Exit(code)
	}
}

var usage = cli.Usage("coresim", "CORESIM_")

// help is coresim's --help, up to the flags.
func help() string {
	return `coresim emulates OPSWAT MetaDefender Core for tests and benchmarks: it answers
Core's REST API as Core does (submissions, result polls, batches, hash look-ups,
callbacks, Core's own rate limit) and spends virtual CPU time as Core does, so that
polling slows scanning. It serves its own /metrics on an admin port and stops on
SIGTERM or SIGINT.

` + usage + `
Settings are environment variables, not flags; docs/coresim.md and the package
documentation (go doc ./coresim) give each one's default and meaning. The variables:

` + cli.Wrap(envconf.Names[coresim.Config](coresim.EnvPrefix)) + `
Exit status: 0 after SIGTERM or SIGINT, 2 on a bad setting or argument, 1 on any
other failure.

Flags:
`
}
