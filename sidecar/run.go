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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

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
//
// Its steps, in order: the settings (loadSettings), the limits (startLimits), the
// proxy (startProxy), the servers (listen, then serve), the start log (logStart), the
// check of Core (startUpstreamCheck: mdproxy_upstream_up, a warning when Core cannot
// be reached), and the shutdown (servers.shutdown); what a step started is closed, in reverse order,
// when Run returns.
func Run(ctx context.Context, environ map[string]string, logw io.Writer, started func(proxyAddr, adminAddr net.Addr), opts ...Option) error {
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	cfg, log, err := loadSettings(environ, logw)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	limits, err := startLimits(ctx, cfg, reg, log)
	if err != nil {
		return err
	}
	defer limits.close() // after everything that uses Redis has stopped
	px, err := startProxy(ctx, cfg, reg, m, log, limits)
	if err != nil {
		return err
	}
	defer px.close() // after the drain: callbacks of scans in flight still land
	srv, err := listen(ctx, cfg, reg, log, px.h, limits.live)
	if err != nil {
		return err
	}
	srv.serve(px.br, cfg, log)
	logStart(log, cfg, limits, px.br, srv)
	if every := cfg.UpstreamCheckInterval; every > 0 {
		defer startUpstreamCheck(cfg.upstream, px.tr, every, min(cfg.DialTimeout+cfg.UpstreamTimeout, every/2, 5*time.Second),
			metrics.NewUpstreamUp(reg), log)()
	}
	defer newLimitsReloader(cfg, environ, log, m, limits.live, px.h).start(o.reloadSignals)()
	if cfg.Adaptive {
		defer startAdaptive(cfg, reg, px.tr, limits, px.h, log)()
	}
	if started != nil {
		started(srv.pl.Addr(), srv.al.Addr())
	}
	return srv.shutdown(ctx, cfg, log)
}

// loadSettings is Run's first step: it reads mdproxy's settings from environ
// (LoadConfig: a *ConfigError naming each bad variable) and returns them with the
// logger of lines to logw at MDPROXY_LOG_LEVEL, in MDPROXY_LOG_FORMAT (LogFormat).
func loadSettings(environ map[string]string, logw io.Writer) (*Config, *slog.Logger, error) {
	cfg, err := LoadConfig(environ)
	if err != nil {
		return nil, nil, err
	}
	cfg.LogFormat = LogFormat(logw, cfg.LogFormat) // as /config shows it
	return cfg, slog.New(LogHandler(logw, cfg.LogFormat, cfg.level)), nil
}

// runLimits are the limits of a running mdproxy: the Set in force, which a reload of
// the limits file swaps, and the Redis client that the limits and the bridge's results
// share (nil without MDPROXY_REDIS_URL), which close closes.
type runLimits struct {
	live    *liveLimits
	rdb     *redis.Client
	redisOK bool // Redis answered the check at start
}

// startLimits is Run's second step: it builds each route's Limiter from cfg.Limits, on
// the Redis of MDPROXY_REDIS_URL when one is set (checked once, within
// MDPROXY_REDIS_TIMEOUT: one that does not answer is logged, not fatal, since Redis may
// come up after mdproxy, and decisions stay local until it answers), and registers the
// limiter's metrics on reg. A limit NewSet refuses is a *ConfigError.
func startLimits(ctx context.Context, cfg *Config, reg *prometheus.Registry, log *slog.Logger) (*runLimits, error) {
	rl := &runLimits{live: &liveLimits{}, rdb: newRedisClient(cfg, metrics.NewRedis(reg))}
	opts := []limiter.Option{limiter.WithClientKeysMax(cfg.ClientKeysMax), limiter.WithLogger(log)}
	mode := func() limiter.Mode { return limiter.ModeLocal }
	if rl.rdb != nil {
		shared := limiter.NewRedis(rl.rdb, limiter.RedisOptions{Prefix: cfg.RedisPrefix,
			Timeout: cfg.RedisTimeout, Replicas: cfg.Replicas, Logger: log})
		opts = append(opts, limiter.WithRedis(shared))
		metrics.RegisterLimiterRestores(reg, shared)
		mode = shared.Mode
		pctx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		if err := rl.rdb.Ping(pctx).Err(); err != nil {
			// A wrong password fails here too.
			log.Warn("Redis check at start failed (unreachable, too slow, or refusing the login): decisions fall back to local buckets until it answers",
				"redis", redactedURL(cfg.RedisURL), "error", err.Error())
		} else {
			rl.redisOK = true
		}
		cancel()
	}
	modes := make([]string, len(limiter.Modes))
	for i, md := range limiter.Modes {
		modes[i] = md.String()
	}
	metrics.RegisterLimiterMode(reg, modes, func() string { return mode().String() })
	set, err := limiter.NewSet(cfg.Limits, nil, opts...)
	if err != nil {
		rl.close()
		return nil, &ConfigError{err}
	}
	rl.live.Store(set)
	metrics.RegisterClientKeys(reg, rl.live)
	return rl, nil
}

