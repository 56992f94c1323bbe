package sidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/limiter"
)

// EnvPrefix starts every variable mdproxy reads.
const EnvPrefix = "MDPROXY_"

// Config is mdproxy's configuration, read from MDPROXY_* environment variables by
// LoadConfig.
type Config struct {
	// ListenAddr is the proxy's address, where clients send Core's API. Default :8009.
	ListenAddr string `env:"LISTEN_ADDR" envDefault:":8009"`
	// AdminAddr serves /metrics, /healthz and /readyz of the proxy itself, never on the
	// proxy port (Core's /readyz is forwarded there). Default :9009.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:":9009"`
	// UpstreamURL is Core's base URL. Default http://127.0.0.1:8008 (Core's port, the
	// sidecar's neighbour).
	UpstreamURL string `env:"UPSTREAM_URL" envDefault:"http://127.0.0.1:8008"`
	// LimitStatus is the status of a rejected request: 503 (Core's own answer when busy,
	// which clients already handle) or 429. Default 503.
	LimitStatus int `env:"LIMIT_STATUS" envDefault:"503"`
	// RateLimitHeaders adds the RateLimit-Policy and RateLimit fields
	// (draft-ietf-httpapi-ratelimit-headers-10) to the answers of routes with a rate.
	// Default false.
	RateLimitHeaders bool `env:"RATELIMIT_HEADERS" envDefault:"false"`

	// Adaptive turns on the adaptive limit: the rates of the routes with a rate follow
	// Core's scan queue (package adaptive, docs/adaptive.md). Default false.
	Adaptive bool `env:"ADAPTIVE" envDefault:"false"`
	// AdaptiveInterval is how often the adaptive limit reads Core's /stat/nodes, 100ms
	// to 10m. Default 5s.
	AdaptiveInterval time.Duration `env:"ADAPTIVE_INTERVAL" envDefault:"5s"`
	// AdaptiveTarget is the share of Core's scan queue in use above which the rates
	// fall, above 0 and at most 1. Default 0.8.
	AdaptiveTarget float64 `env:"ADAPTIVE_TARGET" envDefault:"0.8"`
	// AdaptiveDryRun computes and exports the rates the adaptive limit would set, and
	// sets none. Default false.
	AdaptiveDryRun bool `env:"ADAPTIVE_DRY_RUN" envDefault:"false"`
	// CoreAPIKey is the apikey the adaptive limit reads Core's /stat/nodes with (a
	// secret: never logged, redacted in /config). Default none.
	CoreAPIKey string `env:"CORE_APIKEY"`
	// TrustedProxies are the CIDRs (or single addresses) of load balancers whose
	// X-Forwarded-For (or X-Real-IP) is believed for per-client keys, and whose
	// X-Forwarded-Proto, -Host, -Port, Forwarded and the like reach Core as sent.
	// Default none.
	TrustedProxies []string `env:"TRUSTED_PROXIES" envSeparator:","`
	// UpstreamTimeout bounds the wait for Core's response headers once the request is
	// sent; then 504. Default 60s.
	UpstreamTimeout time.Duration `env:"UPSTREAM_TIMEOUT" envDefault:"60s"`
	// UpstreamCheckInterval is how often mdproxy asks Core's /readyz whether Core can
	// be reached (mdproxy_upstream_up, a warning when it cannot); the first check is at
	// start. Default 10s; 0 turns the check off (no gauge, no warning).
	UpstreamCheckInterval time.Duration `env:"UPSTREAM_CHECK_INTERVAL" envDefault:"10s"`
	// DialTimeout bounds connecting to Core; then 502. Default 5s.
	DialTimeout time.Duration `env:"UPSTREAM_DIAL_TIMEOUT" envDefault:"5s"`
	// ReadHeaderTimeout bounds reading a client's request headers (not its body: a slow
	// upload is never cut). Default 10s.
	ReadHeaderTimeout time.Duration `env:"READ_HEADER_TIMEOUT" envDefault:"10s"`
	// IdleTimeout closes a client's kept-alive connection idle that long. Default 120s.
	IdleTimeout time.Duration `env:"IDLE_TIMEOUT" envDefault:"120s"`
	// BodyIdleTimeout bounds how long a request or response body may make no progress,
	// in either direction: a client that stops sending its upload or stops reading its
	// answer, or Core that stops reading an upload or stops sending an answer. The
	// exchange is then cut and counted. It also bounds the proxy's own answers (a
	// limit answer, a stored result, a refusal, Core's answer to a bridged poll, read
	// whole first), each write with a deadline of it; the admin
	// listener's writes (its write timeout); and on the bridge's listener the reading
	// of each of Core's callbacks, whole, and the writing of its answer (within twice
	// it). Default 60s.
	BodyIdleTimeout time.Duration `env:"BODY_IDLE_TIMEOUT" envDefault:"60s"`
	// MaxConnections is the most client connections the proxy port holds open at once:
	// beyond it a new one waits in the kernel's backlog until another closes (each open
	// connection holds memory: README, Memory). Default 1024; from 1 to 1000000.
	MaxConnections int `env:"MAX_CONNECTIONS" envDefault:"1024"`
	// ShutdownDelay is how long, after SIGTERM, /readyz answers 503 while the proxy
	// keeps serving, so that load balancers stop sending before the listener closes.
	// A second SIGTERM or SIGINT ends the delay early. Default 5s; 0 closes the
	// listener at once.
	ShutdownDelay time.Duration `env:"SHUTDOWN_DELAY" envDefault:"5s"`
	// ShutdownTimeout is how long in-flight requests, uploads included, may run after
	// the listener closed before they are cut. Default 30s; 0 cuts them at once.
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s"`
	// ClientKeysMax is the most client keys that each route's per-client share tracks
	// at once, and, with Redis, the most views of clients' shares in Redis that the
	// replica keeps; a key is freed once its bucket is full again (within a window).
	// Beyond it, a new key's requests skip the per-client check (the route's bucket
	// still applies), counted and logged. Default 100000; must be above 0.
	ClientKeysMax int `env:"CLIENT_KEYS_MAX" envDefault:"100000"`
	// ClientIPv6Prefix is the prefix length, in bits, by which IPv6 client addresses
	// (the peer's, or a trusted proxy's X-Forwarded-For or X-Real-IP) are grouped into
	// one key of a per-client share: a host given a /64 takes any address in it at
	// will. Default 64; from 1 to 128 (128: each address its own key).
	ClientIPv6Prefix int `env:"CLIENT_IPV6_PREFIX" envDefault:"64"`
	// ClientIPv4Prefix is the same for IPv4 addresses, IPv4-mapped IPv6 ones included.
	// Default 32 (each address its own key); from 1 to 32.
	ClientIPv4Prefix int `env:"CLIENT_IPV4_PREFIX" envDefault:"32"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// LogFormat is how log lines are written: json (one JSON object a line) or text
	// (slog's key=value lines). Default "": text when the log writer is a terminal,
	// json otherwise (see LogHandler).
	LogFormat string `env:"LOG_FORMAT"`
	// LimitsFile is the path of a file of route limit variables (MDPROXY_<ROUTE>_RATE=10
	// lines, e.g. a Kubernetes ConfigMap mounted as a file), read at start and again on
	// SIGHUP and when the file changed and settled (LimitsFileSettle); its variables
	// take precedence over the environment's. Default none: the limits are the
	// environment's until a restart.
	LimitsFile string `env:"LIMITS_FILE"`
	// LimitsFileSettle is how long the limits file must stay unchanged after a change
	// before it is put in force: it is read at each change seen and again once this
	// time passed without another, and applied only when both readings match, so that a
	// file written in place (truncated, then written in parts) is not put in force
	// empty or half-written. A SIGHUP reads the file at once. Default 1s; from 10ms to
	// 1m.
	LimitsFileSettle time.Duration `env:"LIMITS_FILE_SETTLE" envDefault:"1s"`

	// Limits is each route's limit, from MDPROXY_<ROUTE>_RATE, _BURST, _MAX_WAIT,
	// _CLIENT_LIMIT, _CLIENT_WINDOW and _DRY_RUN; see DefaultLimits.
	Limits map[string]limiter.Limit `env:"-"`

	upstream *url.URL
	trusted  []netip.Prefix
	level    slog.Level
	noEffect []string // settings that have no effect, for a warning; see ineffective
	unknown  []string // variables named like settings but none, for a warning; see unknownVariables
	// limitsRead is the content of the limits file whose limits are Limits; nil without
	// a file. A reload of the same content changes nothing.
	limitsRead []byte

	// TLS to clients and to Core, and the admin port's extras (sidecar/tls.go and
	// sidecar/admin.go). File names are read at start; see validateTLS.

	// TLSCertFile is the PEM certificate (chain, leaf first) that the proxy listener
	// serves HTTPS with, and TLSKeyFile its PEM private key. Both or neither; neither
	// (the default) serves plain HTTP. Both files are read again when they changed (a
	// renewed Secret), at most every few seconds, on a new connection, and taken once
	// two such checks read them alike; a renewal that does not load keeps the
	// certificate served and is logged.
	TLSCertFile string `env:"TLS_CERT_FILE"`
	TLSKeyFile  string `env:"TLS_KEY_FILE"`
	// UpstreamCAFile is a PEM bundle of the CA certificates that an https upstream's
	// certificate is verified against. Default none: the system's roots.
	UpstreamCAFile string `env:"UPSTREAM_CA_FILE"`
	// UpstreamCertFile and UpstreamKeyFile are the PEM client certificate and key
	// presented to an https upstream that asks for one (mutual TLS), reloaded as
	// TLSCertFile is. Both or neither; default none.
	UpstreamCertFile string `env:"UPSTREAM_CERT_FILE"`
	UpstreamKeyFile  string `env:"UPSTREAM_KEY_FILE"`
	// UpstreamServerName is the name sent to an https upstream in TLS's SNI and that
	// its certificate must carry. Default: the host of UpstreamURL.
	UpstreamServerName string `env:"UPSTREAM_SERVER_NAME"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the admin listener. Default
	// false: /debug/pprof/ answers 404.
	Pprof bool `env:"PPROF"`

	// The bridge (sidecar/bridge.go, package bridge): Core's callbacks taken by mdproxy,
	// polls answered from what it knows.

	// Bridge turns the bridge on (the default) or off (false: every request is
	// forwarded as without it).
	Bridge bool `env:"BRIDGE" envDefault:"true"`
	// BridgeListenAddr is the callback listener's address, where Core delivers the
	// results of bridged submissions; a sidecar shares Core's network namespace, so the
	// default is loopback. Default 127.0.0.1:9010.
	BridgeListenAddr string `env:"BRIDGE_LISTEN_ADDR" envDefault:"127.0.0.1:9010"`
	// BridgeCallbackURL is the base URL at which Core reaches the callback listener.
	// Default: http:// (https:// with MDPROXY_TLS_CERT_FILE) and the listener's address,
	// http://127.0.0.1:9010 with the default address.
	BridgeCallbackURL string `env:"BRIDGE_CALLBACK_URL"`
	// BridgeRefresh is how long a pending scan's callback may be overdue before Core is
	// asked about it (then at most once per BridgeRefresh per data_id). Default 60s.
	BridgeRefresh time.Duration `env:"BRIDGE_REFRESH" envDefault:"60s"`
	// BridgePendingTTL is how long a submission waits for its result before the bridge
	// forgets it (its polls are then forwarded). Default 24h.
	BridgePendingTTL time.Duration `env:"BRIDGE_PENDING_TTL" envDefault:"24h"`
	// BridgePendingMaxBytes bounds what the pending ids hold, in bytes: each id's
	// data_id and 512 bytes, plus Core's reply it holds as its answer; beyond it the
	// oldest ids are dropped (their polls are then forwarded). Default 33554432 (32 MiB).
	BridgePendingMaxBytes int64 `env:"BRIDGE_PENDING_MAX_BYTES" envDefault:"33554432"`
	// StoreMaxBytes bounds the bytes of final results kept, in bytes. Default 268435456
	// (256 MiB).
	StoreMaxBytes int64 `env:"STORE_MAX_BYTES" envDefault:"268435456"`
	// StoreTTL is how long a final result is kept, as Core keeps it by default. Default
	// 24h. In memory (no Redis), a result expires to within a hundredth of it, at most
	// 1s (the store's coarse clock, bridge.MemoryStore).
	StoreTTL time.Duration `env:"STORE_TTL" envDefault:"24h"`

	// Shared limits and results on Redis (sidecar/redis.go): several replicas in front
	// of one Core share each route's bucket and the bridge's results.

	// RedisURL is the Redis that replicas share, redis://[user:password@]host:port/db
	// or rediss:// for TLS (go-redis's ParseURL syntax). Default none: each replica's
	// buckets and results are its own.
	RedisURL string `env:"REDIS_URL"`
	// RedisPrefix starts every key mdproxy writes in Redis. Default mdproxy:.
	RedisPrefix string `env:"REDIS_PREFIX" envDefault:"mdproxy:"`
	// RedisTimeout bounds each Redis call (a limit decision, a result looked up or
	// stored); one that misses it counts as Redis down. Default 50ms.
	RedisTimeout time.Duration `env:"REDIS_TIMEOUT" envDefault:"50ms"`
	// Replicas is how many replicas share the Redis: when Redis does not answer, each
	// limits at its share of each limit (rate/Replicas). Default 1.
	Replicas int `env:"REPLICAS" envDefault:"1"`

	redisOpts *redis.Options // parsed RedisURL; nil when none

	tlsLoaded tlsSettings
}

