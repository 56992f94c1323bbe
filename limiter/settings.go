package limiter

import (
	"strings"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// VarName returns the environment variable of a route's setting: prefix, the route
// name in upper case, "_", then the setting (RATE, BURST, MAX_WAIT, CLIENT_LIMIT,
// CLIENT_WINDOW). VarName("MDPROXY_", "file_result", "RATE") is
// "MDPROXY_FILE_RESULT_RATE".
func VarName(prefix, route, setting string) string {
	return prefix + strings.ToUpper(route) + "_" + setting
}

// ParseLimits reads the limit of every route in routes from environ (variable name to
// value, as env.ToMap(os.Environ()) gives), with github.com/caarlos0/env. Each route's
// variables are VarName(prefix, route, setting); an unset or empty variable keeps the
// route's value in defaults (the zero Limit, unlimited, for a route absent from it).
//
// The error, an *envconf.Error, names the first bad variable and what it accepts, e.g.
// `MDPROXY_FILE_RESULT_RATE="abc": want a number, fractions allowed (e.g. 0.5)`.
func ParseLimits(environ map[string]string, prefix string, routes []string, defaults map[string]Limit) (map[string]Limit, error) {
	limits := make(map[string]Limit, len(routes))
	for _, route := range routes {
		l := defaults[route]
		routePrefix := VarName(prefix, route, "")
		if err := envconf.Parse(&l, routePrefix, environ); err != nil {
			return nil, err
		}
		if fe := l.check(); fe != nil {
			name := routePrefix + fe.Var
			return nil, &envconf.Error{Var: name, Value: environ[name], Want: fe.Want}
		}
		limits[route] = l
	}
	return limits, nil
}
