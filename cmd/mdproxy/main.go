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
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	defer stop()
	if err := run(ctx, env.ToMap(os.Environ()), os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "mdproxy:", err)
		if errors.As(err, new(*configError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run serves until ctx ends (main ends it on SIGTERM or SIGINT), then shuts down
// gracefully in three phases: the admin /readyz answers 503 at once while the proxy
// keeps serving for MDPROXY_SHUTDOWN_DELAY, so that load balancers stop sending before
// anything is refused (a second signal skips the rest of the delay); then the proxy's
// listener closes and in-flight requests may finish for up to MDPROXY_SHUTDOWN_TIMEOUT;
// then run returns. Logs go to logw as JSON, one line a phase. When started is not nil
// it is called with the proxy's and the admin listener's addresses once both listen.
func run(ctx context.Context, environ map[string]string, logw io.Writer, started func(proxyAddr, adminAddr net.Addr)) error {
	cfg, err := loadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, &slog.HandlerOptions{Level: cfg.level}))

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	limits, err := limiter.NewSet(cfg.Limits, nil,
		limiter.WithClientKeysMax(cfg.ClientKeysMax), limiter.WithLogger(log))
	if err != nil {
		return &configError{err}
	}
	metrics.RegisterClientKeys(reg, limits)
	h, err := proxy.New(proxy.Options{
		Upstream: cfg.upstream,
		Transport: proxy.NewTransport(proxy.TransportOptions{
			DialTimeout:           cfg.DialTimeout,
			ResponseHeaderTimeout: cfg.UpstreamTimeout,
			BodyIdleTimeout:       cfg.BodyIdleTimeout,
		}),
		Limits:          limits,
		Metrics:         m,
		LimitStatus:     cfg.LimitStatus,
		TrustedProxies:  cfg.trusted,
		UpstreamTimeout: cfg.UpstreamTimeout,
		BodyIdleTimeout: cfg.BodyIdleTimeout,
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
	// The admin listener takes no bodies and answers small pages: a scraper or probe
	// that stops reading must not hold a connection longer than a body may idle.
	admin := &http.Server{
		Handler:           adminHandler(reg, &stopping),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadHeaderTimeout,
		WriteTimeout:      cfg.BodyIdleTimeout,
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
	// Not ready first, and keep serving while load balancers notice (issue 9): closing
	// the listener at once would refuse the requests they still send.
	delay := serveErr == nil && cfg.ShutdownDelay > 0
	var hurry chan os.Signal
	if delay {
		// Listened for before /readyz changes, so that no second signal is missed.
		hurry = make(chan os.Signal, 1)
		signal.Notify(hurry, shutdownSignals...)
		defer signal.Stop(hurry)
	}
	stopping.Store(true)
	log.Info("mdproxy shutting down: /readyz answers 503", "delay", cfg.ShutdownDelay.String(),
		"timeout", cfg.ShutdownTimeout.String())
	if delay {
		// Each connection is closed after its response, so clients reconnect, through
		// load balancers that meanwhile stop choosing this replica.
		srv.SetKeepAlivesEnabled(false)
		serveErr = shutdownDelay(cfg.ShutdownDelay, hurry, errc, log)
	}
	log.Info("mdproxy draining: closing the listener, in-flight requests finishing",
		"timeout", cfg.ShutdownTimeout.String())
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

// shutdownSignals are the signals that shut mdproxy down: main ends run's context on the
// first; a second one during MDPROXY_SHUTDOWN_DELAY skips the rest of the delay.
var shutdownSignals = []os.Signal{syscall.SIGTERM, os.Interrupt}

// shutdownDelay waits for d (MDPROXY_SHUTDOWN_DELAY) while the proxy keeps serving, and
// returns nil then. A signal on hurry (a second SIGTERM or SIGINT: an operator or an
// orchestrator in a hurry) ends the wait early and returns nil: the drain that follows
// is still bounded by MDPROXY_SHUTDOWN_TIMEOUT, and SIGKILL cuts everything. A server
// that fails meanwhile (an error on errc) ends it too, and its error is returned.
func shutdownDelay(d time.Duration, hurry <-chan os.Signal, errc <-chan error, log *slog.Logger) error {
	start := time.Now()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case sig := <-hurry:
		log.Info("mdproxy shutdown delay cut short by a second signal", "signal", sig.String(),
			"skipped", (d - time.Since(start)).Round(time.Millisecond).String())
		return nil
	case err := <-errc:
		return err
	}
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
// /readyz (200 until shutdown starts, then 503 while the proxy still serves for
// MDPROXY_SHUTDOWN_DELAY, so a load balancer stops sending before the listener closes).
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