// DefaultLimits are the limits of routes whose variables are unset; every other route is
// unlimited. The README explains them from the published benchmark: at 10 accepted
// polls a second, Core 5.13 on 8 vCPU took 28.6 min for the workload that took 26.9 min
// without polling (Webhook) and 45.2 min with unlimited polling.
var DefaultLimits = map[string]limiter.Limit{
	"file_result":  {Rate: 10, Burst: 20},
	"batch_status": {Rate: 2, Burst: 4},
	"hash_lookup":  {Rate: 10, Burst: 20},
}

// ConfigError is a bad setting, returned by LoadConfig and Run before anything
// listens; mdproxy's main exits 2 on it. Its message names the variable and what it
// accepts.
type ConfigError struct{ err error }

func (e *ConfigError) Error() string { return e.err.Error() }
func (e *ConfigError) Unwrap() error { return e.err }

// LoadConfig reads the configuration from environ (variable name to value, as
// env.ToMap(os.Environ()) gives; the process environment itself is not read) and
// validates it. The error, a *ConfigError, names the variable and what it accepts.
//
// The route limits are read from MDPROXY_LIMITS_FILE too, when it is set (see
// loadLimits): a file that cannot be read, or a bad variable in it, is a *ConfigError
// naming the file (and the variable). Every bad variable is named, one a line (an
// envconf.Errors), not only the first.
func LoadConfig(environ map[string]string) (*Config, error) {
	var c Config
	var errs envconf.Errors
	for _, err := range envconf.ParseAll(&c, EnvPrefix, environ) {
		// What the variable accepts, its range included, rather than only its type.
		var ee *envconf.Error
		if errors.As(err, &ee) {
			if want, ok := configWants[strings.TrimPrefix(ee.Var, EnvPrefix)]; ok {
				ee.Want = want
			}
		}
		errs.Add(err)
	}
	errs.Add(c.validate(environ))
	var lf limitsFile
	if c.LimitsFile != "" {
		lf = readLimitsFile(c.LimitsFile)
	}
	limits, noEffect, err := loadLimits(environ, c.LimitsFile, lf)
	errs.Add(err)
	if err := errs.Err(); err != nil {
		return nil, &ConfigError{err}
	}
	c.Limits, c.noEffect, c.limitsRead = limits, noEffect, lf.data
	c.unknown = unknownVariables(environ)
	return &c, nil
}

