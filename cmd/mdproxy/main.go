// Command mdproxy is a rate-limiting reverse proxy deployed as a sidecar in front of
// OPSWAT MetaDefender Core. It forwards Core's REST API, holds the polling routes to
// per-route token buckets and exports Prometheus metrics. Configuration is by MDPROXY_*
// environment variables; see the README. The wiring is package sidecar; this command
// adds the signals and the exit codes: 2 on a bad setting, 1 on any other failure, 0
// after a clean shutdown on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/sidecar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := sidecar.Run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "mdproxy:", err)
		if errors.As(err, new(*sidecar.ConfigError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
