package sidecar

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/metrics"
)

// validateRedis checks MDPROXY_REDIS_URL, MDPROXY_REDIS_TIMEOUT and MDPROXY_REPLICAS,
// and keeps the parsed URL. A bad URL is named without its value's password.
// maxReplicas bounds MDPROXY_REPLICAS: far more replicas than share one Core, and a
// client window times it (the fallback's share) stays within a time.Duration.
const maxReplicas = 1000

func (c *Config) validateRedis(environ map[string]string) error {
	var errs envconf.Errors
	bad := func(name, want string) { errs.Add(envconf.Invalid(environ, EnvPrefix, name, want)) }
	c.redisOpts = nil
	if c.RedisURL != "" {
		opts, err := redis.ParseURL(c.RedisURL)
		if err != nil {
			// go-redis says what is wrong (the scheme, the port, the database number);
			// its message may quote the URL, so only its last part is kept.
			why := strings.TrimPrefix(err.Error(), "redis: ")
			if i := strings.LastIndex(why, `": `); i >= 0 && strings.Contains(why[:i], "://") {
				why = why[i+3:] // net/url's error: `parse "<the URL>": <why>`
			}
			if strings.Contains(why, "://") {
				why = "not a valid URL"
			}
			errs.Add(&envconf.Error{Var: EnvPrefix + "REDIS_URL", Value: redactedURL(c.RedisURL),
				Want: configWants["REDIS_URL"] + " (" + why + ")"})
		} else if u, _ := url.Parse(c.RedisURL); opts.Network == "tcp" && !validHost(u.Hostname()) {
			// go-redis reads "redis://:6379" as localhost, which a URL whose host is
			// missing rarely means: refused as no host.
			errs.Add(&envconf.Error{Var: EnvPrefix + "REDIS_URL", Value: redactedURL(c.RedisURL),
				Want: configWants["REDIS_URL"] + " (its host is no IP address or DNS name)"})
		} else {
			c.redisOpts = opts
		}
	}
	if c.RedisTimeout <= 0 || c.RedisTimeout > maxTimeout {
		bad("REDIS_TIMEOUT", configWants["REDIS_TIMEOUT"])
	}
	if c.Replicas < 1 || c.Replicas > maxReplicas {
		bad("REPLICAS", configWants["REPLICAS"])
	}
	return errs.Err()
}

// redactedURL is u, a URL as given, with any password replaced by "xxxxx", for logs,
// /config and the error naming a bad value: u itself without a password, net/url's
// Redacted when u parses, else the same done by hand on what stands between "://" and
// the first "/" after it.
func redactedURL(u string) string {
	if parsed, err := url.Parse(u); err == nil {
		if _, ok := parsed.User.Password(); !ok {
			return u // as given: nothing to hide
		}
		return parsed.Redacted()
	}
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	authority, path, _ := strings.Cut(rest, "/")
	at := strings.LastIndex(authority, "@")
	user, _, hasPassword := strings.Cut(authority[:max(at, 0)], ":")
	if at < 0 || !hasPassword {
		return u
	}
	redacted := scheme + "://" + user + ":xxxxx" + authority[at:]
	if len(authority) < len(rest) {
		redacted += "/" + path
	}
	return redacted
}

// newRedisClient returns the client of c's Redis, nil when none is configured: no
// retries of its own (the limiter's breaker decides when to try again), every dial,
// read, write and wait for a pooled connection bounded by MDPROXY_REDIS_TIMEOUT, and
// each command timed and its failures counted in m.
func newRedisClient(c *Config, m *metrics.Redis) *redis.Client {
	if c.redisOpts == nil {
		return nil
	}
	o := *c.redisOpts
	o.MaxRetries = -1
	o.DialTimeout = c.RedisTimeout
	o.ReadTimeout = c.RedisTimeout
	o.WriteTimeout = c.RedisTimeout
	o.PoolTimeout = c.RedisTimeout
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true // no CLIENT SETINFO: Redis before 7.2 lacks it
	// No CLIENT MAINT_NOTIFICATIONS on connect: Redis Enterprise's, an error elsewhere
	// (counted in mdproxy_redis_errors_total at each new connection).
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.DialerRetries = 1 // one dial a call: a refused one is a failed call at once
	quietRedisLog.Do(func() { redis.SetLogger(discardRedisLog{}) })
	rdb := redis.NewClient(&o)
	rdb.AddHook(redisMetrics{m})
	return rdb
}

// quietRedisLog silences go-redis's own log, once a process: it would write a line,
// not JSON, for every failed dial while Redis is down; the limiter logs each change of
// mode instead, and the metrics count the failures.
var quietRedisLog sync.Once

// discardRedisLog is a go-redis logger that writes nothing.
type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// redisMetrics is a go-redis hook that times each command and counts its failures.
type redisMetrics struct{ m *metrics.Redis }

func (h redisMetrics) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisMetrics) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		h.observe(cmd.Name(), start, err)
		return err
	}
}

func (h redisMetrics) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		h.observe("pipeline", start, err)
		return err
	}
}

// observe records one call of command that started at start and ended with err. A key
// not found (redis.Nil) and a script not yet loaded (NOSCRIPT, which go-redis answers
// by sending the script) are not failures.
func (h redisMetrics) observe(command string, start time.Time, err error) {
	h.m.Duration.WithLabelValues(command).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "NOSCRIPT") {
		h.m.Errors.WithLabelValues(command).Inc()
	}
}
