package sidecar

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/bridge"
	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/proxy"
)

func TestLoadConfigDefaults(t *testing.T) {
	// The map is the only source: a variable of the process environment is not read.
	t.Setenv("MDPROXY_LISTEN_ADDR", "192.0.2.1:1")
	t.Setenv("MDPROXY_FILE_RESULT_RATE", "1000")

	c, err := LoadConfig(map[string]string{})
	if err != nil {
		t.Fatalf("LoadConfig(empty) error = %v, want nil", err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"ListenAddr", c.ListenAddr, ":8009"},
		{"AdminAddr", c.AdminAddr, ":9009"},
		{"UpstreamURL", c.UpstreamURL, "http://127.0.0.1:8008"},
		{"upstream", c.upstream.String(), "http://127.0.0.1:8008"},
		{"LimitStatus", c.LimitStatus, 503},
		{"len(TrustedProxies)", len(c.TrustedProxies), 0},
		{"len(trusted)", len(c.trusted), 0},
		{"UpstreamTimeout", c.UpstreamTimeout, 60 * time.Second},
		{"DialTimeout", c.DialTimeout, 5 * time.Second},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout, 10 * time.Second},
		{"IdleTimeout", c.IdleTimeout, 120 * time.Second},
		{"ShutdownDelay", c.ShutdownDelay, 5 * time.Second},
		{"ShutdownTimeout", c.ShutdownTimeout, 30 * time.Second},
		{"LogLevel", c.LogLevel, "info"},
		{"level", c.level, slog.LevelInfo},
		{"LimitsFileSettle", c.LimitsFileSettle, time.Second},
		{"ClientIPv6Prefix", c.ClientIPv6Prefix, 64},
		{"ClientIPv4Prefix", c.ClientIPv4Prefix, 32},
		{"BridgePendingMaxBytes", c.BridgePendingMaxBytes, int64(bridge.DefaultMaxPendingBytes)},
		{"len(Limits)", len(c.Limits), len(proxy.RouteNames())},
	} {
		if tc.got != tc.want {
			t.Errorf("LoadConfig(empty).%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}

	// The documented limits: file_result 10/s burst 20, batch_status 2/s burst 4,
	// hash_lookup 10/s burst 20, no wait, no per-client share.
	documented := map[string]limiter.Limit{
		"file_result":  {Rate: 10, Burst: 20},
		"batch_status": {Rate: 2, Burst: 4},
		"hash_lookup":  {Rate: 10, Burst: 20},
	}
	for name, want := range documented {
		if got := DefaultLimits[name]; got != want {
			t.Errorf("DefaultLimits[%q] = %+v, want %+v", name, got, want)
		}
	}
	for _, name := range proxy.RouteNames() {
		got, ok := c.Limits[name]
		if !ok {
			t.Errorf("LoadConfig(empty).Limits has no route %q", name)
			continue
		}
		if want := documented[name]; got != want {
			t.Errorf("LoadConfig(empty).Limits[%q] = %+v, want %+v", name, got, want)
		}
	}
	for _, name := range []string{"submit", proxy.RouteOther, "sanitized_download", "readyz"} {
		if !c.Limits[name].Unlimited() {
			t.Errorf("LoadConfig(empty).Limits[%q] = %+v, want unlimited", name, c.Limits[name])
		}
	}
	for _, name := range []string{"file_result", "batch_status", "hash_lookup"} {
		if c.Limits[name].Unlimited() {
			t.Errorf("LoadConfig(empty).Limits[%q] is unlimited, want limited by default", name)
		}
	}
}

func TestLoadConfigBadValue(t *testing.T) {
	type badCase struct {
		env     map[string]string
		wantVar string
	}
	one := func(name, value string) badCase {
		return badCase{map[string]string{name: value}, name}
	}
	cases := []badCase{
		one("MDPROXY_LISTEN_ADDR", ""),
		one("MDPROXY_ADMIN_ADDR", ""),
		one("MDPROXY_ADMIN_ADDR", ":8009"), // the default listen address
		{map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:7000", "MDPROXY_ADMIN_ADDR": "127.0.0.1:7000"}, "MDPROXY_ADMIN_ADDR"},
		one("MDPROXY_UPSTREAM_URL", "ftp://x"),
		one("MDPROXY_UPSTREAM_URL", "not a url"),
		one("MDPROXY_UPSTREAM_URL", "http://"),
		one("MDPROXY_UPSTREAM_URL", "127.0.0.1:8008"),
		one("MDPROXY_UPSTREAM_URL", ""),
		one("MDPROXY_UPSTREAM_URL", "http://127.0.0.1:99999"),
		one("MDPROXY_UPSTREAM_URL", "http://127.0.0.1:0"),
		one("MDPROXY_UPSTREAM_URL", "http://127.0.0.1:"),
		one("MDPROXY_UPSTREAM_URL", "http://127.0.0.1:x8"),
		one("MDPROXY_UPSTREAM_URL", "http://:8008"),
		one("MDPROXY_UPSTREAM_URL", "http://core/a b"),
		one("MDPROXY_UPSTREAM_URL", "http://user@core:8008"),
		{map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:7000", "MDPROXY_ADMIN_ADDR": ":7000"}, "MDPROXY_ADMIN_ADDR"},
		{map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:7000", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:7000"}, "MDPROXY_BRIDGE_LISTEN_ADDR"},
		{map[string]string{"MDPROXY_ADMIN_ADDR": "127.0.0.1:7001", "MDPROXY_BRIDGE_LISTEN_ADDR": "0.0.0.0:7001"}, "MDPROXY_BRIDGE_LISTEN_ADDR"},
		{map[string]string{"MDPROXY_ADMIN_ADDR": "127.0.0.1:7001", "MDPROXY_BRIDGE_LISTEN_ADDR": "[::0]:07001"}, "MDPROXY_BRIDGE_LISTEN_ADDR"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h:99999"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h/#f"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h:0"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h/a b"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h/a|b"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://h/?"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://user:s3cret@127.0.0.1:9010"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://$(POD_IP):9010"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://fd00::5:9010"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		one("MDPROXY_UPSTREAM_URL", "http://$(CORE_HOST):8008"),
		one("MDPROXY_UPSTREAM_URL", "http://core(1):8008"),
		one("MDPROXY_UPSTREAM_URL", "http://a_b"),
		one("MDPROXY_UPSTREAM_URL", "http://-a.b"),
		one("MDPROXY_UPSTREAM_URL", "http://a..b"),
		one("MDPROXY_UPSTREAM_URL", "http://1.2.3.4.5"),
		one("MDPROXY_UPSTREAM_URL", "http://256.1.1.1"),
		one("MDPROXY_UPSTREAM_URL", "http://0x7f.1"),
		one("MDPROXY_UPSTREAM_URL", "http://127.1"),
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://a..b:9010"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		{map[string]string{"MDPROXY_BRIDGE_CALLBACK_URL": "http://a_b:9010"}, "MDPROXY_BRIDGE_CALLBACK_URL"},
		one("MDPROXY_REDIS_URL", "redis://$(REDIS_HOST):6379"),
		one("MDPROXY_REDIS_URL", "redis://:6379"),
		one("MDPROXY_LIMIT_STATUS", "500"),
		one("MDPROXY_LIMIT_STATUS", "200"),
		one("MDPROXY_LIMIT_STATUS", "abc"),
		one("MDPROXY_TRUSTED_PROXIES", "foo"),
		one("MDPROXY_TRUSTED_PROXIES", "10.0.0.0/33"),
		one("MDPROXY_TRUSTED_PROXIES", "10.0.0.0/8, foo"),
		one("MDPROXY_LOG_LEVEL", "loud"),
	}
	for _, name := range []string{"MDPROXY_UPSTREAM_TIMEOUT", "MDPROXY_UPSTREAM_DIAL_TIMEOUT", "MDPROXY_READ_HEADER_TIMEOUT", "MDPROXY_IDLE_TIMEOUT", "MDPROXY_BODY_IDLE_TIMEOUT", "MDPROXY_REDIS_TIMEOUT", "MDPROXY_BRIDGE_REFRESH"} {
		// Beyond a day, a product (twice MDPROXY_BODY_IDLE_TIMEOUT) overflowed: 2000000h
		// broke every upload over a megabyte; 9999999h does not parse.
		for _, v := range []string{"0s", "0", "10", "-1s", "x", "24h0m1s", "2000000h", "9999999h"} {
			cases = append(cases, one(name, v))
		}
	}
	for _, v := range []string{"-1s", "x", "30", "25h"} {
		cases = append(cases, one("MDPROXY_SHUTDOWN_TIMEOUT", v))
	}
	for _, v := range []string{"0s", "9ms", "1m0.001s", "-1s", "x", "1"} {
		cases = append(cases, one("MDPROXY_LIMITS_FILE_SETTLE", v))
	}
	for _, v := range []string{"0", "129", "-64", "/64", "64.5", "x"} {
		cases = append(cases, one("MDPROXY_CLIENT_IPV6_PREFIX", v))
	}
	for _, v := range []string{"0", "33", "-1", "/24", "x"} {
		cases = append(cases, one("MDPROXY_CLIENT_IPV4_PREFIX", v))
	}
	for _, v := range []string{"-1s", "-1ns", "x", "5", "99999h"} {
		cases = append(cases, one("MDPROXY_SHUTDOWN_DELAY", v))
	}
	for _, v := range []string{"0", "1048575", "-1", "32MiB", "1e6", "x"} {
		cases = append(cases, one("MDPROXY_BRIDGE_PENDING_MAX_BYTES", v))
	}
	for _, name := range []string{"MDPROXY_BRIDGE_PENDING_TTL", "MDPROXY_STORE_TTL"} {
		for _, v := range []string{"0s", "-1h", "8761h"} {
			cases = append(cases, one(name, v))
		}
	}
	routes := proxy.RouteNames()
	if len(routes) < 2 || !slices.Contains(routes, "file_result") || !slices.Contains(routes, proxy.RouteOther) {
		t.Fatalf("proxy.RouteNames() = %v, want file_result, ..., other", routes)
	}
	for _, route := range routes {
		for _, bad := range []struct{ setting, value string }{
			{"RATE", "abc"}, {"RATE", "-1"}, {"RATE", "NaN"}, {"RATE", "+Inf"},
			{"BURST", "-1"}, {"BURST", "1.5"},
			{"MAX_WAIT", "5"}, {"MAX_WAIT", "-1s"},
			{"CLIENT_LIMIT", "-3"}, {"CLIENT_LIMIT", "x"},
			{"CLIENT_WINDOW", "x"}, {"CLIENT_WINDOW", "-1s"},
		} {
			cases = append(cases, one(routeVar(route, bad.setting), bad.value))
		}
	}

	for _, tc := range cases {
		value := tc.env[tc.wantVar]
		t.Run(fmt.Sprintf("%s=%q", tc.wantVar, value), func(t *testing.T) {
			c, err := LoadConfig(tc.env)
			if err == nil {
				t.Fatalf("LoadConfig(%v) = {ListenAddr:%q AdminAddr:%q UpstreamURL:%q ...}, nil; want an error naming %s",
					tc.env, c.ListenAddr, c.AdminAddr, c.UpstreamURL, tc.wantVar)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("LoadConfig(%v) error = %v (%T), want a *ConfigError", tc.env, err, err)
			}
			msg := err.Error()
			if !sidecartest.NamesVar(msg, tc.wantVar) {
				t.Errorf("LoadConfig(%v) error = %q, want it to name %s", tc.env, msg, tc.wantVar)
			}
			quoted := value
			if u, err := url.Parse(value); err == nil && u.User != nil {
				if pw, ok := u.User.Password(); ok {
					quoted = u.Redacted() // a URL's password is never shown
					if strings.Contains(msg, pw) {
						t.Errorf("LoadConfig(%v) error = %q shows the password", tc.env, msg)
					}
				}
			}
			if !strings.Contains(msg, strconv.Quote(quoted)) {
				t.Errorf("LoadConfig(%v) error = %q, want it to quote the bad value %q", tc.env, msg, quoted)
			}
			if !strings.Contains(msg, "want") {
				t.Errorf("LoadConfig(%v) error = %q, want it to say what %s accepts", tc.env, msg, tc.wantVar)
			}
		})
	}
}

func TestLoadConfigValidValues(t *testing.T) {
	env := map[string]string{
		"MDPROXY_LISTEN_ADDR":           "127.0.0.1:18009",
		"MDPROXY_ADMIN_ADDR":            "127.0.0.1:19009",
		"MDPROXY_UPSTREAM_URL":          "https://core.example:8443/base",
		"MDPROXY_LIMIT_STATUS":          "429",
		"MDPROXY_TRUSTED_PROXIES":       "10.0.0.0/8, 192.0.2.7, ::1",
		"MDPROXY_UPSTREAM_TIMEOUT":      "90s",
		"MDPROXY_UPSTREAM_DIAL_TIMEOUT": "2s",
		"MDPROXY_READ_HEADER_TIMEOUT":   "3s",
		"MDPROXY_IDLE_TIMEOUT":          "4m",
		"MDPROXY_SHUTDOWN_TIMEOUT":      "0s", // 0 cuts in-flight requests at once: allowed
		"MDPROXY_SHUTDOWN_DELAY":        "0s", // 0 closes the listener at once: allowed
		"MDPROXY_LOG_LEVEL":             "debug",
		"MDPROXY_LIMITS_FILE_SETTLE":    "10ms",
		"MDPROXY_CLIENT_IPV6_PREFIX":    "128",
		"MDPROXY_CLIENT_IPV4_PREFIX":    "24",

		"MDPROXY_FILE_RESULT_RATE":          "0.5",
		"MDPROXY_FILE_RESULT_BURST":         "3",
		"MDPROXY_FILE_RESULT_MAX_WAIT":      "250ms",
		"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT":  "5",
		"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW": "1m",
		"MDPROXY_BATCH_STATUS_RATE":         "0", // lifts the default limit
		"MDPROXY_SUBMIT_MAX_WAIT":           "1s",
		"MDPROXY_OTHER_RATE":                "100",
		"MDPROXY_UNKNOWN_SETTING":           "ignored",
	}
	c, err := LoadConfig(env)
	if err != nil {
		t.Fatalf("LoadConfig(%v) error = %v, want nil", env, err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"ListenAddr", c.ListenAddr, "127.0.0.1:18009"},
		{"AdminAddr", c.AdminAddr, "127.0.0.1:19009"},
		{"upstream", c.upstream.String(), "https://core.example:8443/base"},
		{"LimitStatus", c.LimitStatus, 429},
		{"UpstreamTimeout", c.UpstreamTimeout, 90 * time.Second},
		{"DialTimeout", c.DialTimeout, 2 * time.Second},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout, 3 * time.Second},
		{"IdleTimeout", c.IdleTimeout, 4 * time.Minute},
		{"ShutdownTimeout", c.ShutdownTimeout, time.Duration(0)},
		{"ShutdownDelay", c.ShutdownDelay, time.Duration(0)},
		{"level", c.level, slog.LevelDebug},
		{"LimitsFileSettle", c.LimitsFileSettle, 10 * time.Millisecond},
		{"ClientIPv6Prefix", c.ClientIPv6Prefix, 128},
		{"ClientIPv4Prefix", c.ClientIPv4Prefix, 24},
		{"trusted", fmt.Sprint(c.trusted), "[10.0.0.0/8 192.0.2.7/32 ::1/128]"},
	} {
		if tc.got != tc.want {
			t.Errorf("LoadConfig(valid).%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	for route, want := range map[string]limiter.Limit{
		"file_result":  {Rate: 0.5, Burst: 3, MaxWait: 250 * time.Millisecond},
		"hash_lookup":  {Rate: 10, Burst: 20, ClientLimit: 5, ClientWindow: time.Minute},
		"batch_status": {Rate: 0, Burst: 4},
		"submit":       {MaxWait: time.Second},
		"other":        {Rate: 100},
		"version":      {},
	} {
		if got := c.Limits[route]; got != want {
			t.Errorf("LoadConfig(valid).Limits[%q] = %+v, want %+v", route, got, want)
		}
	}
	if !c.Limits["batch_status"].Unlimited() {
		t.Errorf("LoadConfig(MDPROXY_BATCH_STATUS_RATE=0).Limits[batch_status] = %+v, want unlimited", c.Limits["batch_status"])
	}
	// Loading must not change the package's defaults.
	if got := DefaultLimits["file_result"]; got != (limiter.Limit{Rate: 10, Burst: 20}) {
		t.Errorf("after LoadConfig, DefaultLimits[file_result] = %+v, want {Rate:10 Burst:20}", got)
	}
}

// TestLoadConfigEveryRouteVariable checks that each route of the table reads its own
// variables, and only them.
func TestLoadConfigEveryRouteVariable(t *testing.T) {
	for i, route := range proxy.RouteNames() {
		rate := 0.5 + float64(i)
		env := map[string]string{
			routeVar(route, "RATE"):     strconv.FormatFloat(rate, 'f', -1, 64),
			routeVar(route, "BURST"):    "3",
			routeVar(route, "MAX_WAIT"): "250ms",
		}
		c, err := LoadConfig(env)
		if err != nil {
			t.Errorf("LoadConfig(%v) error = %v, want nil", env, err)
			continue
		}
		want := limiter.Limit{Rate: rate, Burst: 3, MaxWait: 250 * time.Millisecond}
		if got := c.Limits[route]; got != want {
			t.Errorf("LoadConfig(%v).Limits[%q] = %+v, want %+v", env, route, got, want)
		}
		for _, other := range proxy.RouteNames() {
			if other != route && c.Limits[other] != DefaultLimits[other] {
				t.Errorf("LoadConfig(%v).Limits[%q] = %+v, want its default %+v", env, other, c.Limits[other], DefaultLimits[other])
			}
		}
	}
}

func TestLoadConfigTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []netip.Prefix
	}{
		{"", nil},
		{"10.0.0.0/8, 192.0.2.7, ::1", []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"), netip.MustParsePrefix("::1/128"),
		}},
		{"10.1.2.3/8", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{" , 2001:db8::/32 ,", []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}},
		// IPv4-mapped, as peers' addresses are read: IPv4.
		{"::ffff:10.0.0.0/104, ::ffff:192.0.2.7", []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
		}},
	} {
		env := map[string]string{"MDPROXY_TRUSTED_PROXIES": tc.value}
		c, err := LoadConfig(env)
		if err != nil {
			t.Errorf("LoadConfig(%v) error = %v, want nil", env, err)
			continue
		}
		if !slices.Equal(c.trusted, tc.want) {
			t.Errorf("LoadConfig(%v).trusted = %v, want %v", env, c.trusted, tc.want)
		}
	}
}

// TestLoadConfigPortZero: port 0 gives each listener a free port of its own, so the
// same address with port 0 for both is not the same listener (tests rely on it).
func TestLoadConfigPortZero(t *testing.T) {
	env := map[string]string{"MDPROXY_LISTEN_ADDR": "127.0.0.1:0", "MDPROXY_ADMIN_ADDR": "127.0.0.1:0", "MDPROXY_BRIDGE_LISTEN_ADDR": "127.0.0.1:0"}
	c, err := LoadConfig(env)
	if err != nil {
		t.Fatalf("LoadConfig(%v) error = %v, want nil", env, err)
	}
	if c.ListenAddr != "127.0.0.1:0" || c.AdminAddr != "127.0.0.1:0" {
		t.Errorf("LoadConfig(%v) = ListenAddr %q, AdminAddr %q; want both 127.0.0.1:0", env, c.ListenAddr, c.AdminAddr)
	}
}

// TestUnknownVariables: a variable spelt like mdproxy's, in any case, that it does not
// read is unknown, and named with its nearest known variable; Kubernetes' variables of
// a Service named mdproxy are not.
func TestUnknownVariables(t *testing.T) {
	environ := map[string]string{
		"MDPROXY_FILE_RESUTL_RATE": "5", "MDPROXY_FOO": "x", "MDPROXY_FILE_RESULT_RATE": "5",
		"MDPROXY_LISTEN_ADDR": ":1", "MDPROXY_OTHER_CLIENT_WINDOW": "1s", "HOME": "/root",
		"mdproxy_file_result_rate": "1", "MDPROXY_FILE_RESULT_RAT": "1",
		"MDPROXY_PORT": "tcp://10.0.0.1:8009", "MDPROXY_PORT_8009_TCP": "tcp://10.0.0.1:8009",
		"MDPROXY_PORT_8009_TCP_PROTO": "tcp", "MDPROXY_PORT_8009_TCP_PORT": "8009",
		"MDPROXY_PORT_8009_TCP_ADDR": "10.0.0.1", "MDPROXY_SERVICE_HOST": "10.0.0.1",
		"MDPROXY_SERVICE_PORT": "8009", "MDPROXY_SERVICE_PORT_ADMIN": "9009",
	}
	got := unknownVariables(environ)
	want := []string{"MDPROXY_FILE_RESULT_RAT", "MDPROXY_FILE_RESUTL_RATE", "MDPROXY_FOO", "mdproxy_file_result_rate"}
	if !slices.Equal(got, want) {
		t.Errorf("unknownVariables(%v) = %v, want %v", environ, got, want)
	}
	for name, want := range map[string]string{
		"MDPROXY_FILE_RESULT_RAT":  "MDPROXY_FILE_RESULT_RATE",
		"MDPROXY_FILE_RESUTL_RATE": "MDPROXY_FILE_RESULT_RATE",
		"mdproxy_file_result_rate": "MDPROXY_FILE_RESULT_RATE",
		"MDPROXY_UPSTREAM_UR":      "MDPROXY_UPSTREAM_URL",
		"MDPROXY_FOO":              "",
	} {
		if got := nearestVariable(name); got != want {
			t.Errorf("nearestVariable(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestListenAddressValidated(t *testing.T) {
	for _, v := range []string{"nope", ":99999", "127.0.0.1", ":-1", "host:port"} {
		_, err := LoadConfig(map[string]string{"MDPROXY_LISTEN_ADDR": v})
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "MDPROXY_LISTEN_ADDR") {
			t.Errorf("LoadConfig(MDPROXY_LISTEN_ADDR=%q) = %v, want a ConfigError naming it", v, err)
		}
	}
}

// TestLoadConfigClientKeysMax checks MDPROXY_CLIENT_KEYS_MAX: its default, a valid
// value, and the rejection of what is not a count of keys above 0, naming the variable,
// the value and the range.
func TestLoadConfigClientKeysMax(t *testing.T) {
	const name = "MDPROXY_CLIENT_KEYS_MAX"
	for _, tc := range []struct {
		value string // "" leaves the variable unset
		want  int
	}{
		{"", 100000},
		{"1", 1},
		{"2500", 2500},
		{"10000000", 10000000},
	} {
		env := map[string]string{}
		if tc.value != "" {
			env[name] = tc.value
		}
		c, err := LoadConfig(env)
		if err != nil {
			t.Errorf("LoadConfig(%v) error = %v, want nil", env, err)
			continue
		}
		if c.ClientKeysMax != tc.want {
			t.Errorf("LoadConfig(%v).ClientKeysMax = %d, want %d", env, c.ClientKeysMax, tc.want)
		}
	}
	for _, v := range []string{"0", "-1", "x", "1.5", "1e5", "10000001"} {
		env := map[string]string{name: v}
		_, err := LoadConfig(env)
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("LoadConfig(%v) error = %v (%T), want a *ConfigError", env, err, err)
			continue
		}
		msg := err.Error()
		if !sidecartest.NamesVar(msg, name) || !strings.Contains(msg, strconv.Quote(v)) || !strings.Contains(msg, "want") {
			t.Errorf("LoadConfig(%v) error = %q, want it to name %s, quote %q and say what it accepts", env, msg, name, v)
		}
		// Whether it does not parse or is out of range, the message gives the range.
		if !strings.Contains(msg, "from 1 to 10000000") {
			t.Errorf("LoadConfig(%v) error = %q, want it to give the range (from 1 to 10000000)", env, msg)
		}
	}
}

// TestSettingsCoverConfig: the table of settings (--help, docs/configuration.md)
// lists every variable of Config once, with Config's default, and every setting of a
// route's limit.
func TestSettingsCoverConfig(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Settings() {
		if seen[s.Name] {
			t.Errorf("Settings lists %s twice", s.Name)
		}
		seen[s.Name] = true
	}
	for _, name := range envconf.Names[Config](EnvPrefix) {
		if !seen[name] {
			t.Errorf("Settings leaves out %s", name)
		}
	}
	for _, st := range limitSettings {
		if !seen[limitVarName("<ROUTE>", st)] {
			t.Errorf("Settings leaves out the family %s", limitVarName("<ROUTE>", st))
		}
	}
	c, err := LoadConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Settings() {
		if s.Name == EnvPrefix+"LIMIT_STATUS" && s.Default != strconv.Itoa(c.LimitStatus) {
			t.Errorf("Settings: %s default %q, want %d", s.Name, s.Default, c.LimitStatus)
		}
	}
}
