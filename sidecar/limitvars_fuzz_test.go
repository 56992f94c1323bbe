package sidecar

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/limiter"
)

// fuzzSettings are the settings of a route, in the order of FuzzParseLimits' values.
var fuzzSettings = []string{"RATE", "BURST", "MAX_WAIT", "CLIENT_LIMIT", "CLIENT_WINDOW", "DRY_RUN"}

// fuzzDefaults are the defaults FuzzParseLimits picks from by a byte of its input.
var fuzzDefaults = []map[string]limiter.Limit{
	nil,
	{"file_result": {Rate: 20, Burst: 40, MaxWait: 500 * time.Millisecond}},
	{"file_result": {Rate: 0.5, ClientLimit: 10, ClientWindow: time.Minute}, "batch_status": {Rate: 2}},
}

// FuzzParseLimits feeds arbitrary values of MDPROXY_FILE_RESULT_RATE, _BURST,
// _MAX_WAIT, _CLIENT_LIMIT, _CLIENT_WINDOW and _DRY_RUN (each set or unset) to
// parseLimits. It
// checks that it never panics and either returns an *envconf.Error naming one of those
// variables, set to a value that is not a valid setting, or limits that NewSet accepts,
// with no NaN, infinite or negative value, the value read from each set variable and
// the default kept for each unset or empty one.
func FuzzParseLimits(f *testing.F) {
	seeds := [][6]string{
		{"", "", "", "", "", ""},
		{"0.5", "3", "250ms", "7", "1m", "true"},
		{"20", "40", "500ms", "0", "0", "false"},
		{"0", "0", "0", "0", "0", "0"},
		{"abc", "", "", "", "", "maybe"},
		{"-1", "-1", "-1s", "-1", "-1s", "-1"},
		{"NaN", "", "", "", "", "1"},
		{"Inf", "", "", "", "", "T"},
		{"-Inf", "", "", "", "", "FALSE"},
		{"+inf", "", "", "", "", "yes"},
		{"1e309", "", "", "", "", "True"},
		{"-0", "-0", "-0s", "-0", "-0s", "tRUE"},
		{"0x1p-2", "0x10", "1h2m3.5s", "1_000", "2562047h47m16.854775807s", "f"},
		{"1e-300", "2147483647", "2562047h47m16.854775808s", "2147483648", "9223372036854775807ns", " true"},
		{" 1", "1 ", "1", "1.5", "1d", "on"},
		{"1e19", "", "", "", "", "2"},
		{".5", "+3", "+1s", "00", "1µs", "F"},
	}
	for i, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], uint8(0x3f), uint8(i))
	}
	f.Add("", "", "", "", "", "", uint8(0), uint8(1)) // nothing set
	f.Add("x", "x", "x", "x", "x", "x", uint8(0x10), uint8(2))
	f.Add("", "", "", "", "", "maybe", uint8(0x20), uint8(0))

	routeNames := []string{"file_result", "batch_status"}
	f.Fuzz(func(t *testing.T, rate, burst, maxWait, clientLimit, clientWindow, dryRun string, mask, defaultsIdx uint8) {
		defaults := fuzzDefaults[int(defaultsIdx)%len(fuzzDefaults)]
		values := []string{rate, burst, maxWait, clientLimit, clientWindow, dryRun}
		environ := map[string]string{}
		var names []string
		for i, s := range fuzzSettings {
			name := limitVarName("file_result", s)
			names = append(names, name)
			if mask&(1<<i) != 0 {
				environ[name] = values[i]
			}
		}

		limits, err := parseLimits(environ, routeNames, defaults)
		if err != nil {
			var ee *envconf.Error
			if !errors.As(err, &ee) {
				t.Fatalf("parseLimits(%q) = %v (%T), want an *envconf.Error", environ, err, err)
			}
			if !slices.Contains(names, ee.Var) {
				t.Fatalf("parseLimits(%q) = error naming %q, want one of %q", environ, ee.Var, names)
			}
			if v, ok := environ[ee.Var]; !ok || v != ee.Value || v == "" {
				t.Errorf("parseLimits(%q) = error with %s=%q, want the variable's non-empty value %q", environ, ee.Var, ee.Value, v)
			}
			if setting := ee.Var[len(limitVarName("file_result", "")):]; validSetting(setting, ee.Value) {
				t.Errorf("parseLimits(%q) = %v, want no error for the valid %s=%q", environ, err, ee.Var, ee.Value)
			}
			if limits != nil {
				t.Errorf("parseLimits(%q) = %v with error %v, want nil limits", environ, limits, err)
			}
			return
		}

		if len(limits) != len(routeNames) {
			t.Errorf("parseLimits(%q) = %v, want a limit for each of %q", environ, limits, routeNames)
		}
		if got, want := limits["batch_status"], defaults["batch_status"]; got != want {
			t.Errorf("parseLimits(%q)[batch_status] = %+v, want its default %+v", environ, got, want)
		}
		l := limits["file_result"]
		if math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate < 0 || l.Burst < 0 || l.MaxWait < 0 ||
			l.ClientLimit < 0 || l.ClientWindow < 0 {
			t.Errorf("parseLimits(%q)[file_result] = %+v, want no NaN, infinite or negative value", environ, l)
		}
		def := defaults["file_result"]
		fields := []struct {
			got, def any
			read     func(string) (any, error)
		}{
			{l.Rate, def.Rate, readFloat},
			{l.Burst, def.Burst, readInt},
			{l.MaxWait, def.MaxWait, readDuration},
			{l.ClientLimit, def.ClientLimit, readInt},
			{l.ClientWindow, def.ClientWindow, readDuration},
			{l.DryRun, def.DryRun, readBool},
		}
		for i, fl := range fields {
			want := fl.def
			if v := environ[names[i]]; v != "" {
				w, err := fl.read(v)
				if err != nil {
					t.Errorf("parseLimits(%q) accepted %s=%q, which does not parse: %v", environ, names[i], v, err)
					continue
				}
				want = w
			}
			if fl.got != want {
				t.Errorf("parseLimits(%q)[file_result] %s = %v, want %v", environ, fuzzSettings[i], fl.got, want)
			}
		}

		set, err := limiter.NewSet(limits, nil)
		if err != nil {
			t.Fatalf("NewSet(%+v) = %v, want the parsed limits accepted", limits, err)
		}
		if eff := set.Limit("file_result"); l.Rate > 0 && eff.Burst < 1 {
			t.Errorf("NewSet(%+v).Limit(file_result).Burst = %d, want at least 1", limits, eff.Burst)
		}
	})
}

