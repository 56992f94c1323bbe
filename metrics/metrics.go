// Package metrics holds mdproxy's Prometheus collectors. They are registered on the
// registry passed to New, never on the global one, under the namespace "mdproxy".
//
// Every label value comes from a fixed set, so that the number of series stays bounded
// whatever clients send: route is a route name of the proxy's route table, method is
// one of Methods or OTHER, code is an HTTP status code (499 for a client that went
// away), decision is a limiter outcome, kind an upstream error kind. A raw path, a
// data_id, an apikey or an address is never a label.
package metrics

import (
	"net/http"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Namespace prefixes every metric of mdproxy.
const Namespace = "mdproxy"

// Methods are the HTTP methods kept as method label values; any other is OTHER.
var Methods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions,
}

// Method returns the label value of an HTTP method: the method itself when it is one of
// Methods, else "OTHER" (as Caddy's SanitizeMethod does).
func Method(m string) string {
	for _, known := range Methods {
		if m == known {
			return m
		}
	}
	return "OTHER"
}

// Upstream error kinds, the values of the kind label of UpstreamErrors.
const (
	KindRefused  = "refused"  // connection refused: nothing listens upstream
	KindReset    = "reset"    // connection reset or closed before a full response
	KindTimeout  = "timeout"  // no response headers within the upstream timeout (504), or connect timeout (502)
	KindCanceled = "canceled" // the client went away first (answered 499)
	KindOther    = "other"    // any other transport error (DNS, TLS...)
)

// Peers of an exchange, the values of the peer label of BodyTimeouts.
const (
	PeerClient = "client" // the client stopped sending its request body or reading its answer
	PeerCore   = "core"   // Core stopped reading the request or sending its answer
)

// Results of a reload of the limits, the values of the result label of ConfigReloads.
const (
	ReloadSuccess = "success" // the limits file was read and its limits are in force
	ReloadError   = "error"   // the limits file could not be read or held a bad setting: the limits did not change
)

// Metrics is the set of collectors the proxy updates. Its fields are safe for
// concurrent use, as every client_golang collector is.
type Metrics struct {
	// Requests counts answered requests by route, method and code (status sent, 499
	// when the client went away first).
	Requests *prometheus.CounterVec
	// Decisions counts limiter outcomes by route and decision (allowed, delayed,
	// rejected, rejected_client, canceled, would_reject, exempt). Unlimited routes count as allowed.
	Decisions *prometheus.CounterVec
	// Duration observes the whole time of a request in the proxy, limiter wait
	// included, by route, in seconds.
	Duration *prometheus.HistogramVec
	// UpstreamDuration observes the time from sending a request upstream to receiving
	// its response headers, by route, in seconds.
	UpstreamDuration *prometheus.HistogramVec
	// UpstreamResponses counts Core's answers by route and status code, apart from the
	// proxy's own (a 503 here is Core's, e.g. its scan queue full).
	UpstreamResponses *prometheus.CounterVec
	// UpstreamErrors counts failed upstream round trips by route and kind.
	UpstreamErrors *prometheus.CounterVec
	// BodyTimeouts counts exchanges cut because a body made no progress for the body
	// idle timeout, by route and peer (client or core). Its series are created on
	// first use.
	BodyTimeouts *prometheus.CounterVec
	// BridgePolls counts polls of GET /file/{data_id} answered with the bridge on, by
	// source: store (a final result kept by the proxy), pending (the scan is not over:
	// Core not asked) or core (Core was asked). Polls the limit refused count in
	// Decisions only.
	BridgePolls *prometheus.CounterVec
	// InFlight is the number of requests being served, by route.
	InFlight *prometheus.GaugeVec
	// RequestBytes counts request body bytes read from clients, by route.
	RequestBytes *prometheus.CounterVec
	// ResponseBytes counts response body bytes written to clients, by route.
	ResponseBytes *prometheus.CounterVec
	// LimitRate is the configured rate of each route's bucket, in requests per second
	// (0: unlimited).
	LimitRate *prometheus.GaugeVec
	// LimitBurst is the configured burst of each route's bucket, in requests.
	LimitBurst *prometheus.GaugeVec
	// LimitMaxWait is the configured maximum wait of each route, in seconds.
	LimitMaxWait *prometheus.GaugeVec
	// ConfigReloads counts reloads of the limits file (on SIGHUP or when it changes) by
	// result, ReloadSuccess or ReloadError; both series exist from the start, at 0.
	ConfigReloads *prometheus.CounterVec
}

