package coresim

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

func TestLoadConfigDefaults(t *testing.T) {
	got, err := LoadConfig(nil)
	if err != nil {
		t.Fatalf("LoadConfig(nil) = %v, want no error", err)
	}
	want := Config{
		ListenAddr: "127.0.0.1:8008", AdminAddr: "127.0.0.1:9008",
		Cores: 8, Speedup: 1, Tick: 5 * time.Millisecond, QueueSize: 4000, ReadyOccupancy: 0.9,
		Engines:        []string{"AhnLab", "Avira", "Bitdefender", "ESET", "K7", "Quick Heal", "Vir.IT Explorer"},
		ScanCostObject: 83 * time.Millisecond, ScanCostMiB: 600 * time.Millisecond,
		PollCostBase: 60 * time.Millisecond, PollCostEntry: 15 * time.Microsecond,
		BatchCostFile: 2 * time.Millisecond, RejectCost: 400 * time.Microsecond,
		APIWorkers: 4, RequestLatency: 200 * time.Millisecond,
		FetchBurst: 5, FetchWait: 2 * time.Second,
		CallbackRetries: 3, CallbackDelay: time.Second, CallbackIncrease: time.Second,
		CallbackTimeout: 10 * time.Second, CallbackWorkers: 16,
		Retention: 24 * time.Hour, User: "admin", Password: "admin",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LoadConfig(nil) = %+v, want %+v", got, want)
	}
	if d := DefaultConfig(); !reflect.DeepEqual(d, want) {
		t.Errorf("DefaultConfig() = %+v, want %+v", d, want)
	}
}

func TestLoadConfigValues(t *testing.T) {
	for _, tc := range []struct {
		environ map[string]string
		check   func(Config) bool
		want    string
	}{
		{map[string]string{"CORESIM_ENGINES": " A , B C"}, func(c Config) bool { return slices.Equal(c.Engines, []string{"A", "B C"}) }, "Engines [A, B C]"},
		{map[string]string{"CORESIM_SPEEDUP": "0.5", "CORESIM_CORES": "2"}, func(c Config) bool { return c.Speedup == 0.5 && c.Cores == 2 }, "Speedup 0.5, Cores 2"},
		{map[string]string{"CORESIM_FETCH_LIMIT": "0.5", "CORESIM_FETCH_BURST": "3", "CORESIM_FETCH_WAIT": "0s"}, func(c Config) bool { return c.FetchLimit == 0.5 && c.FetchBurst == 3 && c.FetchWait == 0 }, "FetchLimit 0.5, FetchBurst 3, FetchWait 0"},
		{map[string]string{"CORESIM_ADMIN_ADDR": ""}, func(c Config) bool { return c.AdminAddr == "" }, `AdminAddr "" (no admin listener)`},
		{map[string]string{"CORESIM_SCAN_COST_MIB": "0s"}, func(c Config) bool { return c.ScanCostMiB == 0 && c.ScanCostObject == 83*time.Millisecond }, "ScanCostMiB 0"},
		{map[string]string{"CORESIM_CALLBACK_RETRIES": "0", "CORESIM_CALLBACK_DELAY": "0s"}, func(c Config) bool { return c.CallbackRetries == 0 && c.CallbackDelay == 0 }, "no retries, no delay"},
		{map[string]string{"CORESIM_QUEUE_SIZE": "1", "CORESIM_READY_OCCUPANCY": "0"}, func(c Config) bool { return c.QueueSize == 1 && c.ReadyOccupancy == 0 }, "QueueSize 1, ReadyOccupancy 0"},
		{map[string]string{"CORESIM_RETENTION": "90m", "CORESIM_TICK": "250us"}, func(c Config) bool { return c.Retention == 90*time.Minute && c.Tick == 250*time.Microsecond }, "Retention 90m, Tick 250µs"},
		{map[string]string{"CORESIM_APIKEY": "k", "CORESIM_TEMP_DIR": "/tmp/x"}, func(c Config) bool { return c.APIKey == "k" && c.TempDir == "/tmp/x" }, "APIKey k, TempDir /tmp/x"},
	} {
		got, err := LoadConfig(tc.environ)
		if err != nil || !tc.check(got) {
			t.Errorf("LoadConfig(%v) = %+v, %v, want %s", tc.environ, got, err, tc.want)
		}
	}
}

