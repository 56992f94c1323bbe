package coresim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// Run reads the emulator's settings from environ (variable name to value; the process
// environment itself is not read), serves Core's API and, unless CORESIM_ADMIN_ADDR is
// empty, the emulator's /metrics, and drives the model in real time until ctx ends
// (coresim's main ends it on SIGTERM or SIGINT); then it stops its servers, waiting up
// to 5 s for requests in flight, and its model. Logs go to logw as JSON lines. When
// started is not nil it is called, from Run's goroutine, with the API's and the admin
// listener's addresses once both listen (admin is nil without an admin listener).
//
// Run returns nil once stopped; an *envconf.Error naming the variable for a bad
// setting, before anything listens; an error naming the variable when an address
// cannot be listened on; or a server's error. It leaves no goroutine behind.
func Run(ctx context.Context, environ map[string]string, logw io.Writer, started func(api, admin net.Addr)) error {
	cfg, err := LoadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, nil))
	if unknown := envconf.Unknown(EnvPrefix, environ, envconf.Names[Config](EnvPrefix)); len(unknown) > 0 {
		log.Warn("unknown variables ignored (misspelt?)", "variables", unknown)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sim, err := New(cfg, reg)
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