// maxTimeout bounds the timeouts and delays (MDPROXY_*_TIMEOUT, SHUTDOWN_DELAY,
// BRIDGE_REFRESH): they are doubled or added up, and time.Duration holds about 292
// years; a day is beyond any wait a client or Kubernetes makes. maxTTL bounds how long
// the bridge keeps a pending id or a result.
const (
	maxTimeout = 24 * time.Hour
	maxTTL     = 365 * 24 * time.Hour
)

// minSettle and maxSettle bound MDPROXY_LIMITS_FILE_SETTLE: below 10 ms a writer's
// pause between two writes would hardly ever be covered; beyond a minute an edit would
// seem not to be taken.
const (
	minSettle = 10 * time.Millisecond
	maxSettle = time.Minute
)

// maxConnections bounds MDPROXY_MAX_CONNECTIONS: a million connections of tens of KiB
// each are tens of GiB.
const maxConnections = 1_000_000

// maxClientKeys bounds MDPROXY_CLIENT_KEYS_MAX: at 20 to 40 bytes a key, at most
// 400 MB a route (with Redis, 40 to 85 bytes more for the replica's views: 1.25 GB).
const maxClientKeys = 10_000_000

// configWants says what the variables whose range validate checks accept, by name
// less the prefix: the message of a value out of range and of one that does not parse.
var configWants = map[string]string{
	"LIMIT_STATUS":             "want 503 or 429",
	"ADAPTIVE":                 "want true or false",
	"ADAPTIVE_INTERVAL":        "want a duration with its unit from 100ms to 10m (e.g. 5s)",
	"ADAPTIVE_TARGET":          "want a share of Core's scan queue above 0, at most 1 (e.g. 0.8)",
	"UPSTREAM_TIMEOUT":         "want a duration with its unit above 0, at most 24h (e.g. 60s)",
	"UPSTREAM_CHECK_INTERVAL":  "want a duration with its unit >= 0, at most 24h (e.g. 10s); 0 = no check",
	"UPSTREAM_DIAL_TIMEOUT":    "want a duration with its unit above 0, at most 24h (e.g. 5s)",
	"READ_HEADER_TIMEOUT":      "want a duration with its unit above 0, at most 24h (e.g. 10s)",
	"IDLE_TIMEOUT":             "want a duration with its unit above 0, at most 24h (e.g. 120s)",
	"BODY_IDLE_TIMEOUT":        "want a duration with its unit above 0, at most 24h (e.g. 60s)",
	"SHUTDOWN_DELAY":           "want a duration with its unit >= 0, at most 24h (e.g. 5s); 0 = close the listener at once",
	"SHUTDOWN_TIMEOUT":         "want a duration with its unit >= 0, at most 24h (e.g. 30s); 0 = cut in-flight requests at once",
	"BRIDGE_REFRESH":           "want a duration with its unit above 0, at most 24h (e.g. 60s)",
	"BRIDGE_PENDING_TTL":       "want a duration with its unit above 0, at most 8760h (e.g. 24h)",
	"BRIDGE_PENDING_MAX_BYTES": "want a whole number of bytes from 1048576 (1 MiB) up (e.g. 33554432)",
	"STORE_MAX_BYTES":          "want a whole number of bytes from 1048576 (1 MiB) up (e.g. 268435456)",
	"STORE_TTL":                "want a duration with its unit above 0, at most 8760h (e.g. 24h)",
	"REDIS_URL":                "want a redis:// or rediss:// URL, e.g. redis://:password@redis:6379/0",
	"REDIS_TIMEOUT":            "want a duration with its unit above 0, at most 24h (e.g. 50ms)",
	"LOG_FORMAT":               "want json or text (unset: text when stderr is a terminal, else json)",
	"REPLICAS":                 "want a whole number of replicas sharing the Redis from 1 up, at most 1000 (e.g. 2)",
	"LIMITS_FILE_SETTLE":       "want a duration with its unit from 10ms to 1m (e.g. 1s)",
	"CLIENT_IPV6_PREFIX":       "want a prefix length in bits from 1 to 128 (e.g. 64; 128: each address its own key)",
	"CLIENT_IPV4_PREFIX":       "want a prefix length in bits from 1 to 32 (e.g. 32: each address its own key)",
	"MAX_CONNECTIONS":          fmt.Sprintf("want a whole number of connections from 1 to %d (e.g. 1024)", maxConnections),
	"CLIENT_KEYS_MAX":          fmt.Sprintf("want a whole number of client keys per route from 1 to %d (e.g. 100000)", maxClientKeys),
}

