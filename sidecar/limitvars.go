package sidecar

import (
	"errors"
	"reflect"
	"strings"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/proxy"
)

// limitVars are the variables of one route's limit, each MDPROXY_<ROUTE>_ followed by
// its field's env tag (limitVarName); what each means is said by the limiter.Limit
// field of the same name. Its fields are limiter.Limit's, in the same order and of the
// same types, so that one converts to the other (a conversion ignores tags): a field
// added to limiter.Limit and not here does not compile.
type limitVars struct {
	Rate         float64       `env:"RATE"`
	Burst        int           `env:"BURST"`
	MaxWait      time.Duration `env:"MAX_WAIT"`
	ClientLimit  int           `env:"CLIENT_LIMIT"`
	ClientWindow time.Duration `env:"CLIENT_WINDOW"`
	DryRun       bool          `env:"DRY_RUN"`
	Exempt       string        `env:"EXEMPT"`
	RateMin      float64       `env:"RATE_MIN"`
}

// limitSettings are the settings of a route's limit, the suffixes of its variables
// (RATE, BURST, MAX_WAIT, CLIENT_LIMIT, CLIENT_WINDOW, DRY_RUN, EXEMPT, RATE_MIN), in field order.
var limitSettings = envconf.Names[limitVars]("")

// limitWants says what each setting of a route's limit accepts, by setting: the range
// (limiter's bounds, limiter.Limit.Validate) and the meaning of 0. It is the message of
// a value out of range and of one that does not parse.
var limitWants = map[string]string{
	"RATE":          "want a number of requests per second >= 0: 0 = no limit, else from 0.00001 (one in 27.8 hours) to 1e9, fractions allowed (e.g. 0.5)",
	"BURST":         "want a whole number of requests >= 0, at most 2147483647; 0 = ceil(rate), at least 1",
	"MAX_WAIT":      "want a duration with its unit >= 0, at most 24h (e.g. 500ms, 2s); 0 = reject at once",
	"CLIENT_LIMIT":  "want a whole number of requests per window >= 0, at most 2147483647; 0 = off",
	"CLIENT_WINDOW": "want a duration with its unit >= 0, at most 720h (e.g. 1s, 1m); 0 = 1s",
	"DRY_RUN":       "want true or false; true = decide as the limit would, count would_reject and let every request go on",
	"RATE_MIN":      "want a number of requests per second >= 0, at most the rate: 0 = a tenth of the rate",
	"EXEMPT":        "want client address prefixes (10.0.0.0/8, 2001:db8::/32, an address) and apikey digests (sha256: and the 64 hex digits of the key's SHA-256, never the key), comma-separated; empty = none",
}

// limitVarName returns the variable of a route's setting: MDPROXY_, the route name in
// upper case, "_", then the setting (one of limitSettings, or "" for the prefix of all
// of them). limitVarName("file_result", "RATE") is "MDPROXY_FILE_RESULT_RATE".
func limitVarName(route, setting string) string {
	return EnvPrefix + strings.ToUpper(route) + "_" + setting
}

// parseLimits reads the limit of every route in routes from environ (variable name to
// value): each of limitVars' variables of the route; an unset or empty variable keeps
// the route's value in defaults (the zero Limit, unlimited, for a route absent from
// it). defaults is not changed.
//
// The error, an envconf.Errors, names every bad variable, each once as an
// *envconf.Error quoting its value and saying what it accepts (limitWants), in the
// order of routes and of the settings, those that do not parse first, e.g.
// `MDPROXY_FILE_RESULT_RATE="abc": want a number of requests per second >= 0, ...`;
// the limits are nil then.
func parseLimits(environ map[string]string, routes []string, defaults map[string]limiter.Limit) (map[string]limiter.Limit, error) {
	limits := make(map[string]limiter.Limit, len(routes))
	var errs envconf.Errors
	for _, route := range routes {
		v := limitVars(defaults[route])
		prefix := limitVarName(route, "")
		for _, err := range envconf.ParseAll(&v, prefix, environ) {
			// What the setting accepts, its range included, rather than only its type.
			var ee *envconf.Error
			if errors.As(err, &ee) {
				if want, ok := limitWants[strings.TrimPrefix(ee.Var, prefix)]; ok {
					ee.Want = want
				}
			}
			errs.Add(err)
		}
		if rate := environ[prefix+"RATE"]; strings.ContainsAny(rate, "_xXpP") {
			// strconv.ParseFloat reads Go's literals: "1_5" as 15, "0x1p4" as 16. A rate
			// is written in decimal; anything else is more likely a mistake.
			errs.Add(&envconf.Error{Var: prefix + "RATE", Value: rate, Want: limitWants["RATE"]})
		}
		l := limiter.Limit(v)
		errs.Add(limitErrors(environ, prefix, l.Validate()))
		if _, err := proxy.ParseExempt(l.Exempt); err != nil {
			// The value is not quoted: an entry that is no prefix may be a raw apikey.
			errs.Add(&envconf.Error{Var: prefix + "EXEMPT", Value: "(" + err.Error() + ")", Want: limitWants["EXEMPT"]})
		}
		limits[route] = l
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return limits, nil
}

// limitErrors returns err, what limiter.Limit.Validate said of a route's limit, as an
// envconf.Errors: each *limiter.FieldError it joins as an *envconf.Error naming the
// field's variable (prefix and the field's env tag in limitVars), quoting its value in
// environ and saying what it accepts (limitWants). nil when err is.
func limitErrors(environ map[string]string, prefix string, err error) envconf.Errors {
	if err == nil {
		return nil
	}
	all := []error{err}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		all = joined.Unwrap()
	}
	var errs envconf.Errors
	for _, e := range all {
		var fe *limiter.FieldError
		if !errors.As(e, &fe) {
			errs.Add(e)
			continue
		}
		f, ok := reflect.TypeFor[limitVars]().FieldByName(fe.Field)
		if !ok {
			errs.Add(e) // no variable sets the field: the error as limiter said it
			continue
		}
		setting := f.Tag.Get("env")
		errs.Add(&envconf.Error{Var: prefix + setting, Value: environ[prefix+setting], Want: limitWants[setting]})
	}
	return errs
}

// routeLimitVars returns the name of every route limit variable: MDPROXY_<ROUTE>_RATE,
// _BURST, _MAX_WAIT, _CLIENT_LIMIT, _CLIENT_WINDOW, _DRY_RUN, _EXEMPT and _RATE_MIN of every route.
func routeLimitVars() []string {
	var names []string
	for _, route := range proxy.RouteNames() {
		for _, setting := range limitSettings {
			names = append(names, limitVarName(route, setting))
		}
	}
	return names
}
