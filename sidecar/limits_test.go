package sidecar

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
)

// writeLimits writes content to the file name in dir and returns its path.
func writeLimits(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// errorVars returns the variables that the *envconf.Errors of err name, in order.
func errorVars(t *testing.T, err error) []string {
	t.Helper()
	var errs envconf.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error %q (%T) holds no envconf.Errors", err, err)
	}
	var names []string
	for _, e := range errs {
		var ee *envconf.Error
		if errors.As(e, &ee) {
			names = append(names, ee.Var)
		}
	}
	return names
}

// TestLoadConfigAllErrors checks that every bad variable is named at once, one a line:
// values that do not parse, values out of range and bad route limits, each once.
func TestLoadConfigAllErrors(t *testing.T) {
	env := map[string]string{
		"MDPROXY_UPSTREAM_TIMEOUT":     "soon", // does not parse: not also "above 0"
		"MDPROXY_LIMIT_STATUS":         "500",
		"MDPROXY_CLIENT_KEYS_MAX":      "0",
		"MDPROXY_FILE_RESULT_RATE":     "-1",
		"MDPROXY_HASH_LOOKUP_MAX_WAIT": "5",
		"MDPROXY_IDLE_TIMEOUT":         "30s", // good
	}
	want := []string{
		"MDPROXY_UPSTREAM_TIMEOUT", "MDPROXY_LIMIT_STATUS", "MDPROXY_CLIENT_KEYS_MAX",
		"MDPROXY_FILE_RESULT_RATE", "MDPROXY_HASH_LOOKUP_MAX_WAIT",
	}
	_, err := LoadConfig(env)
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("LoadConfig(%v) = %v (%T), want a *ConfigError", env, err, err)
	}
	if got := errorVars(t, err); !slices.Equal(got, want) {
		t.Errorf("LoadConfig(%v) names %v, want %v", env, got, want)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("LoadConfig(%v) error = %q, want %d lines, one a variable", env, err, len(want))
	}
	for i, name := range want {
		if !strings.HasPrefix(lines[i], name+"=") || !strings.Contains(lines[i], ": want ") {
			t.Errorf("LoadConfig error line %d = %q, want %s, its value and what it accepts", i+1, lines[i], name)
		}
	}
}