// durationBuckets span a fast rejection (100 µs) to a slow poll under load (60 s).
var durationBuckets = []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New creates the collectors and registers them on reg, together with the Go and
// process collectors and mdproxy_build_info. It panics if one is already registered
// on reg (promauto's behaviour): call it once per registry.
func New(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		Requests: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "requests_total",
			Help: "Requests answered, by route, method and status code (499: the client went away).",
		}, []string{"route", "method", "code"}),
		Decisions: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "limiter_decisions_total",
			Help: "Token bucket decisions by route and decision (allowed, delayed, rejected, rejected_client, canceled, would_reject: a dry run's would-be rejection, forwarded; exempt: a client the route's MDPROXY_<ROUTE>_EXEMPT lets through without a token).",
		}, []string{"route", "decision"}),
		Duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "request_duration_seconds",
			Help:    "Time from receiving a request to the end of its answer, limiter wait included, by route.",
			Buckets: durationBuckets,
		}, []string{"route"}),
		UpstreamDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "upstream_duration_seconds",
			Help:    "Time from sending a request to Core to receiving its response headers, by route.",
			Buckets: durationBuckets,
		}, []string{"route"}),
		UpstreamResponses: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "upstream_responses_total",
			Help: "Answers received from Core, by route and status code (Core's own 503 when its scan queue is full).",
		}, []string{"route", "code"}),
		UpstreamErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "upstream_errors_total",
			Help: "Failed round trips to Core by route and kind (refused, reset, timeout, canceled, other).",
		}, []string{"route", "kind"}),
		BridgePolls: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "bridge_polls_total",
			Help: "Result polls answered with the bridge on, by source: store, pending (Core not asked) or core.",
		}, []string{"source"}),
		BodyTimeouts: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "body_timeouts_total",
			Help: "Exchanges cut because a request or response body made no progress for the body idle timeout, by route and peer (client, core).",
		}, []string{"route", "peer"}),
		InFlight: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "in_flight_requests",
			Help: "Requests being served, waiting for a token included, by route.",
		}, []string{"route"}),
		RequestBytes: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "request_body_bytes_total",
			Help: "Request body bytes read from clients and sent to Core, by route.",
		}, []string{"route"}),
		ResponseBytes: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "response_body_bytes_total",
			Help: "Response body bytes written to clients, by route.",
		}, []string{"route"}),
		LimitRate: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "limit_rate_requests_per_second",
			Help: "Configured token bucket rate by route, in requests per second (0: unlimited).",
		}, []string{"route"}),
		LimitBurst: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "limit_burst_requests",
			Help: "Configured token bucket burst by route, in requests.",
		}, []string{"route"}),
		LimitMaxWait: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "limit_max_wait_seconds",
			Help: "Configured longest wait for a token by route, in seconds (0: reject at once).",
		}, []string{"route"}),
		ConfigReloads: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "config_reloads_total",
			Help: "Reloads of the limits file (MDPROXY_LIMITS_FILE), on SIGHUP or when it changed, by result (success; error: the previous limits stay).",
		}, []string{"result"}),
	}
	for _, result := range []string{ReloadSuccess, ReloadError} {
		m.ConfigReloads.WithLabelValues(result)
	}
	version, revision, goVersion := BuildVersion()
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels tell the version, VCS revision and Go version mdproxy was built with.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion},
	}, func() float64 { return 1 })
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// ClientKeysReporter is what RegisterClientKeys reads at each scrape; *limiter.Set is
// one.
type ClientKeysReporter interface {
	// ClientKeys calls f once for each route with a per-client share: the client keys
	// it tracks now and the requests it let through untracked, without a per-client
	// check, since the start because it tracked as many keys as allowed.
	ClientKeys(f func(route string, tracked int, untracked uint64))
}

// RegisterClientKeys registers on reg mdproxy_limiter_client_keys (gauge) and
// mdproxy_limiter_client_untracked_requests_total (counter), by route, read from r at
// each scrape, so that they show keys freed while no request arrives. Routes without a
// per-client share have no series. It panics if they are already registered on reg.
func RegisterClientKeys(reg prometheus.Registerer, r ClientKeysReporter) {
	reg.MustRegister(clientKeysCollector{r})
}

