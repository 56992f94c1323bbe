package sidecar

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/proxy"
)

// effectiveSettings are mdproxy's effective settings, as /config answers them and the
// start-up "settings" line logs them.
type effectiveSettings struct {
	// Variables holds every variable of Config by name (MDPROXY_LISTEN_ADDR, ...) with
	// its value once defaults are applied: durations with their unit ("60s"), lists as
	// JSON arrays, MDPROXY_UPSTREAM_URL with any password redacted, the trusted proxies
	// as the prefixes they were read as. The per-route variables are in Routes.
	Variables map[string]any `json:"variables"`
	// Routes holds every route's limit as its bucket applies it.
	Routes map[string]routeLimit `json:"routes"`
	// UnknownVariables are the variables spelt like mdproxy's that it does not read,
	// sorted (unknownVariables): ignored, and warned of at start.
	UnknownVariables []string `json:"unknown_variables"`
}

// routeLimit is a route's effective limit: zero Rate and ClientLimit for an
// unlimited route (whose burst and wait, if set, have no effect and read 0).
type routeLimit struct {
	// Rate is in requests per second; 0: no rate.
	Rate float64 `json:"rate_per_s"`
	// Burst is in requests, filled in when its variable was 0 (ceil(rate), at least 1).
	Burst int `json:"burst"`
	// MaxWait is a duration with its unit, e.g. "2s".
	MaxWait string `json:"max_wait"`
	// ClientLimit is in requests per ClientWindow; 0: no per-client share.
	ClientLimit int `json:"client_limit"`
	// ClientWindow is a duration with its unit, "1s" when its variable was 0; "0s"
	// without a per-client share.
	ClientWindow string `json:"client_window"`
	// DryRun: the route's limit decides and counts would_reject but refuses nothing.
	DryRun bool `json:"dry_run"`
	// Exempt is MDPROXY_<ROUTE>_EXEMPT as in force: address prefixes and apikey
	// digests, never a key; "" when no client is exempt.
	Exempt string `json:"exempt"`
}

// settingsOf returns the effective settings of c, each route's limit as limits gives
// its bucket at the time of the call (a reload shows at once). It reads c only and is
// safe for concurrent use when limits is. Nothing secret is in c: file names are given,
// never their content, and a password in the upstream URL is redacted.
func settingsOf(c *Config, limits proxy.Limits) effectiveSettings {
	s := effectiveSettings{Variables: map[string]any{}, Routes: map[string]routeLimit{},
		UnknownVariables: append([]string{}, c.unknown...)}
	v := reflect.ValueOf(c).Elem()
	for _, f := range reflect.VisibleFields(v.Type()) {
		key, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if !f.IsExported() || key == "" || key == "-" {
			continue
		}
		var val any
		switch x := v.FieldByIndex(f.Index).Interface().(type) {
		case time.Duration:
			val = x.String()
		case []string:
			val = append([]string{}, x...) // [] rather than null
		default:
			val = x
		}
		s.Variables[EnvPrefix+key] = val
	}
	if c.upstream != nil {
		s.Variables[EnvPrefix+"UPSTREAM_URL"] = c.upstream.Redacted()
	}
	s.Variables[EnvPrefix+"REDIS_URL"] = redactedURL(c.RedisURL)
	if c.CoreAPIKey != "" {
		s.Variables[EnvPrefix+"CORE_APIKEY"] = "[redacted]"
	}
	trusted := make([]string, len(c.trusted))
	for i, p := range c.trusted {
		trusted[i] = p.String()
	}
	s.Variables[EnvPrefix+"TRUSTED_PROXIES"] = trusted
	s.Variables[EnvPrefix+"LOG_LEVEL"] = strings.ToLower(c.level.String())

	for _, name := range proxy.RouteNames() {
		var l limiter.Limit
		if limits != nil {
			if lim := limits.Limiter(name); lim != nil {
				l = lim.Limit()
			}
		}
		window := l.ClientWindow
		switch {
		case l.ClientLimit == 0:
			window = 0 // a window without a share has no effect
		case window == 0:
			window = time.Second
		}
		s.Routes[name] = routeLimit{Rate: l.Rate, Burst: l.Burst, MaxWait: l.MaxWait.String(),
			ClientLimit: l.ClientLimit, ClientWindow: window.String(), DryRun: l.DryRun, Exempt: l.Exempt}
	}
	return s
}

