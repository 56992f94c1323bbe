package sidecar

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/limiter"
)

// limitTestRoutes are the routes parseLimits reads in these tests.
var limitTestRoutes = []string{"file_result", "hash_lookup", "file_submit"}

// limitTestDefaults are the limits the environment overrides in these tests.
var limitTestDefaults = map[string]limiter.Limit{
	"file_result": {Rate: 20, Burst: 40, MaxWait: 500 * time.Millisecond},
	"hash_lookup": {Rate: 50, ClientLimit: 10, ClientWindow: time.Second},
	// file_submit has no default: unlimited.
}

func TestLimitVarName(t *testing.T) {
	tests := []struct {
		route, setting, want string
	}{
		{"file_result", "RATE", "MDPROXY_FILE_RESULT_RATE"},
		{"hash_lookup", "CLIENT_WINDOW", "MDPROXY_HASH_LOOKUP_CLIENT_WINDOW"},
		{"file_result", "", "MDPROXY_FILE_RESULT_"},
	}
	for _, tt := range tests {
		if got := limitVarName(tt.route, tt.setting); got != tt.want {
			t.Errorf("limitVarName(%q, %q) = %q, want %q", tt.route, tt.setting, got, tt.want)
		}
	}
}

func TestParseLimits(t *testing.T) {
	tests := []struct {
		name    string
		environ map[string]string
		want    map[string]limiter.Limit
	}{
		{
			name:    "unset keeps defaults",
			environ: map[string]string{},
			want: map[string]limiter.Limit{
				"file_result": limitTestDefaults["file_result"],
				"hash_lookup": limitTestDefaults["hash_lookup"],
				"file_submit": {},
			},
		},
		{
			name: "empty keeps defaults, others ignored",
			environ: map[string]string{
				"MDPROXY_FILE_RESULT_RATE":  "",
				"MDPROXY_FILE_RESULT_BURST": "",
				"FILE_RESULT_RATE":          "1",   // no prefix
				"MDPROXY_OTHER_RATE":        "abc", // not a route asked for
				"MDPROXY_FILE_RESULT_RATES": "abc",
			},
			want: map[string]limiter.Limit{
				"file_result": limitTestDefaults["file_result"],
				"hash_lookup": limitTestDefaults["hash_lookup"],
				"file_submit": {},
			},
		},
		{
			name: "every setting of one route",
			environ: map[string]string{
				"MDPROXY_FILE_RESULT_RATE":          "0.5",
				"MDPROXY_FILE_RESULT_BURST":         "3",
				"MDPROXY_FILE_RESULT_MAX_WAIT":      "250ms",
				"MDPROXY_FILE_RESULT_CLIENT_LIMIT":  "7",
				"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "1m",
				"MDPROXY_FILE_RESULT_DRY_RUN":       "true",
			},
			want: map[string]limiter.Limit{
				"file_result": {Rate: 0.5, Burst: 3, MaxWait: 250 * time.Millisecond, ClientLimit: 7, ClientWindow: time.Minute, DryRun: true},
				"hash_lookup": limitTestDefaults["hash_lookup"],
				"file_submit": {},
			},
		},
		{
			name: "one setting overrides, the rest of the default stays",
			environ: map[string]string{
				"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT": "0",
				"MDPROXY_FILE_SUBMIT_RATE":         "100",
			},
			want: map[string]limiter.Limit{
				"file_result": limitTestDefaults["file_result"],
				"hash_lookup": {Rate: 50, ClientWindow: time.Second},
				"file_submit": {Rate: 100},
			},
		},
		{
			name: "zero turns a limit off",
			environ: map[string]string{
				"MDPROXY_FILE_RESULT_RATE":     "0",
				"MDPROXY_FILE_RESULT_MAX_WAIT": "0s",
			},
			want: map[string]limiter.Limit{
				"file_result": {Burst: 40},
				"hash_lookup": limitTestDefaults["hash_lookup"],
				"file_submit": {},
			},
		},
		{
			name: "dry run on, off, and in strconv.ParseBool's forms",
			environ: map[string]string{
				"MDPROXY_FILE_RESULT_DRY_RUN": "false",
				"MDPROXY_HASH_LOOKUP_DRY_RUN": "1",
				"MDPROXY_FILE_SUBMIT_DRY_RUN": "TRUE",
			},
			want: map[string]limiter.Limit{
				"file_result": limitTestDefaults["file_result"],
				"hash_lookup": {Rate: 50, ClientLimit: 10, ClientWindow: time.Second, DryRun: true},
				"file_submit": {DryRun: true}, // unlimited: nothing to dry-run
			},
		},
		{
			name: "integer rate and duration forms",
			environ: map[string]string{
				"MDPROXY_FILE_SUBMIT_RATE":          "2",
				"MDPROXY_FILE_SUBMIT_MAX_WAIT":      "1.5s",
				"MDPROXY_FILE_SUBMIT_CLIENT_WINDOW": "1h30m",
				"MDPROXY_FILE_SUBMIT_CLIENT_LIMIT":  "1",
			},
			want: map[string]limiter.Limit{
				"file_result": limitTestDefaults["file_result"],
				"hash_lookup": limitTestDefaults["hash_lookup"],
				"file_submit": {Rate: 2, MaxWait: 1500 * time.Millisecond, ClientLimit: 1, ClientWindow: 90 * time.Minute},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseLimits(tt.environ, limitTestRoutes, limitTestDefaults)
			if err != nil {
				t.Fatalf("parseLimits(%v) = %v, want no error", tt.environ, err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("parseLimits(%v) = %v, want %d routes", tt.environ, got, len(tt.want))
			}
			for route, want := range tt.want {
				if l, ok := got[route]; !ok || l != want {
					t.Errorf("parseLimits(%v)[%q] = %+v (present: %v), want %+v", tt.environ, route, l, ok, want)
				}
			}
		})
	}
}

func TestParseLimitsKeepsDefaults(t *testing.T) {
	before := limitTestDefaults["file_result"]
	if _, err := parseLimits(map[string]string{"MDPROXY_FILE_RESULT_RATE": "1"}, limitTestRoutes, limitTestDefaults); err != nil {
		t.Fatalf("parseLimits() = %v, want no error", err)
	}
	if got := limitTestDefaults["file_result"]; got != before {
		t.Errorf("limitTestDefaults[file_result] after parseLimits = %+v, want it untouched %+v", got, before)
	}
}

func TestParseLimitsErrors(t *testing.T) {
	tests := []struct {
		variable, value string
		want            string // in the message, after the variable and value
	}{
		{"MDPROXY_FILE_RESULT_RATE", "abc", "want a number of requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "1/s", "want a number of requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "-1", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "NaN", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "Inf", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "-Inf", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "1e-10", "from 0.00001 (one in 27.8 hours) to 1e9"},
		{"MDPROXY_FILE_RESULT_RATE", "0.0000099", "from 0.00001"},
		{"MDPROXY_FILE_RESULT_RATE", "2e9", "to 1e9"},
		{"MDPROXY_FILE_RESULT_RATE", "1_5", "want a number of requests per second"},
		{"MDPROXY_FILE_RESULT_RATE", "0x1p4", "want a number of requests per second"},
		{"MDPROXY_FILE_RESULT_BURST", "ten", "want a whole number of requests >= 0"},
		{"MDPROXY_FILE_RESULT_BURST", "1.5", "want a whole number of requests >= 0"},
		{"MDPROXY_FILE_RESULT_BURST", "-1", "whole number of requests >= 0"},
		{"MDPROXY_FILE_RESULT_BURST", "2147483648", "at most 2147483647"},
		{"MDPROXY_FILE_RESULT_MAX_WAIT", "25h", "at most 24h"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW", "721h", "at most 720h"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT", "2147483648", "at most 2147483647"},
		{"MDPROXY_FILE_RESULT_MAX_WAIT", "2", "want a duration with its unit"},
		{"MDPROXY_FILE_RESULT_MAX_WAIT", "soon", "want a duration with its unit"},
		{"MDPROXY_FILE_RESULT_MAX_WAIT", "-1s", "duration with its unit >= 0"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT", "many", "want a whole number of requests per window >= 0"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT", "-5", "requests per window >= 0"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW", "2", "want a duration with its unit"},
		{"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW", "-1m", "duration with its unit >= 0"},
		{"MDPROXY_FILE_SUBMIT_RATE", "NaN", "requests per second >= 0"},
		{"MDPROXY_FILE_SUBMIT_BURST", "-2", "whole number of requests >= 0"},
		{"MDPROXY_FILE_RESULT_DRY_RUN", "maybe", "want true or false"},
		{"MDPROXY_HASH_LOOKUP_DRY_RUN", "yes", "want true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.variable+"="+tt.value, func(t *testing.T) {
			environ := map[string]string{
				tt.variable: tt.value,
				// A good variable of another route does not hide the bad one.
				"MDPROXY_FILE_SUBMIT_CLIENT_LIMIT": "3",
			}
			got, err := parseLimits(environ, limitTestRoutes, limitTestDefaults)
			if err == nil {
				t.Fatalf("parseLimits(%s=%q) = %v, nil, want an error", tt.variable, tt.value, got)
			}
			var ee *envconf.Error
			if !errors.As(err, &ee) {
				t.Fatalf("parseLimits(%s=%q) error = %T %q, want an *envconf.Error", tt.variable, tt.value, err, err)
			}
			if ee.Var != tt.variable {
				t.Errorf("parseLimits(%s=%q) error Var = %q, want %q", tt.variable, tt.value, ee.Var, tt.variable)
			}
			if ee.Value != tt.value {
				t.Errorf("parseLimits(%s=%q) error Value = %q, want %q", tt.variable, tt.value, ee.Value, tt.value)
			}
			msg := err.Error()
			if wantPrefix := tt.variable + "=" + `"` + tt.value + `": `; !strings.HasPrefix(msg, wantPrefix) {
				t.Errorf("parseLimits(%s=%q) error = %q, want it to start with %q", tt.variable, tt.value, msg, wantPrefix)
			}
			if !strings.Contains(msg, tt.want) {
				t.Errorf("parseLimits(%s=%q) error = %q, want it to contain %q", tt.variable, tt.value, msg, tt.want)
			}
			if got != nil {
				t.Errorf("parseLimits(%s=%q) limits = %v, want nil with the error", tt.variable, tt.value, got)
			}
		})
	}
}

// TestParseLimitsAllErrors checks that every bad variable is named, those that do not
// parse and those out of range, of one route or of several, each once, in the order of
// the routes and of the settings.
func TestParseLimitsAllErrors(t *testing.T) {
	environ := map[string]string{
		"MDPROXY_FILE_RESULT_RATE":          "fast", // does not parse: not also out of range
		"MDPROXY_FILE_RESULT_BURST":         "-1",
		"MDPROXY_FILE_RESULT_MAX_WAIT":      "2s", // good
		"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW": "-1s",
		"MDPROXY_FILE_SUBMIT_CLIENT_LIMIT":  "x",
	}
	want := []string{
		"MDPROXY_FILE_RESULT_RATE", "MDPROXY_FILE_RESULT_BURST",
		"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW", "MDPROXY_FILE_SUBMIT_CLIENT_LIMIT",
	}
	got, err := parseLimits(environ, limitTestRoutes, limitTestDefaults)
	if err == nil {
		t.Fatalf("parseLimits(%v) = %v, nil; want an error naming %v", environ, got, want)
	}
	var errs envconf.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("parseLimits(%v) error = %T %q, want an envconf.Errors", environ, err, err)
	}
	var names []string
	for _, e := range errs {
		var ee *envconf.Error
		if !errors.As(e, &ee) {
			t.Fatalf("parseLimits(%v) error %q = %T, want an *envconf.Error", environ, e, e)
		}
		names = append(names, ee.Var)
		if !strings.HasPrefix(e.Error(), ee.Var+"="+`"`+environ[ee.Var]+`": want `) {
			t.Errorf("parseLimits(%v) error %q, want it to quote %s's value and say what it accepts", environ, e, ee.Var)
		}
	}
	if !slices.Equal(names, want) {
		t.Errorf("parseLimits(%v) error names %v, want %v, in that order", environ, names, want)
	}
	if msg := err.Error(); strings.Count(msg, "\n") != len(want)-1 {
		t.Errorf("parseLimits(%v) error = %q, want the %d errors one a line", environ, msg, len(want))
	}
}

