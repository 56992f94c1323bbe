package sidecar

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"slices"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/adaptive"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/proxy"
)

// startAdaptive starts the adaptive limit (MDPROXY_ADAPTIVE) of a running mdproxy: every
// MDPROXY_ADAPTIVE_INTERVAL it reads Core's /stat/nodes with MDPROXY_CORE_APIKEY over
// tr and sets the rate of each route with a rate between its floor and its configured
// rate (adaptive.Controller), in the Set in force, then shows the rates in force in h's
// gauges. With Redis, the replicas on it hold one rate (adaptive.Fleet): one reads Core,
// the others follow. It returns stop, which ends it and waits for it.
func startAdaptive(cfg *Config, reg *prometheus.Registry, tr http.RoundTripper, rl *runLimits, h *proxy.Proxy, log *slog.Logger) (stop func()) {
	limits := adaptiveLimits{live: rl.live, h: h}
	c := &adaptive.Controller{
		Core: adaptiveCore{
			stats:    adaptive.Stats{Client: &http.Client{Transport: tr, Timeout: cfg.AdaptiveInterval}, URL: cfg.upstream.String(), APIKey: cfg.CoreAPIKey},
			gatherer: reg,
		},
		Limits:   limits,
		Recorder: metrics.NewAdaptive(reg, limits.names()),
		Target:   cfg.AdaptiveTarget,
		DryRun:   cfg.AdaptiveDryRun,
		Log:      log,
	}
	if rl.rdb != nil {
		c.Fleet = adaptive.NewFleet(rl.rdb, cfg.RedisPrefix, rand.Text(), cfg.AdaptiveInterval, cfg.RedisTimeout)
	}
	log.Info("adaptive limit on: the rates follow Core's scan queue", "interval", cfg.AdaptiveInterval.String(),
		"target", cfg.AdaptiveTarget, "dry_run", cfg.AdaptiveDryRun, "routes", limits.names(), "fleet_on_redis", c.Fleet != nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, clockwork.NewRealClock(), cfg.AdaptiveInterval)
	}()
	return func() {
		cancel()
		<-done
	}
}

// adaptiveCore is Core as the controller reads it: its statistics, and its 503 answers
// as mdproxy counted them (mdproxy_upstream_responses_total, every route).
type adaptiveCore struct {
	stats    adaptive.Stats
	gatherer prometheus.Gatherer
}

func (a adaptiveCore) Occupancy(ctx context.Context) (float64, error) { return a.stats.Occupancy(ctx) }

func (a adaptiveCore) Refused() float64 {
	mfs, err := a.gatherer.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_upstream_responses_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == "503" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// adaptiveLimits are the routes with a rate in the Set in force, and the way the
// controller sets one: in place in the Set (limiter.Set.SetRate, the bucket's state
// kept), then the proxy's limit gauges.
type adaptiveLimits struct {
	live *liveLimits
	h    *proxy.Proxy
}

func (l adaptiveLimits) Routes() []adaptive.Route {
	var routes []adaptive.Route
	set := l.live.Load()
	for _, name := range proxy.RouteNames() {
		if lim, ok := set.Configured(name); ok && lim.Rate > 0 {
			r := adaptive.Route{Name: name, Floor: lim.Floor(), Ceiling: lim.Rate}
			if b := set.Limiter(name); b != nil {
				r.InForce = b.Limit().Rate
			}
			routes = append(routes, r)
		}
	}
	return routes
}

func (l adaptiveLimits) Apply(route string, rate float64) {
	set := l.live.Load()
	if err := set.SetRate(route, rate); err == nil {
		l.h.SetLimits(set) // the gauges show the rate in force
	}
}

func (l adaptiveLimits) names() []string {
	var names []string
	for _, r := range l.Routes() {
		names = append(names, r.Name)
	}
	return slices.Clip(names)
}
