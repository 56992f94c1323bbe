package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/metrics"
)

// validateBridge checks the bridge's settings; they are not checked when the bridge is
// off.
func (c *Config) validateBridge(environ map[string]string) error {
	if !c.Bridge {
		return nil
	}
	var errs envconf.Errors
	bad := func(name, want string) { errs.Add(envconf.Invalid(environ, EnvPrefix, name, want)) }
	envconf.EmptyWhenSet(environ, EnvPrefix, map[string]*string{"BRIDGE_LISTEN_ADDR": &c.BridgeListenAddr})
	if !validListenAddr(c.BridgeListenAddr) || sameListener(c.BridgeListenAddr, c.ListenAddr) || sameListener(c.BridgeListenAddr, c.AdminAddr) {
		bad("BRIDGE_LISTEN_ADDR", "want a host:port to listen on for Core's callbacks, port 0 to 65535, not the proxy's nor the admin port's, e.g. 127.0.0.1:9010")
	}
	if c.BridgeCallbackURL != "" {
		u, err := url.Parse(c.BridgeCallbackURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || !validURL(c.BridgeCallbackURL, u) || u.User != nil {
			// Named without its password, as the logs and /config show URLs. The
			// listener reads no user or password: refused rather than ignored.
			errs.Add(&envconf.Error{Var: EnvPrefix + "BRIDGE_CALLBACK_URL", Value: redactedURL(c.BridgeCallbackURL),
				Want: "want an http or https URL with a host name or IP address (an IPv6 one in brackets), a port of 1 to 65535 if any, and no user, password, query or fragment, at which Core reaches the callback listener, e.g. http://127.0.0.1:9010"})
		}
	}
	for _, t := range []struct {
		name string
		bad  bool
	}{
		{"BRIDGE_REFRESH", c.BridgeRefresh <= 0 || c.BridgeRefresh > maxTimeout},
		{"BRIDGE_PENDING_TTL", c.BridgePendingTTL <= 0 || c.BridgePendingTTL > maxTTL},
		{"BRIDGE_PENDING_MAX_BYTES", c.BridgePendingMaxBytes < 1<<20},
		{"STORE_MAX_BYTES", c.StoreMaxBytes < 1<<20}, {"STORE_TTL", c.StoreTTL <= 0 || c.StoreTTL > maxTTL},
	} {
		if t.bad {
			bad(t.name, configWants[t.name])
		}
	}
	return errs.Err()
}

// bridgeRunning is the bridge of a running mdproxy: its callback listener's server
// and the result store, both to close when Run returns.
type bridgeRunning struct {
	b          *bridge.Bridge
	closeStore func() // the store's Close (a RedisStore's leaves the client, which is Run's)
	srv        *http.Server
	ln         net.Listener
	cbBase     string
}

// startBridge listens on MDPROXY_BRIDGE_LISTEN_ADDR and builds the bridge whose
// callback URL points there; it does not serve yet (serve). nil, nil when the bridge
// is off.
//
// With rdb nil, results are kept in mdproxy's memory (bridge.MemoryStore, bounded by
// MDPROXY_STORE_MAX_BYTES). With rdb set (MDPROXY_REDIS_URL), results and pending ids
// are kept in Redis under keys starting with prefix (MDPROXY_REDIS_PREFIX), each call
// bounded by timeout (MDPROXY_REDIS_TIMEOUT), and shared by every replica with the same
// Redis and prefix (bridge.RedisStore: Redis's maxmemory bounds it; a Redis that does not
// answer makes polls misses, forwarded to Core). rdb must have ContextTimeoutEnabled set
// and stays the caller's to close, after the bridge's close. The results a RedisStore
// reads for polls are charged to answers, the budget the proxy holds Core's answers to
// bridged polls in.
func startBridge(ctx context.Context, cfg *Config, reg prometheus.Registerer, log *slog.Logger, rdb redis.UniversalClient, prefix string, timeout time.Duration, answers *bridge.Budget) (*bridgeRunning, error) {
	if !cfg.Bridge {
		return nil, nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.BridgeListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on MDPROXY_BRIDGE_LISTEN_ADDR: %w", err)
	}
	base := cfg.BridgeCallbackURL
	if base == "" {
		scheme := "http"
		if cfg.TLSCertFile != "" {
			scheme = "https"
		}
		base = scheme + "://" + dialable(ln.Addr())
	}
	base = strings.TrimSuffix(base, "/")
	if c, ok := rdb.(*redis.Client); ok && c == nil {
		rdb = nil // a nil *redis.Client (no MDPROXY_REDIS_URL) in the interface is no client
	}
	blog := log.With("component", "bridge")
	var (
		store      bridge.Store
		closeStore = func() {}
	)
	if rdb == nil {
		ms, err := bridge.NewMemoryStore(cfg.StoreMaxBytes, cfg.StoreTTL)
		if err != nil {
			ln.Close()
			return nil, &ConfigError{fmt.Errorf("MDPROXY_STORE_MAX_BYTES: %w", err)}
		}
		store, closeStore = ms, ms.Close
	} else {
		// The settings are validated already: an error here is the wiring's.
		rs, err := bridge.NewRedisStore(rdb, bridge.RedisStoreOptions{Prefix: prefix, TTL: cfg.StoreTTL,
			PendingTTL: cfg.BridgePendingTTL, Timeout: timeout, MaxBytes: cfg.StoreMaxBytes, Answers: answers, Logger: blog})
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("the bridge's result store on Redis: %w", err)
		}
		store, closeStore = rs, rs.Close
	}
	b, err := bridge.New(bridge.Options{
		CallbackURL:     base,
		Store:           store,
		Refresh:         cfg.BridgeRefresh,
		PendingTTL:      cfg.BridgePendingTTL,
		MaxPendingBytes: cfg.BridgePendingMaxBytes,
		Logger:          blog,
	})
	if err != nil {
		closeStore()
		ln.Close()
		return nil, &ConfigError{err}
	}
	metrics.RegisterBridge(reg, b, store)
	metrics.RegisterBridgeAnswers(reg, answers)
	// A callback is a small JSON body, read whole by the handler, or left for net/http
	// to read (up to 256 KiB) before it answers a refusal: both reads are bounded, so
	// that a peer silent in its body does not hold a connection for ever, and is
	// still answered. The answers are bounded too, so that a peer that sends callbacks
	// back to back and reads none of the answers is cut once they fill its buffers:
	// net/http counts WriteTimeout from the end of the request's header, and the
	// answer comes after the body's read, which may take the whole ReadTimeout, so the
	// write gets one body idle timeout more than the read.
	srv := &http.Server{
		Handler:           closeAmbiguous(b.Handler()),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.BodyIdleTimeout,
		WriteTimeout:      2 * cfg.BodyIdleTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          serverErrorLog(log),
	}
	return &bridgeRunning{b: b, closeStore: closeStore, srv: srv, ln: ln, cbBase: base}, nil
}

// serve serves Core's callbacks until close, over TLS with the proxy's certificate
// when MDPROXY_TLS_CERT_FILE is set; the server's end goes to errc.
func (br *bridgeRunning) serve(cfg *Config, log *slog.Logger, errc chan<- error) {
	if br == nil {
		return
	}
	ln := cfg.listenTLS(br.ln, br.srv, log)
	go func() {
		if err := br.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("bridge's callback listener: %w", err)
		}
	}()
}

// close stops the callback listener and the store.
func (br *bridgeRunning) close() {
	if br == nil {
		return
	}
	br.srv.Close()
	br.closeStore()
}

// dialable returns a's host:port with an unspecified host (0.0.0.0, ::) replaced by
// loopback, so that Core, in the same network namespace, can dial it.
func dialable(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
