package sidecar

//go:generate go run ../internal/docgen -root ..

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/mdproxy/mdproxy/proxy"
)

// Setting describes one MDPROXY_ variable, or one family of route limit variables
// (MDPROXY_<ROUTE>_RATE...), as mdproxy's --help, docs/configuration.md and
// deploy/mdproxy.env give it. Settings returns them all; the values are read only.
type Setting struct {
	// Name is the variable, e.g. MDPROXY_LISTEN_ADDR; a route limit's is written
	// MDPROXY_<ROUTE>_RATE.
	Name string
	// Group is the heading it is listed under (SettingGroups, in order).
	Group string
	// Unit is what its value counts or is, e.g. "duration", "bytes", "host:port".
	Unit string
	// Default is the value an unset variable takes, as it would be written in the
	// variable (Config's envDefault tag; DefaultLimits for a route limit); "" when the
	// variable has none (DefaultText says what that means).
	Default string
	// DefaultText says the default in words when Default alone does not, e.g. "none:
	// the system's roots"; "" otherwise.
	DefaultText string
	// Accepts says what values it takes: its range, and what 0 means where 0 is special.
	Accepts string
	// Reload tells whether a running mdproxy takes a new value without a restart (the
	// route limits, from MDPROXY_LIMITS_FILE); every other setting is read at start.
	Reload bool
	// Meaning is what it does, in a few sentences.
	Meaning string
}

// DefaultWords returns the default as docs and --help show it: Default in backquotes-free
// form with DefaultText after it, or DefaultText alone, or "none".
func (s Setting) DefaultWords() string {
	switch {
	case s.Default != "" && s.DefaultText != "":
		return s.Default + " (" + s.DefaultText + ")"
	case s.Default != "":
		return s.Default
	case s.DefaultText != "":
		return s.DefaultText
	}
	return "none"
}

// SettingGroups are the headings of Settings, in the order they are listed.
var SettingGroups = []string{
	"Listeners and Core",
	"Timeouts and shutdown",
	"Clients and their keys",
	"Logs and the admin port",
	"TLS",
	"The bridge",
	"Redis: several replicas",
	"Route limits",
}

// settingDoc is what a Config field's struct tags do not say: its group, unit, range
// (when configWants does not give it), meaning and default in words.
type settingDoc struct {
	key, group, unit, accepts, defaultText, meaning string
}

