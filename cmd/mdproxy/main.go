// Command mdproxy is a rate-limiting reverse proxy deployed as a sidecar in front of
// OPSWAT MetaDefender Core. It forwards Core's REST API, holds the polling routes to
// per-route token buckets and exports Prometheus metrics. Configuration is by MDPROXY_*
// environment variables; see the README. It exits 2 on a bad setting, 1 on any other
// failure, 0 after a clean shutdown on SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/caarlos0/env/v11"
	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "mdproxy:", err)
		if errors.As(err, new(*configError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down gracefully. Logs go to logw as JSON. When
// started is not nil it is called with the proxy's and the admin listener's addresses
// once both listen.
func run(ctx context.Context, environ map[string]string, logw io.Writer, started func(proxyAddr, adminAddr net.Addr)) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, &slog.HandlerOptions{Level: cfg.level}))

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	limits, err := limiter.NewSet(cfg.Limits, nil)
	if err != nil {
		return &configError{err}
	}
	h, err := proxy.New(proxy.Options{
		Upstream: cfg.upstream,
		Transport: proxy.NewTransport(proxy.TransportOptions{
			DialTimeout:           cfg.DialTimeout,
			ResponseHeaderTimeout: cfg.UpstreamTimeout,
		}),
		Limits:          limits,
		Metrics:         m,
		LimitStatus:     cfg.LimitStatus,
		TrustedProxies:  cfg.trusted,
		UpstreamTimeout: cfg.UpstreamTimeout,
		Logger:          log,
	})
	if err != nil {
		return err
	}

	var lc net.ListenConfig
	pl, err := lc.Listen(ctx, "tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listening on MDPROXY_LISTEN_ADDR: %w", err)
	}
	al, err := lc.Listen(ctx, "tcp", cfg.AdminAddr)
	if err != nil {
		pl.Close()
		return fmt.Errorf("listening on MDPROXY_ADMIN_ADDR: %w", err)
	}

	var stopping atomic.Bool
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	srv := newServer(cfg, h, errLog)
	admin := &http.Server{
		Handler:           adminHandler(reg, &stopping),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          errLog,
	}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(pl) }()
	go func() { errc <- admin.Serve(al) }()
	log.Info("mdproxy serving", "listen", pl.Addr().String(), "admin", al.Addr().String(),
		"upstream", cfg.upstream.Redacted(), "limit_status", cfg.LimitStatus)
	for _, name := range proxy.RouteNames() {
		if b := limits.Bucket(name); b != nil {
			l := b.Limit()
			log.Info("route limited", "route", name, "rate_per_s", l.Rate, "burst", l.Burst,
				"max_wait", l.MaxWait.String(), "client_limit", l.ClientLimit)
		}
	}
	if unknown := unknownVariables(environ); len(unknown) > 0 {
		log.Warn("unknown variables ignored (misspelt?)", "variables", unknown)
	}
	if started != nil {
		started(pl.Addr(), al.Addr())
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	stopping.Store(true)
	log.Info("mdproxy shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	if shutErr != nil {
		srv.Close()
		shutErr = fmt.Errorf("in-flight requests cut after MDPROXY_SHUTDOWN_TIMEOUT=%v: %w", cfg.ShutdownTimeout, shutErr)
	}
	admin.Close()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	if shutErr != nil {
		return shutErr
	}
	log.Info("mdproxy stopped")
	return nil
}

// newServer returns the proxy's server. It sets no ReadTimeout nor WriteTimeout: they
// would cut a slow upload of hundreds of MiB or a long sanitized download. Slow clients
// are bounded by ReadHeaderTimeout and IdleTimeout instead.
func newServer(cfg *Config, h http.Handler, errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          errLog,
	}
}

// adminHandler serves /metrics from reg, /healthz (200 while the process runs) and
// /readyz (200 until shutdown starts, then 503, so a load balancer stops sending).
func adminHandler(reg *prometheus.Registry, stopping *atomic.Bool) http.Handler {
	r := chi.NewRouter()
	r.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	r.Get("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if stopping.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return r
}
