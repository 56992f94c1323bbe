package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Redis is what mdproxy measures of its calls to Redis (MDPROXY_REDIS_URL). Each
// command label is a Redis command's name in lower case (evalsha, eval, get, set...):
// a fixed set, the few commands mdproxy sends. Series appear when a command is first
// sent. Safe for concurrent use.
type Redis struct {
	// Duration is each call's time, in seconds, by command; a pipeline is observed as
	// "pipeline".
	Duration *prometheus.HistogramVec
	// Errors counts the calls that failed (Redis unreachable, the deadline missed, an
	// error reply), by command; a key not found is not an error.
	Errors *prometheus.CounterVec
}

// redisBuckets are Redis call durations in seconds: from 100 µs (a loopback round
// trip) to the 50 ms of MDPROXY_REDIS_TIMEOUT's default and beyond it.
var redisBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}

// NewRedis registers mdproxy_redis_request_duration_seconds and
// mdproxy_redis_errors_total on reg. It panics if they are already registered.
func NewRedis(reg prometheus.Registerer) *Redis {
	m := &Redis{
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "redis_request_duration_seconds",
			Help:    "Time of each call to Redis (a limit decision, a result looked up or stored), in seconds, by command.",
			Buckets: redisBuckets,
		}, []string{"command"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "redis_errors_total",
			Help: "Calls to Redis that failed (unreachable, MDPROXY_REDIS_TIMEOUT missed, error reply), by command; the limits then fall back to local buckets.",
		}, []string{"command"}),
	}
	reg.MustRegister(m.Duration, m.Errors)
	return m
}

// RegisterLimiterMode registers on reg mdproxy_limiter_mode{mode}, read from mode at
// each scrape: 1 for the mode in force, 0 for each other of modes (local: no Redis;
// redis: shared by the replicas; fallback: Redis configured but not answering, each
// replica at its share of each limit). It panics if it is already registered.
func RegisterLimiterMode(reg prometheus.Registerer, modes []string, mode func() string) {
	reg.MustRegister(modeCollector{modes, mode})
}

var limiterModeDesc = prometheus.NewDesc(Namespace+"_limiter_mode",
	"Where the limits are decided: 1 for the mode in force (local: each replica alone; redis: shared on MDPROXY_REDIS_URL; fallback: Redis not answering, each replica at rate/MDPROXY_REPLICAS), 0 for the others.",
	[]string{"mode"}, nil)

type modeCollector struct {
	modes []string
	mode  func() string
}

func (c modeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- limiterModeDesc }

func (c modeCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.mode()
	for _, m := range c.modes {
		v := 0.0
		if m == now {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(limiterModeDesc, prometheus.GaugeValue, v, m)
	}
}

// RestoresReporter is what RegisterLimiterRestores reads at each scrape;
// *limiter.Redis is one.
type RestoresReporter interface {
	// Restores calls f for each route with a bucket on Redis and each kind of key
	// (route: the route's bucket; client: a client's share, a fixed set): the keys of
	// that kind found lost in Redis and restored from this replica's view, since the
	// start.
	Restores(f func(route, kind string, n uint64))
}

// RegisterLimiterRestores registers on reg mdproxy_limiter_redis_restores_total by
// route and bucket (counter), read from r at each scrape; every route with a bucket on
// Redis has its two series from the start. It panics if it is already registered.
func RegisterLimiterRestores(reg prometheus.Registerer, r RestoresReporter) {
	reg.MustRegister(restoresCollector{r})
}

var restoresDesc = prometheus.NewDesc(Namespace+"_limiter_redis_restores_total",
	"Limiter keys this replica found lost in Redis (evicted under maxmemory, flushed, or Redis restarted empty) while its last view of them was still ahead, and restored from that view, by route and bucket (route: the route's bucket; client: a client's share). Above 0: Redis is short of memory for the limits.",
	[]string{"route", "bucket"}, nil)

// restoresCollector reads a RestoresReporter at scrape time.
type restoresCollector struct{ r RestoresReporter }

func (c restoresCollector) Describe(ch chan<- *prometheus.Desc) { ch <- restoresDesc }

func (c restoresCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.Restores(func(route, kind string, n uint64) {
		ch <- prometheus.MustNewConstMetric(restoresDesc, prometheus.CounterValue, float64(n), route, kind)
	})
}