// TestParseLimitsBuildsSet checks that what parseLimits accepts NewSet accepts too.
func TestParseLimitsBuildsSet(t *testing.T) {
	limits, err := parseLimits(map[string]string{"MDPROXY_FILE_RESULT_BURST": "0"}, limitTestRoutes, limitTestDefaults)
	if err != nil {
		t.Fatalf("parseLimits() = %v, want no error", err)
	}
	s, err := limiter.NewSet(limits, nil)
	if err != nil {
		t.Fatalf("NewSet(parseLimits()) = %v, want no error", err)
	}
	if got, want := s.Limit("file_result").Burst, 20; got != want {
		t.Errorf("Limit(file_result).Burst with BURST=0 and rate 20 = %d, want %d", got, want)
	}
	if l := s.Limiter("file_submit"); l != nil {
		t.Errorf("Limiter(file_submit) = %v, want nil (unlimited)", l)
	}
}

// TestExemptSetting: MDPROXY_<ROUTE>_EXEMPT is read into the route's limit, and a value
// that is neither prefixes nor apikey digests stops start-up naming the variable,
// without quoting the value (a raw apikey written by mistake stays out of the log).
func TestExemptSetting(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0f", 32)
	cfg, err := LoadConfig(map[string]string{"MDPROXY_UPSTREAM_URL": "http://127.0.0.1:8008",
		"MDPROXY_FILE_RESULT_EXEMPT": "10.0.0.0/8, " + digest})
	if err != nil {
		t.Fatalf("LoadConfig(a good MDPROXY_FILE_RESULT_EXEMPT) = %v", err)
	}
	if got := cfg.Limits["file_result"].Exempt; got != "10.0.0.0/8, "+digest {
		t.Errorf("file_result's Exempt = %q, want the variable's value", got)
	}
	for _, bad := range []string{"my-raw-apikey", "10.0.0.0/8,my-raw-apikey", "sha256:00", "10.0.0.300/8"} {
		_, err := LoadConfig(map[string]string{"MDPROXY_UPSTREAM_URL": "http://127.0.0.1:8008",
			"MDPROXY_HASH_LOOKUP_EXEMPT": bad})
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "MDPROXY_HASH_LOOKUP_EXEMPT") {
			t.Errorf("LoadConfig(MDPROXY_HASH_LOOKUP_EXEMPT=%q) = %v, want a *ConfigError naming the variable", bad, err)
			continue
		}
		if strings.Contains(err.Error(), "my-raw-apikey") {
			t.Errorf("LoadConfig(MDPROXY_HASH_LOOKUP_EXEMPT=%q) = %v: quotes the value", bad, err)
		}
	}
}
