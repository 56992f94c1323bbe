// Package sidecar builds and runs mdproxy from its settings: the configuration read
// from MDPROXY_* variables (Config, LoadConfig), the limiter, the metrics registry, the
// transport to Core with its timeouts, the proxy and admin listeners, and the graceful
// shutdown (Run). It is the one wiring of mdproxy: cmd/mdproxy is Run behind flags,
// signals and exit codes, and the benchmark runs it in-process for its Proxy-N cases.
package sidecar

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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
	"golang.org/x/net/netutil"
)

// Run reads mdproxy's settings from environ (variable name to value; the process
// environment itself is not read), listens, and serves until ctx ends (mdproxy's main
// ends it on SIGTERM or SIGINT). Then it shuts down gracefully in three phases: the
// admin /readyz answers 503 at once while the proxy keeps serving for
// MDPROXY_SHUTDOWN_DELAY, so that load balancers stop sending before anything is
// refused (a SIGTERM or SIGINT received meanwhile skips the rest of the delay); then
// the proxy's listener closes and in-flight requests may finish for up to
// MDPROXY_SHUTDOWN_TIMEOUT; then Run returns. Logs go to logw as JSON lines, at
// MDPROXY_LOG_LEVEL, one line a phase; logw must be safe for concurrent use if
// written to elsewhere. When started is not nil it is called, from Run's goroutine,
// with the proxy's and the admin listener's addresses once both listen.
//
// Run returns nil after a clean shutdown; a *ConfigError for a bad setting, before
// anything listens; an error naming the variable when an address cannot be listened
// on; an error wrapping context.DeadlineExceeded when in-flight requests were cut at
// MDPROXY_SHUTDOWN_TIMEOUT; or a server's error. It leaves no goroutine behind. Several
// Runs may serve in one process (each has its own registry), on distinct addresses.
//
// While it serves, Run reads the limits file (MDPROXY_LIMITS_FILE) again once it
// changed and settled (MDPROXY_LIMITS_FILE_SETTLE), and at once on each signal of
// WithReloadSignals: a good file puts its limits in force without a request dropped
// and without touching the bucket of a route whose limit is the same; a bad one
// changes nothing; one identical to the file in force is no reload. Each reload is
// logged and counted (mdproxy_config_reloads_total).
func Run(ctx context.Context, environ map[string]string, logw io.Writer, started func(proxyAddr, adminAddr net.Addr), opts ...Option) error {
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	cfg, err := LoadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, &slog.HandlerOptions{Level: cfg.level}))

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	limitOpts := []limiter.Option{limiter.WithClientKeysMax(cfg.ClientKeysMax), limiter.WithLogger(log)}
	mode := func() limiter.Mode { return limiter.ModeLocal }
	rdb := newRedisClient(cfg, metrics.NewRedis(reg))
	redisOK := false // the check at start answered
	if rdb != nil {
		defer rdb.Close() // after everything that uses it has stopped
		shared := limiter.NewRedis(rdb, limiter.RedisOptions{Prefix: cfg.RedisPrefix,
			Timeout: cfg.RedisTimeout, Replicas: cfg.Replicas, Logger: log})
		limitOpts = append(limitOpts, limiter.WithRedis(shared))
		metrics.RegisterLimiterRestores(reg, shared)
		mode = shared.Mode
		pctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		if err := rdb.Ping(pctx).Err(); err != nil {
			// Not fatal: Redis may come up after mdproxy. A wrong password fails here too.
			log.Warn("Redis check at start failed (unreachable, too slow, or refusing the login): decisions fall back to local buckets until it answers",
				"redis", redactedURL(cfg.RedisURL), "error", err.Error())
		} else {
			redisOK = true
		}
		cancel()
	}
	modes := make([]string, len(limiter.Modes))
	for i, md := range limiter.Modes {
		modes[i] = md.String()
	}
	metrics.RegisterLimiterMode(reg, modes, func() string { return mode().String() })
	set, err := limiter.NewSet(cfg.Limits, nil, limitOpts...)
	if err != nil {
		return &ConfigError{err}
	}
	limits := &liveLimits{} // the Set in force, which a reload of the limits file swaps
	limits.Store(set)
	metrics.RegisterClientKeys(reg, limits)
	// The timeouts towards Core are set here once: the transport enforces them, the
	// proxy quotes the same values in its answers (a 504 says how long it waited).
	topts := proxy.TransportOptions{
		DialTimeout:           cfg.DialTimeout,
		ResponseHeaderTimeout: cfg.UpstreamTimeout,
		BodyIdleTimeout:       cfg.BodyIdleTimeout,
		TLSClientConfig:       cfg.upstreamTLS(log),
	}
	tr := proxy.NewTransport(topts)
	// Pooled connections to Core end with Run: no goroutine of them outlives it.
	defer tr.CloseIdleConnections()
	// Answers to polls held for their clients: Core's (the proxy) and results read
	// from Redis (the bridge's store), in one budget.
	answers := bridge.NewBudget(bridge.DefaultAnswerBytes)
	br, err := startBridge(ctx, cfg, reg, log, rdb, cfg.RedisPrefix, cfg.RedisTimeout, answers)
	if err != nil {
		return err
	}
	defer br.close()    // after the drain below: callbacks of scans in flight still land
	var pb proxy.Bridge // nil when the bridge is off (not a nil *bridge.Bridge inside)
	if br != nil {
		pb = br.b
	}
	h, err := proxy.New(proxy.Options{
		Bridge:           pb,
		Upstream:         cfg.upstream,
		Transport:        tr,
		Limits:           limits,
		Metrics:          m,
		LimitStatus:      cfg.LimitStatus,
		TrustedProxies:   cfg.trusted,
		ClientIPv6Prefix: cfg.ClientIPv6Prefix,
		ClientIPv4Prefix: cfg.ClientIPv4Prefix,
		UpstreamTimeout:  topts.ResponseHeaderTimeout,
		BodyIdleTimeout:  topts.BodyIdleTimeout,
		PollBuffers:      answers,
		Logger:           log,
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
	errLog := serverErrorLog(log)
	srv := newServer(cfg, h, errLog)
	// At most MDPROXY_MAX_CONNECTIONS connections are open at once.
	pl = netutil.LimitListener(pl, cfg.MaxConnections)
	pl = cfg.listenTLS(pl, srv, log) // HTTPS when MDPROXY_TLS_CERT_FILE is set
	// The admin listener takes no bodies and answers small pages: a scraper or probe
	// that stops reading must not hold a connection longer than a body may idle.
	admin := &http.Server{
		Handler:           closeAmbiguous(adminHandler(reg, &stopping, cfg, limits)),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadHeaderTimeout,
		WriteTimeout:      cfg.BodyIdleTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}

	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(pl) }()
	go func() { errc <- admin.Serve(al) }()
	br.serve(cfg, log, errc)
	if rdb != nil {
		msg := "limits and results shared on Redis"
		if !redisOK {
			msg = "limits and results to be shared on Redis once it answers"
		}
		log.Info(msg, "redis", redactedURL(cfg.RedisURL),
			"prefix", cfg.RedisPrefix, "timeout", cfg.RedisTimeout.String(), "replicas", cfg.Replicas)
	}
	version, revision, _ := metrics.BuildVersion()
	log.Info("mdproxy serving", "listen", pl.Addr().String(), "tls", cfg.TLSCertFile != "", "admin", al.Addr().String(),
		"upstream", cfg.upstream.Redacted(), "limit_status", cfg.LimitStatus,
		"version", version, "revision", revision)
	settings := settingsOf(cfg, limits) // as /config answers them
	log.Info("settings", "variables", settings.Variables, "routes", settings.Routes)
	if br != nil {
		log.Info("bridge on: Core's callbacks taken, polls answered from what mdproxy knows",
			"callback_listen", br.ln.Addr().String(), "callback_url", br.cbBase)
	} else {
		log.Info("bridge off: every poll is forwarded (MDPROXY_BRIDGE=false)")
	}
	if unknown := unknownVariables(environ); len(unknown) > 0 {
		log.Warn("unknown variables ignored (misspelt?)", "variables", unknown)
	}
	warnNoEffect(log, cfg.noEffect)
	reloader := &limitsReloader{file: cfg.LimitsFile, environ: environ, settle: cfg.LimitsFileSettle,
		clock: clockwork.NewRealClock(), log: log, reloads: m.ConfigReloads, live: limits, proxy: h,
		inForce: cfg.limitsRead}
	defer reloader.start(o.reloadSignals)()
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

// Start runs Run with environ and logw in a goroutine of its own and returns once
// mdproxy listens: the proxy listener's URL (http://host:port, https:// with
// MDPROXY_TLS_CERT_FILE, so listen on an address that can be dialled, e.g.
// 127.0.0.1:0) and stop, which shuts mdproxy down as the end of ctx would, waits for
// Run to return and returns Run's error (nil after a clean shutdown); calling stop
// again returns the same error. When ctx ends mdproxy shuts down too, and stop must
// still be called to wait for it. When Run fails before it listens, Start returns its
// error (a *ConfigError for a bad setting) and a nil stop. It serves programs that run
// mdproxy in-process, such as the benchmark. opts are Run's.
func Start(ctx context.Context, environ map[string]string, logw io.Writer, opts ...Option) (proxyURL string, stop func() error, err error) {
	ctx, cancel := context.WithCancel(ctx)
	listening := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, environ, logw, func(proxyAddr, _ net.Addr) { listening <- proxyAddr }, opts...)
	}()
	select {
	case a := <-listening:
		scheme := "http://"
		if environ[EnvPrefix+"TLS_CERT_FILE"] != "" {
			scheme = "https://"
		}
		return scheme + a.String(), sync.OnceValue(func() error {
			cancel()
			return <-done
		}), nil
	case err := <-done:
		cancel()
		return "", nil, err
	}
}