// mountAdminExtras adds to the admin router r /config, which answers settingsOf(c,
// limits) as JSON at each request, and, when c.Pprof is set, net/http/pprof's
// handlers under /debug/pprof/ (a CPU profile or trace longer than the admin port's
// write timeout, MDPROXY_BODY_IDLE_TIMEOUT, is refused by pprof itself). Without
// c.Pprof, /debug/pprof/ answers 404.
func mountAdminExtras(r chi.Router, c *Config, limits proxy.Limits) {
	r.HandleFunc("/config", only(func(w http.ResponseWriter, _ *http.Request) {
		b, err := json.Marshal(settingsOf(c, limits))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	}, http.MethodGet))
	if c.Pprof {
		// GET (and HEAD); /symbol takes POST too, as go tool pprof asks it.
		r.HandleFunc("/debug/pprof/*", only(pprof.Index, http.MethodGet)) // the index, and each profile by name
		r.HandleFunc("/debug/pprof/cmdline", only(pprof.Cmdline, http.MethodGet))
		r.HandleFunc("/debug/pprof/profile", only(pprof.Profile, http.MethodGet))
		r.HandleFunc("/debug/pprof/symbol", only(pprof.Symbol, http.MethodGet, http.MethodPost))
		r.HandleFunc("/debug/pprof/trace", only(pprof.Trace, http.MethodGet))
	}
}

// only serves h to the methods given, and to HEAD wherever GET is one of them (RFC
// 9110, section 9.3.2; net/http sends a HEAD's answer without its body), and answers
// any other method 405 with one Allow field naming every method served (section
// 15.5.6), HEAD included: "GET, HEAD" for a page that only reads.
func only(h http.HandlerFunc, methods ...string) http.HandlerFunc {
	allowed := slices.Clone(methods)
	if slices.Contains(allowed, http.MethodGet) && !slices.Contains(allowed, http.MethodHead) {
		allowed = slices.Insert(allowed, 1+slices.Index(allowed, http.MethodGet), http.MethodHead)
	}
	allow := strings.Join(allowed, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(allowed, r.Method) {
			w.Header().Set("Allow", allow)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h(w, r)
	}
}

// LogValue writes a route's limit in a log line as a group of its JSON fields
// (rate_per_s, burst, ...): an object in JSON, file_result.rate_per_s=10 ... in text.
func (l routeLimit) LogValue() slog.Value {
	return slog.GroupValue(slog.Float64("rate_per_s", l.Rate), slog.Int("burst", l.Burst),
		slog.String("max_wait", l.MaxWait), slog.Int("client_limit", l.ClientLimit),
		slog.String("client_window", l.ClientWindow), slog.Bool("dry_run", l.DryRun))
}

// limited reports whether the limit of a route refuses or counts anything.
func (l routeLimit) limited() bool { return l.Rate > 0 || l.ClientLimit > 0 }

// logSettings logs s, the settings /config answers, readably in either log format:
// one "settings" line a group of SettingGroups (its variables as keys, e.g.
// MDPROXY_UPSTREAM_TIMEOUT=60s), then one "route limits" line with the limit of each
// route that has one, by route name; the routes it does not name have no limit.
func logSettings(log *slog.Logger, s effectiveSettings) {
	byGroup := map[string][]any{}
	for _, st := range Settings() {
		if v, ok := s.Variables[st.Name]; ok {
			byGroup[st.Group] = append(byGroup[st.Group], st.Name, v)
		}
	}
	for _, g := range SettingGroups {
		if len(byGroup[g]) > 0 {
			log.Info("settings", append([]any{"group", g}, byGroup[g]...)...)
		}
	}
	var routes []any
	for _, name := range proxy.RouteNames() {
		if l := s.Routes[name]; l.limited() {
			routes = append(routes, name, l)
		}
	}
	log.Info("route limits", routes...)
}