// readFloat, readInt, readDuration and readBool read a setting's value as the standard
// library does; they return the value as the Limit field's type.
var (
	readFloat = func(v string) (any, error) { return strconv.ParseFloat(v, 64) }
	readInt   = func(v string) (any, error) {
		n, err := strconv.ParseInt(v, 10, 32) // caarlos0/env reads an int in 32 bits
		return int(n), err
	}
	readDuration = func(v string) (any, error) { return time.ParseDuration(v) }
	readBool     = func(v string) (any, error) { return strconv.ParseBool(v) }
)

// validSetting reports whether v is a value that setting (RATE, BURST...) accepts: it
// parses and, a number, is not negative (a rate: 0, or from MinRate to MaxRate).
func validSetting(setting, v string) bool {
	var read func(string) (any, error)
	switch setting {
	case "RATE":
		if strings.ContainsAny(v, "_xXpP") {
			return false // Go's literals, not decimal
		}
		read = readFloat
	case "BURST", "CLIENT_LIMIT":
		read = readInt
	case "MAX_WAIT", "CLIENT_WINDOW":
		read = readDuration
	case "DRY_RUN":
		read = readBool
	default:
		return false
	}
	x, err := read(v)
	if err != nil {
		return false
	}
	switch x := x.(type) {
	case float64:
		return x == 0 || (x >= limiter.MinRate && x <= limiter.MaxRate)
	case int:
		return x >= 0
	case time.Duration:
		if setting == "MAX_WAIT" {
			return x >= 0 && x <= limiter.MaxMaxWait
		}
		return x >= 0 && x <= limiter.MaxClientWindow
	case bool:
		return true
	}
	return false
}