// shutdownSignals are the signals that shut mdproxy down: mdproxy's main ends Run's
// context on the first; one received during MDPROXY_SHUTDOWN_DELAY skips the rest of
// the delay.
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

// newServer returns the proxy's server for p. It sets no ReadTimeout nor WriteTimeout:
// they would cut a slow upload of hundreds of MiB or a long sanitized download. Slow
// clients are bounded by ReadHeaderTimeout and IdleTimeout instead, and the bodies both
// ways by the proxy's body idle timeout, counted from each read and write.
func newServer(cfg *Config, p *proxy.Proxy, errLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           p,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}
}

// maxHeaderBytes bounds the header of a request to each of mdproxy's listeners, in
// bytes: 64 KiB (net/http allows 4 KiB more, and answers 431 beyond). Core's API takes
// a few small fields (apikey, filename, rule, metadata...); net/http's default, 1 MiB,
// would let each open connection hold a MiB while its header is read.
const maxHeaderBytes = 64 << 10

// adminHandler serves /metrics from reg, /healthz (200 while the process runs) and
// /readyz (200 until shutdown starts, then 503 while the proxy still serves for
// MDPROXY_SHUTDOWN_DELAY, so a load balancer stops sending before the listener closes),
// /config (cfg's effective settings, each route's limit read from limits at the time)
// and, with MDPROXY_PPROF, /debug/pprof/.
func adminHandler(reg *prometheus.Registry, stopping *atomic.Bool, cfg *Config, limits proxy.Limits) http.Handler {
	r := chi.NewRouter()
	r.HandleFunc("/metrics", only(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}).ServeHTTP, http.MethodGet))
	r.HandleFunc("/healthz", only(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}, http.MethodGet))
	r.HandleFunc("/readyz", only(func(w http.ResponseWriter, _ *http.Request) {
		if stopping.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	}, http.MethodGet))
	mountAdminExtras(r, cfg, limits) // /config, /debug/pprof/
	return r
}

// closeAmbiguous ends the connection after the answer to each request that
// proxy.CloseAfter names (framed by Transfer-Encoding, or HTTP/1.0), on the listeners
// other than the proxy's, which does the same itself: a request that follows one of
// those on its connection may be the rest of its body to a proxy in front (RFC 9112,
// section 6.1).
func closeAmbiguous(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if proxy.CloseAfter(r) {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}