// close closes the Redis client, if any.
func (rl *runLimits) close() {
	if rl.rdb != nil {
		rl.rdb.Close()
	}
}

// runProxy is the proxy of a running mdproxy: its handler, its transport to Core, and
// the bridge (nil when off), which close stops.
type runProxy struct {
	h  *proxy.Proxy
	tr *http.Transport
	br *bridgeRunning
}

// startProxy is Run's third step: it builds the transport to Core with its timeouts,
// the bridge (listening on MDPROXY_BRIDGE_LISTEN_ADDR, not serving yet: see
// startBridge) and the proxy's handler on limits. Its error names the setting at fault.
func startProxy(ctx context.Context, cfg *Config, reg *prometheus.Registry, m *metrics.Metrics, log *slog.Logger, limits *runLimits) (*runProxy, error) {
	// The timeouts towards Core are set here once: the transport enforces them, the
	// proxy quotes the same values in its answers (a 504 says how long it waited).
	topts := proxy.TransportOptions{
		DialTimeout:           cfg.DialTimeout,
		ResponseHeaderTimeout: cfg.UpstreamTimeout,
		BodyIdleTimeout:       cfg.BodyIdleTimeout,
		TLSClientConfig:       cfg.upstreamTLS(log),
	}
	px := &runProxy{tr: proxy.NewTransport(topts)}
	// Answers to polls held for their clients: Core's (the proxy) and results read
	// from Redis (the bridge's store), in one budget.
	answers := bridge.NewBudget(bridge.DefaultAnswerBytes)
	var err error
	px.br, err = startBridge(ctx, cfg, reg, log, limits.rdb, cfg.RedisPrefix, cfg.RedisTimeout, answers)
	if err != nil {
		px.close()
		return nil, err
	}
	var pb proxy.Bridge // nil when the bridge is off (not a nil *bridge.Bridge inside)
	if px.br != nil {
		pb = px.br.b
	}
	px.h, err = proxy.New(proxy.Options{
		Bridge:           pb,
		Upstream:         cfg.upstream,
		Transport:        px.tr,
		Limits:           limits.live,
		Metrics:          m,
		LimitStatus:      cfg.LimitStatus,
		RateLimitHeaders: cfg.RateLimitHeaders,
		TrustedProxies:   cfg.trusted,
		ClientIPv6Prefix: cfg.ClientIPv6Prefix,
		ClientIPv4Prefix: cfg.ClientIPv4Prefix,
		UpstreamTimeout:  topts.ResponseHeaderTimeout,
		BodyIdleTimeout:  topts.BodyIdleTimeout,
		PollBuffers:      answers,
		Logger:           log,
	})
	if err != nil {
		px.close()
		return nil, err
	}
	return px, nil
}

// close stops the bridge, then closes the pooled connections to Core, so that no
// goroutine of them outlives Run.
func (px *runProxy) close() {
	px.br.close()
	px.tr.CloseIdleConnections()
}

// servers are the proxy's and the admin listener's servers of a running mdproxy, each
// server's end reported on errc (the bridge's callback listener's too).
type servers struct {
	proxy, admin *http.Server
	pl, al       net.Listener
	// stopping is set once shutdown starts: the admin /readyz answers 503 from then.
	stopping atomic.Bool
	errc     chan error
}

