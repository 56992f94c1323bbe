package sidecar

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/joho/godotenv"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/proxy"
)

// utf8BOM is the byte order mark that Windows editors write at the start of a UTF-8
// file.
var utf8BOM = []byte("\ufeff")

// limitsFile is one reading of the limits file: its content, or the error of reading
// it (naming MDPROXY_LIMITS_FILE and the path; data is nil then).
type limitsFile struct {
	data []byte
	err  error
}

// readLimitsFile reads the limits file at path, whole, once.
func readLimitsFile(path string) limitsFile {
	data, err := os.ReadFile(path)
	if err != nil {
		return limitsFile{err: fmt.Errorf("%sLIMITS_FILE=%q: reading the limits file: %w", EnvPrefix, path, err)}
	}
	return limitsFile{data: data}
}

// same reports whether f and g read alike: the same bytes (an empty file and another
// empty one alike), or errors of the same text.
func (f limitsFile) same(g limitsFile) bool {
	if f.err != nil || g.err != nil {
		return f.err != nil && g.err != nil && f.err.Error() == g.err.Error()
	}
	return bytes.Equal(f.data, g.data)
}

// parseLimitsFile parses f, read from the limits file at path: lines of KEY=VALUE, as a
// .env file (github.com/joho/godotenv: # comments, blank lines, quotes and "export "
// allowed), each key a route limit variable; a leading UTF-8 byte order mark is
// skipped. It returns the route limit variables it sets, and an error naming the file:
// f's own when it could not be read, one when it does not parse (vars is nil then), or
// an envconf.Errors naming each variable of it that is not a route limit variable.
//
// godotenv expands $NAME and ${NAME} in a value and lets a later line set a key again;
// neither has a use here, and each hides a mistake (a template placeholder left
// unrendered would become the default, a bad first value would go unseen), so a value
// holding "$" and a key set twice are errors naming the variable.
func parseLimitsFile(path string, f limitsFile) (vars map[string]string, err error) {
	if f.err != nil {
		return nil, f.err
	}
	data := bytes.TrimPrefix(f.data, utf8BOM) // godotenv would read it as part of the first key
	vars, err = godotenv.UnmarshalBytes(data)
	if err != nil {
		return nil, fmt.Errorf("limits file %s: want lines of MDPROXY_<ROUTE>_<SETTING>=VALUE: %w", path, err)
	}
	known := routeLimitVars()
	var errs envconf.Errors
	for _, l := range literalErrors(data) {
		errs.Add(fmt.Errorf("limits file %s: %w", path, l))
		delete(vars, l.Var)
	}
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		if !slices.Contains(known, name) {
			errs.Add(fmt.Errorf("limits file %s: %w", path, &envconf.Error{Var: name, Value: vars[name],
				Want: "want only route limit variables here, MDPROXY_<ROUTE>_RATE, _BURST, _MAX_WAIT, _CLIENT_LIMIT, _CLIENT_WINDOW or _DRY_RUN, <ROUTE> a route name in upper case"}))
			delete(vars, name)
		}
	}
	return vars, errs.Err()
}

// loadLimits returns each route's limit, read from environ and, when file is not "",
// from f, the limits file read from file, whose variables take precedence over environ's: a route limit
// variable that the file sets (empty: the default) is taken from it, one it does not
// set from environ, else from DefaultLimits. It also returns the route limit variables
// and the per-client settings that are set but have no effect (see ineffective).
//
// The error, an envconf.Errors, names every bad variable, those set in the file
// prefixed by "limits file PATH: ", or the file when it cannot be read or parsed.
func loadLimits(environ map[string]string, file string, f limitsFile) (limits map[string]limiter.Limit, noEffect []string, err error) {
	merged := environ
	var fromFile map[string]string
	var errs envconf.Errors
	if file != "" {
		fromFile, err = parseLimitsFile(file, f)
		if fromFile == nil {
			return nil, nil, err
		}
		errs.Add(err) // variables that are not route limits: the others are checked too
		merged = maps.Clone(environ)
		maps.Copy(merged, fromFile)
	}
	limits, err = parseLimits(merged, proxy.RouteNames(), DefaultLimits)
	parseErrs, _ := err.(envconf.Errors)
	for _, e := range parseErrs {
		var ee *envconf.Error
		if errors.As(e, &ee) {
			if _, ok := fromFile[ee.Var]; ok {
				e = fmt.Errorf("limits file %s: %w", file, e)
			}
		}
		errs.Add(e)
	}
	if err := errs.Err(); err != nil {
		return nil, nil, err
	}
	return limits, ineffective(merged, limits), nil
}

