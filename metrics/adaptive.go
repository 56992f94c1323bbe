package metrics

import "github.com/prometheus/client_golang/prometheus"

// Directions are the values of the direction label of Adaptive's adjustments: a rate
// raised, lowered, or returned to its configured value after Core's statistics could
// not be read for a while.
var Directions = []string{"up", "down", "reset"}

// Adaptive is the metrics of the adaptive limit (MDPROXY_ADAPTIVE). Its methods are the
// adaptive.Recorder's. Safe for concurrent use.
type Adaptive struct {
	occupancy   prometheus.Gauge
	rate        *prometheus.GaugeVec
	atFloor     *prometheus.GaugeVec
	adjustments *prometheus.CounterVec
	readErrors  prometheus.Counter
	leader      prometheus.Gauge
}

// NewAdaptive creates the adaptive limit's collectors on reg, each direction's series
// of routes at 0; it panics if they are already registered on reg.
func NewAdaptive(reg prometheus.Registerer, routes []string) *Adaptive {
	a := &Adaptive{
		occupancy: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "adaptive_core_queue_occupancy",
			Help: "Share of Core's scan queue in use at the adaptive limit's last reading of GET /stat/nodes (0 to 1); 0 until the first reading."}),
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "adaptive_rate_requests_per_second",
			Help: "Rate the adaptive limit set on the route, or in a dry run (MDPROXY_ADAPTIVE_DRY_RUN) would set; the limit in force is mdproxy_limit_rate_requests_per_second."},
			[]string{"route"}),
		atFloor: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "adaptive_at_floor",
			Help: "1 while the adaptive limit holds the route at its floor (MDPROXY_<ROUTE>_RATE_MIN): Core stays busier than MDPROXY_ADAPTIVE_TARGET at the lowest rate allowed; 0 otherwise."},
			[]string{"route"}),
		adjustments: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "adaptive_adjustments_total",
			Help: "Changes of a route's rate by the adaptive limit, by direction (up, down, reset: back to the configured rate after Core's statistics could not be read)."},
			[]string{"route", "direction"}),
		readErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "adaptive_read_errors_total",
			Help: "Steps of the adaptive limit without a reading: Core's GET /stat/nodes failed (Core unreachable, 401/403, an answer that is not its JSON, a timeout) or, with Redis, Redis could not be reached or no replica published the rates."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "adaptive_leader",
			Help: "1 while this replica reads Core for the adaptive limit (always without Redis; with it, while it holds the lease), 0 while it puts the rates another replica published in force or cannot reach Redis."}),
	}
	reg.MustRegister(a.occupancy, a.rate, a.atFloor, a.adjustments, a.readErrors, a.leader)
	for _, r := range routes {
		a.atFloor.WithLabelValues(r)
		for _, d := range Directions {
			a.adjustments.WithLabelValues(r, d)
		}
	}
	return a
}

// Occupied records a reading of Core's queue occupancy.
func (a *Adaptive) Occupied(occupancy float64) { a.occupancy.Set(occupancy) }

// Failed counts a step without a reading.
func (a *Adaptive) Failed() { a.readErrors.Inc() }

// Leading records whether this replica led (read Core) at the last step.
func (a *Adaptive) Leading(lead bool) {
	v := 0.0
	if lead {
		v = 1
	}
	a.leader.Set(v)
}

// Rate records route's rate, atFloor when it is the route's floor.
func (a *Adaptive) Rate(route string, rate float64, atFloor bool) {
	a.rate.WithLabelValues(route).Set(rate)
	floor := 0.0
	if atFloor {
		floor = 1
	}
	a.atFloor.WithLabelValues(route).Set(floor)
}

// Adjusted counts a change of route's rate in direction (one of Directions).
func (a *Adaptive) Adjusted(route, direction string) {
	a.adjustments.WithLabelValues(route, direction).Inc()
}