// TestLoadConfigRanges checks that a value out of range, and one that does not parse,
// is answered with the range the variable accepts.
func TestLoadConfigRanges(t *testing.T) {
	for _, tc := range []struct {
		name, value, want string
	}{
		{"MDPROXY_CLIENT_KEYS_MAX", "0", "from 1 to 10000000"},
		{"MDPROXY_CLIENT_KEYS_MAX", "many", "from 1 to 10000000"},
		{"MDPROXY_LIMIT_STATUS", "500", "503 or 429"},
		{"MDPROXY_LIMIT_STATUS", "busy", "503 or 429"},
		{"MDPROXY_UPSTREAM_TIMEOUT", "0s", "above 0"},
		{"MDPROXY_UPSTREAM_TIMEOUT", "60", "above 0"},
		{"MDPROXY_BODY_IDLE_TIMEOUT", "-1s", "above 0"},
		{"MDPROXY_SHUTDOWN_DELAY", "-1s", ">= 0"},
		{"MDPROXY_SHUTDOWN_TIMEOUT", "x", ">= 0"},
		{"MDPROXY_LISTEN_ADDR", ":99999", "port 0 to 65535"},
		{"MDPROXY_FILE_RESULT_RATE", "-1", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_RATE", "fast", "requests per second >= 0"},
		{"MDPROXY_FILE_RESULT_BURST", "-1", "requests >= 0"},
		{"MDPROXY_FILE_RESULT_MAX_WAIT", "-1s", ">= 0"},
		{"MDPROXY_FILE_RESULT_CLIENT_LIMIT", "-1", ">= 0"},
		{"MDPROXY_FILE_RESULT_CLIENT_WINDOW", "-1s", ">= 0"},
		{"MDPROXY_FILE_RESULT_DRY_RUN", "maybe", "true or false"},
		{"MDPROXY_REDIS_URL", "http://redis:6379", "redis:// or rediss://"},
		{"MDPROXY_REDIS_URL", "redis://redis:6379/db", `invalid database number: "db"`},
		{"MDPROXY_REDIS_URL", "redis://:s3cret@redis:port/0", `invalid port ":port" after host`},
		{"MDPROXY_UPSTREAM_URL", "ftp://u:s3cret@core:8008", "http or https URL"},
		{"MDPROXY_UPSTREAM_URL", "http://u:s3cret@core:8008", "no user or password"},
		{"MDPROXY_REDIS_TIMEOUT", "0s", "above 0"},
		{"MDPROXY_REDIS_TIMEOUT", "50", "above 0"},
		{"MDPROXY_REPLICAS", "0", "from 1 up"},
		{"MDPROXY_REPLICAS", "two", "from 1 up"},
		{"MDPROXY_REPLICAS", "1001", "at most 1000"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			_, err := LoadConfig(map[string]string{tc.name: tc.value})
			if err == nil || !sidecartest.NamesVar(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("LoadConfig(%s=%q) = %v, want an error naming it and giving its range (%q)", tc.name, tc.value, err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("LoadConfig(%s=%q) = %v, want no password in the error", tc.name, tc.value, err)
			}
		})
	}
}

// TestLoadConfigLimitsFile checks the limits file at start: its variables take
// precedence over the environment's, the others fall back to the environment, then to
// the defaults.
func TestLoadConfigLimitsFile(t *testing.T) {
	path := writeLimits(t, t.TempDir(), "limits.env", `# mdproxy's limits
MDPROXY_FILE_RESULT_RATE=5

export MDPROXY_BATCH_STATUS_MAX_WAIT=1s
MDPROXY_HASH_LOOKUP_RATE="3"   # quoted, with a comment
MDPROXY_STAT_RATE=
`)
	c, err := LoadConfig(map[string]string{
		"MDPROXY_LIMITS_FILE":       path,
		"MDPROXY_FILE_RESULT_RATE":  "7", // the file's 5 wins
		"MDPROXY_FILE_RESULT_BURST": "9", // not in the file: kept
		"MDPROXY_STAT_RATE":         "4", // set empty in the file: the default, none
	})
	if err != nil {
		t.Fatalf("LoadConfig(limits file) = %v, want no error", err)
	}
	if c.LimitsFile != path {
		t.Errorf("LoadConfig().LimitsFile = %q, want %q", c.LimitsFile, path)
	}
	for route, want := range map[string]limiter.Limit{
		"file_result":  {Rate: 5, Burst: 9},
		"batch_status": {Rate: 2, Burst: 4, MaxWait: time.Second},
		"hash_lookup":  {Rate: 3, Burst: 20},
		"stat":         {},
	} {
		if got := c.Limits[route]; got != want {
			t.Errorf("LoadConfig(limits file).Limits[%s] = %+v, want %+v", route, got, want)
		}
	}
}

// TestLoadConfigLimitsFileBOM checks that a limits file that starts with a UTF-8 byte
// order mark, as Windows editors write one, is read as without it.
func TestLoadConfigLimitsFileBOM(t *testing.T) {
	path := writeLimits(t, t.TempDir(), "limits.env", "\ufeffMDPROXY_FILE_RESULT_RATE=5\r\nMDPROXY_FILE_RESULT_BURST=6\r\n")
	c, err := LoadConfig(map[string]string{"MDPROXY_LIMITS_FILE": path})
	if err != nil {
		t.Fatalf("LoadConfig(limits file with a BOM) = %v, want no error", err)
	}
	if got, want := c.Limits["file_result"], (limiter.Limit{Rate: 5, Burst: 6}); got != want {
		t.Errorf("LoadConfig(limits file with a BOM).Limits[file_result] = %+v, want %+v", got, want)
	}
}

// TestLoadConfigBadLimitsFile checks that a limits file that cannot be read, does not
// parse, holds a variable other than a route limit's or a bad value stops start-up
// with a *ConfigError naming the file and the variable.
func TestLoadConfigBadLimitsFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		wantVars      []string // named, in order; none: MDPROXY_LIMITS_FILE's value is named
	}{
		{"missing", "", nil},
		{"not KEY=VALUE", "MDPROXY_FILE_RESULT_RATE=\"10\nunterminated", nil},
		{"bad value", "MDPROXY_FILE_RESULT_RATE=fast\nMDPROXY_FILE_RESULT_BURST=-2\n",
			[]string{"MDPROXY_FILE_RESULT_RATE", "MDPROXY_FILE_RESULT_BURST"}},
		{"not a limit", "MDPROXY_LISTEN_ADDR=:1\nMDPROXY_FILE_RESULT_RATE=x\nMDPROXY_FILE_RESUL_RATE=1\nPATH=/bin\n",
			[]string{"MDPROXY_FILE_RESUL_RATE", "MDPROXY_LISTEN_ADDR", "PATH", "MDPROXY_FILE_RESULT_RATE"}},
		{"a placeholder", "MDPROXY_FILE_RESULT_RATE=${HOME}\nexport MDPROXY_STAT_RATE=\"$UNSET\"\n# $comment\nMDPROXY_FILE_RESULT_BURST=5 # was $X\n",
			[]string{"MDPROXY_FILE_RESULT_RATE", "MDPROXY_STAT_RATE"}},
		{"set twice", "MDPROXY_FILE_RESULT_RATE=abc\nMDPROXY_FILE_RESULT_BURST=5\nMDPROXY_FILE_RESULT_RATE=5\n",
			[]string{"MDPROXY_FILE_RESULT_RATE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".env")
			if tc.name != "missing" {
				writeLimits(t, dir, filepath.Base(path), tc.content)
			}
			_, err := LoadConfig(map[string]string{"MDPROXY_LIMITS_FILE": path})
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("LoadConfig(%s file) = %v (%T), want a *ConfigError", tc.name, err, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, path) {
				t.Errorf("LoadConfig(%s file) error = %q, want it to name the file %s", tc.name, msg, path)
			}
			if tc.wantVars == nil {
				if tc.name == "missing" && !sidecartest.NamesVar(msg, "MDPROXY_LIMITS_FILE") {
					t.Errorf("LoadConfig(missing file) error = %q, want it to name MDPROXY_LIMITS_FILE", msg)
				}
				return
			}
			if got := errorVars(t, err); !slices.Equal(got, tc.wantVars) {
				t.Errorf("LoadConfig(%s file) names %v, want %v", tc.name, got, tc.wantVars)
			}
			for _, line := range strings.Split(msg, "\n") {
				if !strings.HasPrefix(line, "limits file "+path+": MDPROXY_") && !strings.HasPrefix(line, "limits file "+path+": PATH") {
					t.Errorf("LoadConfig(%s file) error line %q, want it to start with the file, then the variable", tc.name, line)
				}
			}
		})
	}
	// A bad variable of the environment that the file does not set is named as such,
	// without the file.
	path := writeLimits(t, dir, "good.env", "MDPROXY_FILE_RESULT_RATE=1\n")
	_, err := LoadConfig(map[string]string{"MDPROXY_LIMITS_FILE": path, "MDPROXY_STAT_RATE": "-1"})
	if err == nil || !strings.HasPrefix(err.Error(), `MDPROXY_STAT_RATE="-1": want `) {
		t.Errorf("LoadConfig(MDPROXY_STAT_RATE=-1, a good file) = %v, want the environment's variable named alone", err)
	}
}