// ineffective returns, in route and setting order, each variable set (not empty) in
// environ that changes nothing given limits, with why: a route's _BURST or _MAX_WAIT
// without a rate (they shape the route's token bucket, which it then has not), its
// _CLIENT_WINDOW without a _CLIENT_LIMIT, and MDPROXY_CLIENT_KEYS_MAX,
// MDPROXY_CLIENT_IPV6_PREFIX and MDPROXY_CLIENT_IPV4_PREFIX when no route has a
// per-client share. E.g. "MDPROXY_STAT_BURST (MDPROXY_STAT_RATE is 0: no bucket)".
func ineffective(environ map[string]string, limits map[string]limiter.Limit) []string {
	var out []string
	set := func(name string) bool { return environ[name] != "" }
	shared := false
	for _, route := range proxy.RouteNames() {
		l := limits[route]
		shared = shared || l.ClientLimit > 0
		v := func(setting string) string { return limitVarName(route, setting) }
		if l.Rate == 0 {
			for _, s := range []string{"BURST", "MAX_WAIT"} {
				if set(v(s)) {
					out = append(out, fmt.Sprintf("%s (%s is 0: no bucket)", v(s), v("RATE")))
				}
			}
		}
		if l.ClientLimit == 0 && set(v("CLIENT_WINDOW")) {
			out = append(out, fmt.Sprintf("%s (%s is 0: no per-client share)", v("CLIENT_WINDOW"), v("CLIENT_LIMIT")))
		}
		if l.Unlimited() && set(v("DRY_RUN")) {
			out = append(out, fmt.Sprintf("%s (the route has no limit to try)", v("DRY_RUN")))
		}
	}
	for _, s := range []string{"CLIENT_KEYS_MAX", "CLIENT_IPV6_PREFIX", "CLIENT_IPV4_PREFIX"} {
		if name := EnvPrefix + s; !shared && set(name) {
			out = append(out, name+" (no route has a _CLIENT_LIMIT)")
		}
	}
	// Replicas that were meant to share a Redis but were not given one each let the
	// full rate through: say so.
	if !set(EnvPrefix + "REDIS_URL") {
		for _, s := range []string{"REDIS_PREFIX", "REDIS_TIMEOUT", "REPLICAS"} {
			if set(EnvPrefix + s) {
				out = append(out, EnvPrefix+s+" (no MDPROXY_REDIS_URL: limits and results are this replica's own)")
			}
		}
	}
	return out
}

// literalErrors returns, in line order, an error for each line of a limits file whose
// value holds "$" and each key set on an earlier line too. Lines are read as godotenv
// reads them for this: blank and "#" lines skipped, "export " dropped, the key before
// "=" (or ":").
func literalErrors(data []byte) []*envconf.Error {
	var errs []*envconf.Error
	first := map[string]int{} // key -> the line that set it first
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k := strings.IndexAny(line, "=:")
		if k < 0 {
			continue // godotenv refused the file already
		}
		key, value := strings.TrimSpace(line[:k]), strings.TrimSpace(line[k+1:])
		if !strings.HasPrefix(value, `"`) && !strings.HasPrefix(value, "'") {
			value, _, _ = strings.Cut(value, " #") // an unquoted value's comment, as godotenv drops it
		}
		switch at, seen := first[key]; {
		case seen:
			errs = append(errs, &envconf.Error{Var: key, Value: value,
				Want: fmt.Sprintf("want each variable set once; set on line %d, and again on line %d", at, i+1)})
		case strings.Contains(value, "$"):
			errs = append(errs, &envconf.Error{Var: key, Value: value,
				Want: "want a value as written: the limits file expands no variables ($NAME, ${NAME})"})
		}
		if _, seen := first[key]; !seen {
			first[key] = i + 1
		}
	}
	return errs
}