// validate rejects values that parse but make no sense, naming each such variable, one
// error a variable (an envconf.Errors); nil when all are good.
func (c *Config) validate(environ map[string]string) error {
	var errs envconf.Errors
	bad := func(name, want string) { errs.Add(envconf.Invalid(environ, EnvPrefix, name, want)) }
	// An address set empty is a mistake: the checks below must see it empty.
	envconf.EmptyWhenSet(environ, EnvPrefix, map[string]*string{
		"UPSTREAM_URL": &c.UpstreamURL, "LISTEN_ADDR": &c.ListenAddr, "ADMIN_ADDR": &c.AdminAddr})
	u, err := url.Parse(c.UpstreamURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || !validURL(c.UpstreamURL, u) || u.User != nil {
		// Named without its password, as /config and the logs show it. A user or
		// password would not be sent (httputil.ReverseProxy does not take them from
		// the URL, and Core authenticates each client's request by its apikey): refused
		// rather than ignored.
		errs.Add(&envconf.Error{Var: EnvPrefix + "UPSTREAM_URL", Value: redactedURL(c.UpstreamURL),
			Want: "want an http or https URL with a host, a port of 1 to 65535 if any, and no user or password, e.g. http://127.0.0.1:8008"})
	} else {
		c.upstream = u
	}
	if !validListenAddr(c.ListenAddr) {
		bad("LISTEN_ADDR", "want a host:port to listen on, port 0 to 65535, e.g. :8009")
	}
	// Port 0 gives each listener a free port of its own: the same address twice is fine.
	if !validListenAddr(c.AdminAddr) || sameListener(c.AdminAddr, c.ListenAddr) {
		bad("ADMIN_ADDR", "want a host:port to listen on, port 0 to 65535, not the proxy's, e.g. :9009")
	}
	if c.LimitStatus != 503 && c.LimitStatus != 429 {
		bad("LIMIT_STATUS", configWants["LIMIT_STATUS"])
	}
	if c.AdaptiveInterval < 100*time.Millisecond || c.AdaptiveInterval > 10*time.Minute {
		bad("ADAPTIVE_INTERVAL", configWants["ADAPTIVE_INTERVAL"])
	}
	if !(c.AdaptiveTarget > 0 && c.AdaptiveTarget <= 1) {
		bad("ADAPTIVE_TARGET", configWants["ADAPTIVE_TARGET"])
	}
	c.trusted = nil
	for _, s := range c.TrustedProxies {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				bad("TRUSTED_PROXIES", fmt.Sprintf("want comma-separated CIDRs or addresses, e.g. 10.0.0.0/8,192.0.2.7; %q is neither", s))
				continue
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		// A peer's IPv4-mapped IPv6 address is read as IPv4 (proxy.parseAddr): so is
		// a trusted prefix written so, or it would never match.
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"UPSTREAM_TIMEOUT", c.UpstreamTimeout}, {"UPSTREAM_DIAL_TIMEOUT", c.DialTimeout},
		{"READ_HEADER_TIMEOUT", c.ReadHeaderTimeout}, {"IDLE_TIMEOUT", c.IdleTimeout},
		{"BODY_IDLE_TIMEOUT", c.BodyIdleTimeout},
	} {
		if t.d <= 0 || t.d > maxTimeout {
			bad(t.name, configWants[t.name])
		}
	}
	if c.UpstreamCheckInterval < 0 || c.UpstreamCheckInterval > maxTimeout {
		bad("UPSTREAM_CHECK_INTERVAL", configWants["UPSTREAM_CHECK_INTERVAL"])
	}
	if c.ShutdownDelay < 0 || c.ShutdownDelay > maxTimeout {
		bad("SHUTDOWN_DELAY", configWants["SHUTDOWN_DELAY"])
	}
	if c.ShutdownTimeout < 0 || c.ShutdownTimeout > maxTimeout {
		bad("SHUTDOWN_TIMEOUT", configWants["SHUTDOWN_TIMEOUT"])
	}
	if c.LimitsFileSettle < minSettle || c.LimitsFileSettle > maxSettle {
		bad("LIMITS_FILE_SETTLE", configWants["LIMITS_FILE_SETTLE"])
	}
	if c.MaxConnections < 1 || c.MaxConnections > maxConnections {
		bad("MAX_CONNECTIONS", configWants["MAX_CONNECTIONS"])
	}
	if c.ClientKeysMax < 1 || c.ClientKeysMax > maxClientKeys {
		bad("CLIENT_KEYS_MAX", configWants["CLIENT_KEYS_MAX"])
	}
	if c.ClientIPv6Prefix < 1 || c.ClientIPv6Prefix > 128 {
		bad("CLIENT_IPV6_PREFIX", configWants["CLIENT_IPV6_PREFIX"])
	}
	if c.ClientIPv4Prefix < 1 || c.ClientIPv4Prefix > 32 {
		bad("CLIENT_IPV4_PREFIX", configWants["CLIENT_IPV4_PREFIX"])
	}
	if err := c.level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		bad("LOG_LEVEL", "want debug, info, warn or error")
	}
	if c.LogFormat != "" && c.LogFormat != LogJSON && c.LogFormat != LogText {
		bad("LOG_FORMAT", configWants["LOG_FORMAT"])
	}
	errs.Add(c.validateTLS(environ))
	errs.Add(c.validateBridge(environ))
	errs.Add(c.validateRedis(environ))
	return errs.Err()
}