// TestLoadConfigErrors checks that every bad CORESIM_* value is refused with an
// *envconf.Error naming that very variable.
func TestLoadConfigErrors(t *testing.T) {
	bad := map[string][]string{
		"LISTEN_ADDR":       {""},
		"CORES":             {"0", "-1", "x", "1.5"},
		"SPEEDUP":           {"0", "-1", "x", "NaN", "2e6"},
		"TICK":              {"0s", "-1ms", "5", "x"},
		"QUEUE_SIZE":        {"0", "-5", "x"},
		"READY_OCCUPANCY":   {"-0.1", "1.5", "x", "NaN"},
		"ENGINES":           {",", " , ", "A,,B"},
		"SCAN_COST_OBJECT":  {"-1ms", "90"},
		"SCAN_COST_MIB":     {"-1ms", "600"},
		"POLL_COST_BASE":    {"-1ms", "2"},
		"POLL_COST_ENTRY":   {"-1us", "130"},
		"BATCH_COST_FILE":   {"-1ms", "2"},
		"REJECT_COST":       {"-1ms", "0.4"},
		"FETCH_LIMIT":       {"-1", "x"},
		"FETCH_BURST":       {"0", "-1", "1.5"},
		"FETCH_WAIT":        {"-1s", "1"},
		"CALLBACK_RETRIES":  {"-1", "x"},
		"CALLBACK_DELAY":    {"-1s", "1"},
		"CALLBACK_INCREASE": {"-1s", "1"},
		"CALLBACK_TIMEOUT":  {"0s", "10"},
		"CALLBACK_WORKERS":  {"0", "x"},
		"RETENTION":         {"0s", "-1h", "24"},
	}
	type tcase struct {
		environ map[string]string
		want    string // the variable the error must name
	}
	var cases []tcase
	for name, values := range bad {
		for _, v := range values {
			cases = append(cases, tcase{map[string]string{EnvPrefix + name: v}, EnvPrefix + name})
		}
	}
	cases = append(cases,
		tcase{map[string]string{"CORESIM_SCAN_COST_OBJECT": "0s", "CORESIM_SCAN_COST_MIB": "0s"}, "CORESIM_SCAN_COST_OBJECT"},
		tcase{map[string]string{"CORESIM_CORES": "4", "CORESIM_RETENTION": "0s"}, "CORESIM_RETENTION"},
	)
	for _, tc := range cases {
		_, err := LoadConfig(tc.environ)
		var e *envconf.Error
		if !errors.As(err, &e) {
			t.Errorf("LoadConfig(%q) = %v, want an *envconf.Error naming %s", tc.environ, err, tc.want)
			continue
		}
		if e.Var != tc.want || e.Value != tc.environ[tc.want] || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("LoadConfig(%q) = %v (Var %s, Value %q), want an error naming %s=%q",
				tc.environ, err, e.Var, e.Value, tc.want, tc.environ[tc.want])
		}
	}
}

// TestNewValidates checks that New refuses a configuration built in code that makes no
// sense, naming the variable that would set it.
func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.Cores = 0 }, "CORESIM_CORES"},
		{func(c *Config) { c.Speedup = 0 }, "CORESIM_SPEEDUP"},
		{func(c *Config) { c.Engines = nil }, "CORESIM_ENGINES"},
		{func(c *Config) { c.CallbackWorkers = 0 }, "CORESIM_CALLBACK_WORKERS"},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		_, err := New(cfg, nil)
		var e *envconf.Error
		if !errors.As(err, &e) || e.Var != tc.want {
			t.Errorf("New(cfg with a bad %s) = %v, want an *envconf.Error naming it", tc.want, err)
		}
	}
}
