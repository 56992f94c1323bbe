// Command coresim emulates OPSWAT MetaDefender Core: its REST API, and how it spends its
// CPUs, so that polling slows scanning as it does on a real Core. Configuration is by
// CORESIM_* environment variables (see package coresim). It exits 2 on a bad setting,
// 1 on any other failure, 0 after SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/envconf"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "coresim:", err)
		if errors.As(err, new(*envconf.Error)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run serves the emulator until ctx ends. started, if not nil, gets the API and admin
// addresses once both listen (admin is nil when CORESIM_ADMIN_ADDR is empty).
func run(ctx context.Context, environ map[string]string, logw io.Writer, started func(api, admin net.Addr)) error {
	cfg, err := coresim.LoadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, nil))
	if unknown := envconf.Unknown(coresim.EnvPrefix, environ, envconf.Names[coresim.Config](coresim.EnvPrefix)); len(unknown) > 0 {
		log.Warn("unknown variables ignored (misspelt?)", "variables", unknown)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sim, err := coresim.New(cfg, reg)
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listening on CORESIM_LISTEN_ADDR: %w", err)
	}
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	servers := []*http.Server{srv}
	listeners := []net.Listener{l}
	var adminAddr net.Addr
	if cfg.AdminAddr != "" {
		al, err := lc.Listen(ctx, "tcp", cfg.AdminAddr)
		if err != nil {
			l.Close()
			return fmt.Errorf("listening on CORESIM_ADMIN_ADDR: %w", err)
		}
		adminAddr = al.Addr()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		servers = append(servers, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, al)
	}

	simCtx, stopSim := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sim.Run(simCtx, true)
	}()
	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	admin := ""
	if adminAddr != nil {
		admin = adminAddr.String()
	}
	log.Info("coresim serving", "listen", l.Addr().String(), "admin", admin, "cores", cfg.Cores,
		"speedup", cfg.Speedup, "fetch_limit", cfg.FetchLimit, "queue_size", cfg.QueueSize)
	if started != nil {
		started(l.Addr(), adminAddr)
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
		s.Close()
	}
	stopSim()
	wg.Wait()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	log.Info("coresim stopped")
	return nil
}