var (
	clientKeysDesc = prometheus.NewDesc(Namespace+"_limiter_client_keys",
		"Client keys (apikeys or addresses) tracked by the route's per-client share, idle ones until the next sweep; at most MDPROXY_CLIENT_KEYS_MAX.",
		[]string{"route"}, nil)
	clientUntrackedDesc = prometheus.NewDesc(Namespace+"_limiter_client_untracked_requests_total",
		"Requests of new client keys let through without a per-client check because the route's share tracked MDPROXY_CLIENT_KEYS_MAX keys; the route's bucket still applied.",
		[]string{"route"}, nil)
)

// clientKeysCollector reads a ClientKeysReporter at scrape time.
type clientKeysCollector struct{ r ClientKeysReporter }

func (c clientKeysCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- clientKeysDesc
	ch <- clientUntrackedDesc
}

func (c clientKeysCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.ClientKeys(func(route string, tracked int, untracked uint64) {
		ch <- prometheus.MustNewConstMetric(clientKeysDesc, prometheus.GaugeValue, float64(tracked), route)
		ch <- prometheus.MustNewConstMetric(clientUntrackedDesc, prometheus.CounterValue, float64(untracked), route)
	})
}

// BridgeReporter is what RegisterBridge reads of the bridge at each scrape;
// *bridge.Bridge is one.
type BridgeReporter interface {
	// PendingLen is the number of submissions whose result has not arrived.
	PendingLen() int
	// PendingBytes is what the pending ids hold, in bytes, as the bridge weighs them.
	PendingBytes() int64
	// PendingDropped is the number of pending ids dropped since the start to keep
	// PendingBytes within its bound.
	PendingDropped() uint64
	// Callbacks is the number of callbacks received since the start by outcome, a key
	// of a small fixed set (the bridge's stored, forged, invalid, busy) each.
	Callbacks() map[string]float64
}

// StoreReporter is what RegisterBridge reads of the bridge's result store at each
// scrape; *bridge.MemoryStore is one.
type StoreReporter interface {
	// Len is the number of results held.
	Len() int
	// Bytes is the size of the results held, in bytes (bodies and keys, roughly).
	Bytes() int64
}

// RegisterBridge registers on reg mdproxy_bridge_callbacks_total by outcome and
// mdproxy_bridge_pending_dropped_total (counters), mdproxy_bridge_pending_ids,
// mdproxy_bridge_pending_bytes, mdproxy_bridge_store_entries and
// mdproxy_bridge_store_bytes (gauges), read from b and s at each scrape. The outcome label values are the keys
// b.Callbacks returns, a fixed set. It panics if they are already registered on reg.
func RegisterBridge(reg prometheus.Registerer, b BridgeReporter, s StoreReporter) {
	reg.MustRegister(bridgeCollector{b, s})
}

// AnswersReporter is what RegisterBridgeAnswers reads at each scrape; *bridge.Budget
// is one.
type AnswersReporter interface {
	// Held is the bytes of answers held now for the polls writing them.
	Held() int64
}

// RegisterBridgeAnswers registers on reg mdproxy_bridge_answer_bytes (a gauge), read
// from a at each scrape. It panics if it is already registered on reg.
func RegisterBridgeAnswers(reg prometheus.Registerer, a AnswersReporter) {
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "bridge_answer_bytes",
		Help: "Answers to bridged polls held in memory for the clients reading them, in bytes: Core's answers to the polls the bridge sent it and, with MDPROXY_REDIS_URL, the results read from Redis for a poll; at most 64 MiB, beyond which Core's 200 is relayed as it comes and a stored result is asked of Core.",
	}, func() float64 { return float64(a.Held()) })
}

