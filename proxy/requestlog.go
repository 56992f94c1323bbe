package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/mdproxy/mdproxy/metrics"
)

// logRequest writes the debug line of one request answered on rt: the route (from
// rt.log), the method (from the fixed set of the metrics), the limiter's decision
// ("none" when the proxy answered before asking it: a path refused, an upload without
// a length), the status sent (499: the client went away), the time in the proxy in
// seconds, and the body bytes forwarded to Core and answered to the client. Never the
// path (it holds data_ids), the query, the apikey, the client key nor an address. The
// caller checks first that debug is enabled, so that a request costs nothing more at
// info level.
func (rt *route) logRequest(ctx context.Context, rec *recorder, r *http.Request, status int, elapsed time.Duration) {
	decision := rec.decision
	if decision == "" {
		decision = "none"
	}
	var requestBytes int64
	if rec.ex != nil {
		requestBytes = rec.ex.reqBytes.Load()
	}
	rt.log.LogAttrs(ctx, slog.LevelDebug, "request",
		slog.String("method", metrics.Method(r.Method)),
		slog.String("decision", decision),
		slog.Int("status", status),
		slog.Float64("duration_s", elapsed.Seconds()),
		slog.Int64("request_bytes", requestBytes),
		slog.Int64("response_bytes", rec.bytes))
}