// TestIneffective checks which settings are reported as having no effect.
func TestIneffective(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // the variables named, in order
	}{
		{"defaults", nil, nil},
		{"limits that work", map[string]string{
			"MDPROXY_STAT_RATE": "1", "MDPROXY_STAT_BURST": "2", "MDPROXY_STAT_MAX_WAIT": "1s",
			"MDPROXY_STAT_CLIENT_LIMIT": "3", "MDPROXY_STAT_CLIENT_WINDOW": "1m", "MDPROXY_CLIENT_KEYS_MAX": "10",
			"MDPROXY_CLIENT_IPV6_PREFIX": "56",
		}, nil},
		{"burst and wait without a rate", map[string]string{
			"MDPROXY_STAT_BURST": "5", "MDPROXY_STAT_MAX_WAIT": "1s", "MDPROXY_VERSION_MAX_WAIT": "2s",
		}, []string{"MDPROXY_VERSION_MAX_WAIT", "MDPROXY_STAT_BURST", "MDPROXY_STAT_MAX_WAIT"}},
		{"a default rate set to 0", map[string]string{
			"MDPROXY_FILE_RESULT_RATE": "0", "MDPROXY_FILE_RESULT_MAX_WAIT": "2s",
		}, []string{"MDPROXY_FILE_RESULT_MAX_WAIT"}},
		{"window without a client limit", map[string]string{
			"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "1m",
		}, []string{"MDPROXY_FILE_RESULT_CLIENT_WINDOW"}},
		{"keys bound without a share", map[string]string{
			"MDPROXY_CLIENT_KEYS_MAX": "10",
		}, []string{"MDPROXY_CLIENT_KEYS_MAX"}},
		{"client prefixes without a share", map[string]string{
			"MDPROXY_CLIENT_IPV6_PREFIX": "56", "MDPROXY_CLIENT_IPV4_PREFIX": "24",
		}, []string{"MDPROXY_CLIENT_IPV6_PREFIX", "MDPROXY_CLIENT_IPV4_PREFIX"}},
		{"dry run of an unlimited route", map[string]string{
			"MDPROXY_VERSION_DRY_RUN": "true", "MDPROXY_FILE_RESULT_DRY_RUN": "true",
		}, []string{"MDPROXY_VERSION_DRY_RUN"}},
		{"Redis settings without a Redis", map[string]string{
			"MDPROXY_REPLICAS": "2", "MDPROXY_REDIS_PREFIX": "x:", "MDPROXY_REDIS_TIMEOUT": "1s",
		}, []string{"MDPROXY_REDIS_PREFIX", "MDPROXY_REDIS_TIMEOUT", "MDPROXY_REPLICAS"}},
		{"Redis settings with a Redis", map[string]string{
			"MDPROXY_REPLICAS": "2", "MDPROXY_REDIS_URL": "redis://127.0.0.1:1/0",
		}, nil},
		{"set empty is unset", map[string]string{
			"MDPROXY_STAT_BURST": "", "MDPROXY_CLIENT_KEYS_MAX": "",
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(tc.env)
			if err != nil {
				t.Fatalf("LoadConfig(%v) = %v", tc.env, err)
			}
			var got []string
			for _, s := range c.noEffect {
				name, why, _ := strings.Cut(s, " ")
				if why == "" {
					t.Errorf("no-effect entry %q says not why", s)
				}
				got = append(got, name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("LoadConfig(%v) settings without effect = %q, want %v", tc.env, c.noEffect, tc.want)
			}
		})
	}
}