var (
	bridgeCallbacksDesc = prometheus.NewDesc(Namespace+"_bridge_callbacks_total",
		"Callbacks received by the bridge's listener, by outcome: stored (a final result on a live secret path), forged (no live secret path: wrong or unknown secret, replay, late), invalid (another method, or a live secret path with a body too large, not JSON, of another data_id or not final), busy (503 with Retry-After: the callback bodies being read at once would weigh too much; Core delivers it again).",
		[]string{"outcome"}, nil)
	bridgePendingDesc = prometheus.NewDesc(Namespace+"_bridge_pending_ids",
		"Submissions the bridge waits for: their callback has not arrived and no poll brought their final result, younger than MDPROXY_BRIDGE_PENDING_TTL.",
		nil, nil)
	bridgePendingBytesDesc = prometheus.NewDesc(Namespace+"_bridge_pending_bytes",
		"What the pending ids hold, in bytes, as the bridge weighs them (each id's data_id and 512 bytes, plus Core's reply kept as its answer), this replica's and those of other replicas that polls here met; at most MDPROXY_BRIDGE_PENDING_MAX_BYTES.",
		nil, nil)
	bridgePendingDroppedDesc = prometheus.NewDesc(Namespace+"_bridge_pending_dropped_total",
		"Pending ids dropped, the oldest first, because the pending ids would have weighed more than MDPROXY_BRIDGE_PENDING_MAX_BYTES; their polls go to Core under the route's limit.",
		nil, nil)
	bridgeStoreEntriesDesc = prometheus.NewDesc(Namespace+"_bridge_store_entries",
		"Final results held in the bridge's result store; with MDPROXY_REDIS_URL, those this replica stored within MDPROXY_STORE_TTL (an estimate: the store is Redis's).",
		nil, nil)
	bridgeStoreBytesDesc = prometheus.NewDesc(Namespace+"_bridge_store_bytes",
		"Size of the results held in the bridge's result store, in bytes (bodies, keys and a per-entry overhead); at most MDPROXY_STORE_MAX_BYTES in memory; with MDPROXY_REDIS_URL, what this replica stored within MDPROXY_STORE_TTL (Redis's maxmemory bounds the store).",
		nil, nil)
)

// bridgeCollector reads a BridgeReporter and a StoreReporter at scrape time.
type bridgeCollector struct {
	b BridgeReporter
	s StoreReporter
}

func (c bridgeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bridgeCallbacksDesc
	ch <- bridgePendingDesc
	ch <- bridgePendingBytesDesc
	ch <- bridgePendingDroppedDesc
	ch <- bridgeStoreEntriesDesc
	ch <- bridgeStoreBytesDesc
}

func (c bridgeCollector) Collect(ch chan<- prometheus.Metric) {
	for outcome, n := range c.b.Callbacks() {
		ch <- prometheus.MustNewConstMetric(bridgeCallbacksDesc, prometheus.CounterValue, n, outcome)
	}
	ch <- prometheus.MustNewConstMetric(bridgePendingDesc, prometheus.GaugeValue, float64(c.b.PendingLen()))
	ch <- prometheus.MustNewConstMetric(bridgePendingBytesDesc, prometheus.GaugeValue, float64(c.b.PendingBytes()))
	ch <- prometheus.MustNewConstMetric(bridgePendingDroppedDesc, prometheus.CounterValue, float64(c.b.PendingDropped()))
	ch <- prometheus.MustNewConstMetric(bridgeStoreEntriesDesc, prometheus.GaugeValue, float64(c.s.Len()))
	ch <- prometheus.MustNewConstMetric(bridgeStoreBytesDesc, prometheus.GaugeValue, float64(c.s.Bytes()))
}

// Version, when set at link time (-ldflags "-X
// github.com/mdproxy/mdproxy/metrics.Version=v1.2.3"), is the version label of
// mdproxy_build_info; otherwise the main module's version from the binary's build
// information ("(devel)" for a build from a work tree).
var Version string

// Revision, when set at link time (-ldflags "-X
// github.com/mdproxy/mdproxy/metrics.Revision=abc123"), as the Dockerfile does from its
// REVISION build argument, is the revision label of mdproxy_build_info; otherwise the
// VCS revision Go stamped in the binary, which a build without .git lacks.
var Revision string

// BuildVersion returns the version, the VCS revision and the Go version the binary was
// built with, as the labels of mdproxy_build_info give them: each "unknown" when the
// binary does not tell.
func BuildVersion() (version, revision, goVersion string) {
	version, revision, goVersion = "unknown", "unknown", "unknown"
	info, ok := debug.ReadBuildInfo()
	if ok {
		goVersion = info.GoVersion
		if info.Main.Version != "" {
			version = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	if Version != "" {
		version = Version
	}
	if Revision != "" {
		revision = Revision
	}
	return version, revision, goVersion
}
