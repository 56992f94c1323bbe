// Command coresim emulates OPSWAT MetaDefender Core: its REST API, and how it spends its
// CPUs, so that polling slows scanning as it does on a real Core. Configuration is by
// CORESIM_* environment variables (see package coresim, whose Run this command is,
// behind signals and exit codes). It exits 2 on a bad setting, 1 on any other failure,
// 0 after SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/envconf"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := coresim.Run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "coresim:", err)
		if errors.As(err, new(*envconf.Error)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