// settingDocs describe the variables of Config by their env tag, in the order they are
// listed within a group. A Config field without one here, or one here without a field,
// makes Settings panic (and TestSettingsCoverConfig fail).
var settingDocs = []settingDoc{
	{"LISTEN_ADDR", "Listeners and Core", "host:port", "a host:port to listen on, port 0 to 65535; must not be set empty", "",
		"Where clients send Core's API."},
	{"ADMIN_ADDR", "Listeners and Core", "host:port", "a host:port to listen on, port 0 to 65535, not the proxy's; must not be set empty", "",
		"`/metrics`, `/healthz`, `/readyz`, `/config` (and `/debug/pprof/`) of the proxy itself, plain HTTP, `GET` and `HEAD` (another method: `405` with `Allow`)."},
	{"UPSTREAM_URL", "Listeners and Core", "URL", "an http or https URL with a host (an IP address, an IPv6 one in brackets, or a DNS name whose last label is not all digits), a port of 1 to 65535 if any, and no user or password; must not be set empty", "",
		"Core (its default port). No user or password: none would be sent, Core authenticates each request by its `apikey`. A path goes before every request's path and a query is joined to every request's (`httputil.ProxyRequest.SetURL`)."},
	{"UPSTREAM_CHECK_INTERVAL", "Listeners and Core", "duration", "", "",
		"How often mdproxy asks Core's `/readyz` whether Core can be reached (any answer is reachable), the first time at start: `mdproxy_upstream_up` and a warning when it cannot (docs/metrics.md); `0` turns the check off, and the gauge with it. mdproxy's own `/readyz` never follows Core."},
	{"LIMIT_STATUS", "Listeners and Core", "status", "", "",
		"Status of a rejected request: `503` (as Core answers when busy) or `429`."},
	{"ADAPTIVE", "Route limits", "true or false", "", "",
		"Let the rate of every route with a rate follow Core's scan queue (docs/adaptive.md): read `GET /stat/nodes` every `MDPROXY_ADAPTIVE_INTERVAL`, lower the rates towards `_RATE_MIN` while the queue is fuller than `MDPROXY_ADAPTIVE_TARGET` or Core answers `503`, raise them back to `_RATE` while it is not. With `MDPROXY_REDIS_URL`, one replica reads Core and the others put its rates in force: set the adaptive settings alike on every replica."},
	{"ADAPTIVE_INTERVAL", "Route limits", "duration", "", "",
		"How often the adaptive limit reads Core's statistics and moves the rates."},
	{"ADAPTIVE_TARGET", "Route limits", "share", "", "",
		"The share of Core's scan queue in use above which the adaptive limit lowers the rates (KEDA's used-slot target in OPSWAT's chart is 80%)."},
	{"ADAPTIVE_DRY_RUN", "Route limits", "true or false", "", "",
		"Compute and export the rates the adaptive limit would set (`mdproxy_adaptive_rate_requests_per_second`), and set none."},
	{"CORE_APIKEY", "Route limits", "secret", "", "none",
		"The apikey the adaptive limit reads Core's `/stat/nodes` with (Core gives its statistics to an apikey with the monitoring permission); never logged, redacted in `/config`."},
	{"RATELIMIT_HEADERS", "Listeners and Core", "true or false", "", "",
		"Add `RateLimit-Policy` and `RateLimit` (IETF draft-ietf-httpapi-ratelimit-headers-10) to the answers of routes with a rate, let through or refused: the route's policy (`q` its burst, `w` the seconds it takes to fill) and, where the bucket decided at once (in Redis too; not a wait, nor a replica's fallback share), the tokens left (`r`) and the seconds until it is full (`t`)."},
	{"MAX_CONNECTIONS", "Listeners and Core", "connections", "", "",
		"Most client connections the proxy port holds open at once (each holds memory); beyond it a new one waits in the kernel's backlog until one closes."},

	{"UPSTREAM_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"Longest wait for Core's response headers once the request is sent; then `504`."},
	{"UPSTREAM_DIAL_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"Longest wait to connect to Core; then `502`."},
	{"READ_HEADER_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"Longest wait for a client's request headers, not its body (a slow upload is never cut). With `MDPROXY_TLS_CERT_FILE`, the TLS handshake of a new connection has as long again before them. Enforced to within 100 ms, or a tenth of the shortest of the three client timeouts when that is less, as are the proxy listener's other read deadlines."},
	{"IDLE_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"A client's kept-alive connection is closed after that long idle (to within 100 ms, or a tenth as above)."},
	{"BODY_IDLE_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"Longest time a request or response body may make no progress, in either direction (client or Core); then the exchange is cut and counted (`408` for a client's stalled upload, `504` when Core stops reading one). It also bounds the answers the proxy gives itself (a limit answer, a stored result, a refusal, Core's answer to a bridged poll: each piece of up to 64 KiB written has a write deadline of the timeout, after the time net/http may take to read an unread body), net/http's read of the rest of a body the proxy answers without forwarding, the admin port's writes, and on the bridge's listener the reading of each of Core's callbacks, whole, and the writing of its answer (within twice the timeout)."},
	{"SHUTDOWN_DELAY", "Timeouts and shutdown", "duration", "", "",
		"After SIGTERM or SIGINT (Ctrl-C), how long the proxy keeps serving while its `/readyz` answers 503, so that load balancers stop sending before the port closes. A second SIGTERM or SIGINT ends the delay early."},
	{"SHUTDOWN_TIMEOUT", "Timeouts and shutdown", "duration", "", "",
		"Once the shutdown delay is over and the port closed, how long in-flight requests (uploads included) may finish before they are cut."},

	{"TRUSTED_PROXIES", "Clients and their keys", "CIDRs, comma-separated", "comma-separated CIDRs or single addresses, e.g. 10.0.0.0/8,192.0.2.7", "none",
		"Peers whose `X-Forwarded-For` (or `X-Real-IP`) is believed when keying per-client shares, and whose `X-Forwarded-Proto`, `-Host`, `-Port`, `Forwarded` and the like reach Core as sent; an untrusted peer's are replaced by mdproxy's own view or dropped. An IPv4-mapped IPv6 prefix (`::ffff:10.0.0.0/104`) is read as IPv4, as a peer's address is."},
	{"CLIENT_KEYS_MAX", "Clients and their keys", "client keys", "", "",
		"Most client keys each route's per-client share tracks at once (20 to 40 bytes a key; with `MDPROXY_REDIS_URL`, 40 to 85 more for the replica's last view of each client's share in Redis); a key is freed once its bucket is full again. Beyond it a new key skips the per-client check (counted and logged); the route's bucket still applies."},
	{"CLIENT_IPV6_PREFIX", "Clients and their keys", "bits", "", "",
		"IPv6 client addresses (the peer's, or a trusted proxy's `X-Forwarded-For` or `X-Real-IP`) are grouped by this prefix into one per-client key: a host given a /64 takes any address in it at will."},
	{"CLIENT_IPV4_PREFIX", "Clients and their keys", "bits", "", "",
		"The same for IPv4 addresses, IPv4-mapped IPv6 ones included."},

	{"LOG_LEVEL", "Logs and the admin port", "word", "debug, info, warn or error", "",
		"The least level logged; `debug` adds a `request` line a request (route, method, decision, status, duration, bytes; never a path, query, apikey or address)."},
	{"LOG_FORMAT", "Logs and the admin port", "word", "json or text", "text when stderr is a terminal, else json",
		"How log lines are written on stderr: `json`, one JSON object a line (for log collectors), or `text`, slog's key=value lines (for a person at a terminal); the start-up settings come one line a group either way."},
	{"PPROF", "Logs and the admin port", "true or false", "true or false (as Go's strconv.ParseBool reads: 1, t, TRUE, 0, f, FALSE...)", "",
		"Serve Go's profiler (`net/http/pprof`) under `/debug/pprof/` on the admin port; off, `/debug/pprof/` answers 404. A CPU profile or trace may last up to `MDPROXY_BODY_IDLE_TIMEOUT`."},

	{"TLS_CERT_FILE", "TLS", "path", "a readable PEM file; with MDPROXY_TLS_KEY_FILE, both or neither", "none: plain HTTP",
		"PEM certificate (chain, leaf first) that the proxy port serves HTTPS (HTTP/1.1) with; read again when the file changes (at most every few seconds, on a new connection, once two checks read it alike); a renewal that does not load keeps the one served."},
	{"TLS_KEY_FILE", "TLS", "path", "a readable PEM file; with MDPROXY_TLS_CERT_FILE, both or neither", "none",
		"The PEM private key of `MDPROXY_TLS_CERT_FILE`."},
	{"UPSTREAM_CA_FILE", "TLS", "path", "a readable PEM bundle; only with an https MDPROXY_UPSTREAM_URL", "none: the system's roots",
		"PEM bundle of the CA certificates that an `https://` Core is verified against."},
	{"UPSTREAM_CERT_FILE", "TLS", "path", "a readable PEM file; with MDPROXY_UPSTREAM_KEY_FILE, both or neither; only with an https MDPROXY_UPSTREAM_URL", "none",
		"PEM client certificate presented to an `https://` Core that asks for one (mutual TLS), reloaded when renewed as `MDPROXY_TLS_CERT_FILE` is."},
	{"UPSTREAM_KEY_FILE", "TLS", "path", "a readable PEM file; with MDPROXY_UPSTREAM_CERT_FILE, both or neither", "none",
		"The PEM private key of `MDPROXY_UPSTREAM_CERT_FILE`."},
	{"UPSTREAM_SERVER_NAME", "TLS", "host name", "a DNS host name; only with an https MDPROXY_UPSTREAM_URL", "the URL's host",
		"The name sent to an `https://` Core (SNI) and verified in its certificate."},

	{"BRIDGE", "The bridge", "true or false", "true or false", "",
		"The bridge: Core's callbacks taken by mdproxy, the polls of the files submitted through it answered from them; `false`: every request is forwarded and limited as without it, and the other bridge settings are not checked."},
	{"BRIDGE_LISTEN_ADDR", "The bridge", "host:port", "a host:port to listen on for Core's callbacks, port 0 to 65535, not the proxy's nor the admin port's; must not be set empty", "",
		"The callback listener, where Core posts the results of bridged submissions: loopback, since Core shares the sidecar's network namespace; port `0` takes a free one; HTTPS with the proxy port's certificate when `MDPROXY_TLS_CERT_FILE` is set."},
	{"BRIDGE_CALLBACK_URL", "The bridge", "URL", "an http or https URL with a host, a port of 1 to 65535 if any, a path if any, no user or password, no query or fragment", "http:// and the listener's address (http://127.0.0.1:9010); https:// with MDPROXY_TLS_CERT_FILE; 0.0.0.0 or :: as 127.0.0.1",
		"The base URL at which Core reaches the callback listener; a submission's `callbackurl` is this, `/callback/` and its secret. The listener takes callbacks at the path and `/callback/`, and at `/callback/` alone (a proxy in front that takes the path off)."},
	{"BRIDGE_REFRESH", "The bridge", "duration", "", "",
		"How long a pending id's callback may be late before Core is asked about the id, and the least time between two such questions for one id."},
	{"BRIDGE_PENDING_TTL", "The bridge", "duration", "", "",
		"How long a bridged submission stays pending without its result; then it is forgotten and its polls go to Core."},
	{"BRIDGE_PENDING_MAX_BYTES", "The bridge", "bytes", "", "",
		"What the pending ids hold in all: each its `data_id` and 512 bytes, plus Core's reply kept as its answer (body, `Content-Type` and 64 bytes); beyond it the oldest ids are dropped (counted, logged once a burst) and their polls go to Core."},
	{"STORE_MAX_BYTES", "The bridge", "bytes", "", "",
		"The result store's cap in memory: each result weighs its body, `data_id` and `Content-Type` plus 256 bytes, and one above a sixteenth of the cap is not kept (with Redis, its `maxmemory` bounds the store)."},
	{"STORE_TTL", "The bridge", "duration", "", "",
		"How long a final result is kept after it was stored (Core's default retention). In memory it is kept to within a hundredth of this, at most 1 s (the store reads a coarse clock)."},

	{"REDIS_URL", "Redis: several replicas", "URL", "", "none: each replica alone",
		"The Redis that replicas share their limits and results on: `redis://[user:password@]host:port/db`, `rediss://` for TLS (go-redis's ParseURL syntax); the host as in `MDPROXY_UPSTREAM_URL`."},
	{"REDIS_PREFIX", "Redis: several replicas", "text", "any text", "",
		"What every key mdproxy writes in Redis starts with."},
	{"REDIS_TIMEOUT", "Redis: several replicas", "duration", "", "",
		"Longest wait for each Redis call (a limit decision, a result looked up or stored); a call that misses it counts as Redis down."},
	{"REPLICAS", "Redis: several replicas", "replicas", "", "",
		"How many replicas share the Redis: when it does not answer, each limits at its share of each limit, rate/`N`."},

	{"LIMITS_FILE", "Route limits", "path", "a readable file of route limit variables only", "none: the limits are the environment's until a restart",
		"A file of route limit variables (`MDPROXY_<ROUTE>_RATE=10` lines, `.env` syntax, e.g. a Kubernetes ConfigMap mounted as a directory), read at start and again on SIGHUP and when it changed and settled; its values take precedence over the environment's and are taken as written (a `$` in a value, or a variable set twice, is an error)."},
	{"LIMITS_FILE_SETTLE", "Route limits", "duration", "", "",
		"How long the limits file must stay unchanged after a change before it is put in force (read at the change and again after this, applied when both match); SIGHUP does not wait for it."},
}

// limitDocs describe the settings of a route's limit, by the env tag of limitVars'
// field (the range is limitWants').
var limitDocs = []settingDoc{
	{key: "RATE", unit: "requests per second", meaning: "The route's token bucket rate, fractions allowed (`0.5` is one every 2 s); `0` is no limit."},
	{key: "BURST", unit: "requests", meaning: "The bucket's size; `0` is one second's worth, `ceil(rate)`, at least 1. Setting only the rate of a route with a default limit keeps its default burst."},
	{key: "MAX_WAIT", unit: "duration", meaning: "How long a request may wait for a token before it is rejected; `0` rejects at once."},
	{key: "CLIENT_LIMIT", unit: "requests per window", meaning: "Each client's share of the route, inside the route's bucket, a client being its `apikey`, else its address grouped by `MDPROXY_CLIENT_IPV6_PREFIX` or `_IPV4_PREFIX`: a token bucket of `CLIENT_LIMIT` requests refilled at `CLIENT_LIMIT` per `CLIENT_WINDOW` (at most 2×`CLIENT_LIMIT`−1 within any window); `0` is off."},
	{key: "CLIENT_WINDOW", unit: "duration", meaning: "The window of `CLIENT_LIMIT`; `0` is `1s`."},
	{key: "DRY_RUN", unit: "true or false", meaning: "Decide as the limit would, count what it would refuse as `would_reject`, and forward every request."},
	{key: "RATE_MIN", unit: "requests per second", meaning: "The lowest rate the adaptive limit (`MDPROXY_ADAPTIVE`) lowers the route to while Core is busy; `0` is a tenth of `_RATE`, which stays the highest. Without the adaptive limit it has no effect."},
	{key: "EXEMPT", unit: "list", meaning: "Clients the route's limit never refuses, comma-separated: address prefixes (`10.0.0.0/8`, `2001:db8::/32`, or an address), matched against the client address as the per-client share reads it (`MDPROXY_TRUSTED_PROXIES`), and apikeys given as `sha256:` and the hex SHA-256 of the key (`printf %s KEY | sha256sum`), never the key. Their requests take no token and count as decision `exempt`."},
}

// Settings returns every variable mdproxy reads, grouped as SettingGroups, each group
// in the order of settingDocs: Config's variables, their defaults taken from Config's
// envDefault tags, then the route limits as families (MDPROXY_<ROUTE>_RATE...), whose
// defaults are each route's in DefaultLimits (RouteLimitDefaults lists them). It
// panics when settingDocs and Config disagree, a programming error.
func Settings() []Setting {
	fields := map[string]reflect.StructField{}
	for _, f := range reflect.VisibleFields(reflect.TypeFor[Config]()) {
		if key, _, _ := strings.Cut(f.Tag.Get("env"), ","); key != "" && key != "-" {
			fields[key] = f
		}
	}
	byGroup := map[string][]Setting{}
	for _, d := range settingDocs {
		f, ok := fields[d.key]
		if !ok {
			panic("sidecar: settingDocs has " + d.key + ", which no Config field reads")
		}
		delete(fields, d.key)
		s := Setting{Name: EnvPrefix + d.key, Group: d.group, Unit: d.unit, Accepts: d.accepts,
			DefaultText: d.defaultText, Meaning: d.meaning}
		s.Default, _ = f.Tag.Lookup("envDefault")
		if s.Default == "" && f.Type.Kind() == reflect.Bool {
			s.Default = "false"
		}
		if want, ok := configWants[d.key]; ok {
			s.Accepts = strings.TrimPrefix(want, "want ")
		}
		byGroup[d.group] = append(byGroup[d.group], s)
	}
	for key := range fields {
		panic("sidecar: Config reads " + EnvPrefix + key + ", which settingDocs does not describe")
	}
	for _, d := range limitDocs {
		def := "the route's (each route's default limit); else 0"
		if d.key == "EXEMPT" {
			def = "none"
		}
		byGroup["Route limits"] = append(byGroup["Route limits"], Setting{
			Name: limitVarName("<ROUTE>", d.key), Group: "Route limits", Unit: d.unit,
			DefaultText: def, Reload: true,
			Accepts: strings.TrimPrefix(limitWants[d.key], "want "), Meaning: d.meaning})
	}
	var all []Setting
	for _, g := range SettingGroups {
		if len(byGroup[g]) == 0 {
			panic("sidecar: no setting in group " + g)
		}
		all = append(all, byGroup[g]...)
		delete(byGroup, g)
	}
	for g := range byGroup {
		panic("sidecar: settingDocs uses group " + g + ", which SettingGroups does not list")
	}
	return all
}

// RouteLimitDefault is a route's limit when none of its variables is set, as the
// values of its variables (MDPROXY_<ROUTE>_RATE, ...), in limitSettings' order.
type RouteLimitDefault struct {
	Route  string
	Values []string // one a setting of LimitSettings, e.g. "10", "20", "0s", ...
}

// LimitSettings are the settings of a route's limit, the suffixes of its variables
// (RATE, BURST, MAX_WAIT, CLIENT_LIMIT, CLIENT_WINDOW, DRY_RUN, EXEMPT, RATE_MIN), in order.
func LimitSettings() []string { return append([]string(nil), limitSettings...) }

// RouteLimitDefaults returns every route's default limit, in proxy.RouteNames' order:
// DefaultLimits' for file_result, batch_status and hash_lookup, all zero (no limit)
// for the others.
func RouteLimitDefaults() []RouteLimitDefault {
	var out []RouteLimitDefault
	for _, route := range proxy.RouteNames() {
		l := DefaultLimits[route]
		out = append(out, RouteLimitDefault{Route: route, Values: []string{
			strconv.FormatFloat(l.Rate, 'g', -1, 64), strconv.Itoa(l.Burst), l.MaxWait.String(),
			strconv.Itoa(l.ClientLimit), l.ClientWindow.String(), strconv.FormatBool(l.DryRun), l.Exempt,
			strconv.FormatFloat(l.RateMin, 'g', -1, 64)}})
	}
	if len(out[0].Values) != len(limitSettings) {
		panic(fmt.Sprintf("sidecar: RouteLimitDefaults gives %d values, a route has %d settings", len(out[0].Values), len(limitSettings)))
	}
	return out
}
