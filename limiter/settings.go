package limiter

import (
	"errors"
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
// The error, an envconf.Errors, names every bad variable, each as an *envconf.Error
// saying what it accepts, in the order of routes and of Limit's fields, e.g.
// `MDPROXY_FILE_RESULT_RATE="abc": want a number of requests per second >= 0, ...`;
// the limits are nil then.
func ParseLimits(environ map[string]string, prefix string, routes []string, defaults map[string]Limit) (map[string]Limit, error) {
	limits := make(map[string]Limit, len(routes))
	var errs envconf.Errors
	for _, route := range routes {
		l := defaults[route]
		routePrefix := VarName(prefix, route, "")
		for _, err := range envconf.ParseAll(&l, routePrefix, environ) {
			// What the setting accepts, its range included, rather than only its type.
			var ee *envconf.Error
			if errors.As(err, &ee) {
				if want, ok := wants[strings.TrimPrefix(ee.Var, routePrefix)]; ok {
					ee.Want = want
				}
			}
			errs.Add(err)
		}
		fes := l.check()
		if v := environ[routePrefix+"RATE"]; strings.ContainsAny(v, "_xXpP") &&
			(len(fes) == 0 || fes[0].Var != "RATE") && !errs.Names(routePrefix+"RATE") {
			// strconv.ParseFloat reads Go's literals: "1_5" as 15, "0x1p4" as 16. A rate
			// is written in decimal; anything else is more likely a mistake.
			fes = append([]fieldError{{"RATE", wants["RATE"]}}, fes...)
		}
		for _, fe := range fes {
			name := routePrefix + fe.Var
			errs.Add(&envconf.Error{Var: name, Value: environ[name], Want: fe.Want})
		}
		limits[route] = l
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	return limits, nil
}
