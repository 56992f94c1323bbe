package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewUpstreamUp creates mdproxy_upstream_up on reg and returns it: 1 while Core
// answered mdproxy's last check of it (a GET of its /readyz, whatever the status), 0
// while it could not be reached (refused, reset, timed out). It is 0 until the first
// check ends. It panics if it is already registered on reg.
func NewUpstreamUp(reg prometheus.Registerer) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "upstream_up",
		Help: "1 while Core answered the last check (GET /readyz at start and every MDPROXY_UPSTREAM_CHECK_INTERVAL, any status), 0 while it could not be reached.",
	})
	reg.MustRegister(g)
	return g
}