// listen is Run's fourth step: it listens on MDPROXY_LISTEN_ADDR and MDPROXY_ADMIN_ADDR
// (an error names the variable) and builds the proxy's server for h and the admin
// server for reg's metrics and limits' settings; serve serves them.
func listen(ctx context.Context, cfg *Config, reg *prometheus.Registry, log *slog.Logger, h *proxy.Proxy, limits proxy.Limits) (*servers, error) {
	var lc net.ListenConfig
	pl, err := lc.Listen(ctx, "tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on MDPROXY_LISTEN_ADDR: %w", err)
	}
	al, err := lc.Listen(ctx, "tcp", cfg.AdminAddr)
	if err != nil {
		pl.Close()
		return nil, fmt.Errorf("listening on MDPROXY_ADMIN_ADDR: %w", err)
	}
	s := &servers{al: al, errc: make(chan error, 3)}
	errLog := serverErrorLog(log)
	s.proxy = newServer(cfg, h, errLog)
	// At most MDPROXY_MAX_CONNECTIONS connections are open at once.
	pl = netutil.LimitListener(pl, cfg.MaxConnections)
	s.pl = cfg.listenTLS(pl, s.proxy, log) // HTTPS when MDPROXY_TLS_CERT_FILE is set
	// The admin listener takes no bodies and answers small pages: a scraper or probe
	// that stops reading must not hold a connection longer than a body may idle.
	s.admin = &http.Server{
		Handler:           closeAmbiguous(adminHandler(reg, &s.stopping, cfg, limits)),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadHeaderTimeout,
		WriteTimeout:      cfg.BodyIdleTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          errLog,
	}
	return s, nil
}

// serve serves the proxy, the admin listener and br's callback listener (nil: the
// bridge is off), each in a goroutine of its own, until shutdown.
func (s *servers) serve(br *bridgeRunning, cfg *Config, log *slog.Logger) {
	go func() { s.errc <- s.proxy.Serve(s.pl) }()
	go func() { s.errc <- s.admin.Serve(s.al) }()
	br.serve(cfg, log, s.errc)
}

// logStart is Run's fifth step: it logs where mdproxy serves and with what, the
// settings as /config answers them, whether the bridge is on, and the variables that
// are unknown or have no effect.
func logStart(log *slog.Logger, cfg *Config, limits *runLimits, br *bridgeRunning, s *servers) {
	if limits.rdb != nil {
		msg := "limits and results shared on Redis"
		if !limits.redisOK {
			msg = "limits and results to be shared on Redis once it answers"
		}
		log.Info(msg, "redis", redactedURL(cfg.RedisURL),
			"prefix", cfg.RedisPrefix, "timeout", cfg.RedisTimeout.String(), "replicas", cfg.Replicas)
	}
	version, revision, _ := metrics.BuildVersion()
	log.Info("mdproxy serving", "listen", s.pl.Addr().String(), "tls", cfg.TLSCertFile != "", "admin", s.al.Addr().String(),
		"upstream", cfg.upstream.Redacted(), "limit_status", cfg.LimitStatus,
		"version", version, "revision", revision)
	logSettings(log, settingsOf(cfg, limits.live)) // as /config answers them
	if br != nil {
		log.Info("bridge on: Core's callbacks taken, polls answered from what mdproxy knows",
			"callback_listen", br.ln.Addr().String(), "callback_url", br.cbBase)
	} else {
		log.Info("bridge off: every poll is forwarded (MDPROXY_BRIDGE=false)")
	}
	warnUnknown(log, cfg.unknown)
	warnNoEffect(log, cfg.noEffect)
}

// shutdown is Run's last step: it waits until ctx ends or a server fails, then shuts
// down in the phases Run describes, and returns Run's error: nil after a clean
// shutdown, a server's error, or one wrapping context.DeadlineExceeded when in-flight
// requests were cut at MDPROXY_SHUTDOWN_TIMEOUT.
func (s *servers) shutdown(ctx context.Context, cfg *Config, log *slog.Logger) error {
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-s.errc:
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
	s.stopping.Store(true)
	log.Info("mdproxy shutting down: /readyz answers 503", "delay", cfg.ShutdownDelay.String(),
		"timeout", cfg.ShutdownTimeout.String())
	if delay {
		// Each connection is closed after its response, so clients reconnect, through
		// load balancers that meanwhile stop choosing this replica.
		s.proxy.SetKeepAlivesEnabled(false)
		serveErr = shutdownDelay(cfg.ShutdownDelay, hurry, s.errc, log)
	}
	log.Info("mdproxy draining: closing the listener, in-flight requests finishing",
		"timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	shutErr := s.proxy.Shutdown(sctx)
	if shutErr != nil {
		s.proxy.Close()
		shutErr = fmt.Errorf("in-flight requests cut after MDPROXY_SHUTDOWN_TIMEOUT=%v: %w", cfg.ShutdownTimeout, shutErr)
	}
	s.admin.Close()
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