// validURL reports whether u, parsed from s, has a host validHost takes, names a port of
// 1 to 65535 if any, and s
// holds no character that a URI cannot (RFC 3986: no space, control, quote, <, >, \,
// ^, `, {, |, }), which url.Parse lets through in a path: Core could not use the URL.
func validURL(s string, u *url.URL) bool {
	if !validHost(u.Hostname()) {
		return false
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return false
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return false // a colon and no port
	}
	for i := range len(s) {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("\"<>\\^`{|}", c) >= 0 {
			return false
		}
	}
	return true
}

// validHost reports whether h is an IP address or a DNS host name (RFC 1123, section
// 2.1: dot-separated labels of 1 to 63 letters, digits and inner hyphens, 253 bytes at
// most, the last label not all digits, which some resolvers would read as an address:
// "127.1", "256.1.1.1"). RFC 3986 lets a URL's host hold more ("$", "(", ")", "_"),
// which no resolver finds, such as a Kubernetes $(POD_IP) left unexpanded.
func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = strings.TrimSuffix(h, ".") // a fully qualified name
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := range len(l) {
			c := l[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != "" && !strings.HasPrefix(strings.ToLower(last), "0x")
}

// sameListener reports whether listening on a and on b (valid listen addresses) would
// take the same port: the same port other than 0, on the same host or where either is
// every address (an empty host, 0.0.0.0 or ::). Port 0 gives each listener a free port
// of its own.
func sameListener(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	na, erra := strconv.Atoi(pa)
	nb, errb := strconv.Atoi(pb)
	if erra != nil || errb != nil || na != nb || na == 0 {
		return false
	}
	every := func(h string) bool {
		ip, err := netip.ParseAddr(h)
		return h == "" || (err == nil && ip.IsUnspecified())
	}
	return ha == hb || every(ha) || every(hb)
}

// validListenAddr reports whether a is host:port with a numeric port of 0 to 65535.
func validListenAddr(a string) bool {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}
