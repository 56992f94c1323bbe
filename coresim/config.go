package coresim

import (
	"fmt"
	"strings"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// EnvPrefix starts every variable of the emulator.
const EnvPrefix = "CORESIM_"

// Config is the emulator's configuration, read from CORESIM_* variables by LoadConfig.
// Durations marked virtual are in the emulator's virtual time (see Speedup).
type Config struct {
	// ListenAddr serves Core's API. Default 127.0.0.1:8008, Core's port.
	ListenAddr string `env:"LISTEN_ADDR" envDefault:"127.0.0.1:8008"`
	// AdminAddr serves the emulator's /metrics. Default 127.0.0.1:9008; empty: none.
	AdminAddr string `env:"ADMIN_ADDR" envDefault:"127.0.0.1:9008"`

	// Cores is the number of virtual cores. Default 8, the published benchmark's host.
	Cores int `env:"CORES" envDefault:"8"`
	// Speedup is how many virtual seconds pass in one real second (1 = real time). It
	// scales every cost, delay, retention and rate of the emulator. Default 1.
	Speedup float64 `env:"SPEEDUP" envDefault:"1"`
	// Tick is the real-time step at which the model advances. Default 5ms.
	Tick time.Duration `env:"TICK" envDefault:"5ms"`
	// QueueSize is the maximum scan queue, in files: beyond it POST /file answers 503
	// "Server is too busy. Try again later.". Default 4000, as in the benchmark.
	QueueSize int `env:"QUEUE_SIZE" envDefault:"4000"`
	// ReadyOccupancy: GET /readyz answers 503 while the scan queue holds more than this
	// share of QueueSize (0 to 1), as Core's health check does past its configured queue
	// occupancy. Default 0.9.
	ReadyOccupancy float64 `env:"READY_OCCUPANCY" envDefault:"0.9"`
	// Engines are the AV engines that scan every object. Default: the benchmark's seven.
	Engines []string `env:"ENGINES" envSeparator:"," envDefault:"AhnLab,Avira,Bitdefender,ESET,K7,Quick Heal,Vir.IT Explorer"`

	// ScanCostObject is the virtual core time to scan one object with all engines.
	ScanCostObject time.Duration `env:"SCAN_COST_OBJECT" envDefault:"83ms"`
	// ScanCostMiB is the virtual core time to scan one MiB of object data with all
	// engines, on top of ScanCostObject.
	ScanCostMiB time.Duration `env:"SCAN_COST_MIB" envDefault:"600ms"`
	// PollCostBase is the virtual core time of answering any result poll.
	PollCostBase time.Duration `env:"POLL_COST_BASE" envDefault:"60ms"`
	// PollCostEntry is the virtual core time per entry of a result (objects × engines)
	// on top of PollCostBase: a large result costs more to build and send.
	PollCostEntry time.Duration `env:"POLL_COST_ENTRY" envDefault:"15us"`
	// BatchCostFile is the virtual core time per file listed in a batch status page,
	// on top of PollCostBase.
	BatchCostFile time.Duration `env:"BATCH_COST_FILE" envDefault:"2ms"`
	// RejectCost is the virtual core time of refusing a request over FetchLimit.
	RejectCost time.Duration `env:"REJECT_COST" envDefault:"400us"`

	// APIWorkers is the number of cores that answering requests may use at once (Core's
	// web server threads); the rest always scan. Default 4: unlimited polling takes 4
	// cores while a fetch round lasts and none in the client's pauses, which stretches
	// the published workload from 27 to about 41 minutes (bench/results).
	APIWorkers int `env:"API_WORKERS" envDefault:"4"`
	// RequestLatency is the virtual time every result poll, hash look-up and batch
	// status spends outside the cores (network, TLS, Core's front end) before it is
	// served or refused. Default 200ms.
	RequestLatency time.Duration `env:"REQUEST_LATENCY" envDefault:"200ms"`

	// FetchLimit is Core's own request rate limit (5.13+) on result polls, hash
	// look-ups and batch status, in requests per virtual second; 0 = off (Core's
	// default). Over it Core answers 503 {"err": ...}.
	FetchLimit float64 `env:"FETCH_LIMIT" envDefault:"0"`
	// FetchBurst is the burst of FetchLimit, in requests (>= 1): how many fetches pass
	// at once after a quiet spell. Default 5. OPSWAT documents neither the burst nor
	// the wait; the defaults reproduce the published accepted fetch rates.
	FetchBurst int `env:"FETCH_BURST" envDefault:"5"`
	// FetchWait is how long (virtual) a fetch over FetchLimit may wait for its turn:
	// within it, the fetch is held (no core, no worker), then served at the limit's pace, as a
	// leaky bucket with a queue does (nginx's limit_req without nodelay); a fetch that
	// would wait longer is refused at once. Default 2s, two seconds' worth of fetches
	// held at most; 0 refuses every fetch over the limit at once (a plain token
	// bucket).
	FetchWait time.Duration `env:"FETCH_WAIT" envDefault:"2s"`

	// CallbackRetries is how many times a failed callback is retried. Default 3.
	CallbackRetries int `env:"CALLBACK_RETRIES" envDefault:"3"`
	// CallbackDelay is the virtual delay before the first retry. Default 1s.
	CallbackDelay time.Duration `env:"CALLBACK_DELAY" envDefault:"1s"`
	// CallbackIncrease is added to the delay at each further retry. Default 1s.
	CallbackIncrease time.Duration `env:"CALLBACK_INCREASE" envDefault:"1s"`
	// CallbackTimeout bounds one callback delivery, in real time. Default 10s.
	CallbackTimeout time.Duration `env:"CALLBACK_TIMEOUT" envDefault:"10s"`
	// CallbackWorkers is the number of concurrent callback deliveries. Default 16.
	CallbackWorkers int `env:"CALLBACK_WORKERS" envDefault:"16"`

	// Retention is how long a completed result is kept, in virtual time. Default 24h.
	Retention time.Duration `env:"RETENTION" envDefault:"24h"`
	// APIKey, when set, is required in the apikey header of every API request (a
	// session_id from POST /login is accepted too); otherwise 403 "Access denied".
	APIKey string `env:"APIKEY"`
	// User and Password are the credentials POST /login accepts. Default admin/admin.
	User     string `env:"USER" envDefault:"admin"`
	Password string `env:"PASSWORD" envDefault:"admin"`
	// TempDir is where zip uploads are spooled while inspected. Default: the OS's.
	TempDir string `env:"TEMP_DIR"`
}

// LoadConfig reads the configuration from environ (variable name to value). The error,
// an *envconf.Error, names the bad variable.
func LoadConfig(environ map[string]string) (Config, error) {
	var c Config
	if err := envconf.Parse(&c, EnvPrefix, environ); err != nil {
		return c, err
	}
	// An empty CORESIM_ADMIN_ADDR means no admin listener; an empty
	// CORESIM_LISTEN_ADDR is a mistake that validate reports.
	envconf.EmptyWhenSet(environ, EnvPrefix, map[string]*string{"LISTEN_ADDR": &c.ListenAddr, "ADMIN_ADDR": &c.AdminAddr})
	return c, c.validate(environ)
}

// validate rejects settings that parse but make no sense, naming the variable.
func (c *Config) validate(environ map[string]string) error {
	bad := func(name, want string) error { return envconf.Invalid(environ, EnvPrefix, name, want) }
	switch {
	case c.ListenAddr == "":
		return bad("LISTEN_ADDR", "want a host:port")
	case c.Cores < 1:
		return bad("CORES", "want a whole number of virtual cores >= 1")
	case !(c.Speedup > 0) || c.Speedup > 1e6:
		return bad("SPEEDUP", "want a number of virtual seconds per real second above 0")
	case c.Tick <= 0:
		return bad("TICK", "want a duration above 0")
	case c.APIWorkers < 1:
		return bad("API_WORKERS", "want a whole number of cores >= 1")
	case c.RequestLatency < 0:
		return bad("REQUEST_LATENCY", "want a duration >= 0")
	case c.QueueSize < 1:
		return bad("QUEUE_SIZE", "want a whole number of files >= 1")
	case !(c.ReadyOccupancy >= 0 && c.ReadyOccupancy <= 1):
		return bad("READY_OCCUPANCY", "want a share of the scan queue from 0 to 1")
	case len(c.Engines) == 0:
		return bad("ENGINES", "want a comma-separated list of engine names")
	case c.ScanCostObject < 0:
		return bad("SCAN_COST_OBJECT", "want a duration >= 0")
	case c.ScanCostMiB < 0:
		return bad("SCAN_COST_MIB", "want a duration >= 0")
	case c.ScanCostObject+c.ScanCostMiB == 0:
		return bad("SCAN_COST_OBJECT", "want a duration above 0 when CORESIM_SCAN_COST_MIB is 0")
	case c.PollCostBase < 0:
		return bad("POLL_COST_BASE", "want a duration >= 0")
	case c.PollCostEntry < 0:
		return bad("POLL_COST_ENTRY", "want a duration >= 0")
	case c.BatchCostFile < 0:
		return bad("BATCH_COST_FILE", "want a duration >= 0")
	case c.RejectCost < 0:
		return bad("REJECT_COST", "want a duration >= 0")
	case c.FetchLimit < 0:
		return bad("FETCH_LIMIT", "want a number of requests per second >= 0")
	case c.FetchBurst < 1:
		return bad("FETCH_BURST", "want a whole number of requests >= 1")
	case c.FetchWait < 0:
		return bad("FETCH_WAIT", "want a duration >= 0")
	case c.CallbackRetries < 0:
		return bad("CALLBACK_RETRIES", "want a whole number >= 0")
	case c.CallbackDelay < 0:
		return bad("CALLBACK_DELAY", "want a duration >= 0")
	case c.CallbackIncrease < 0:
		return bad("CALLBACK_INCREASE", "want a duration >= 0")
	case c.CallbackTimeout <= 0:
		return bad("CALLBACK_TIMEOUT", "want a duration above 0")
	case c.CallbackWorkers < 1:
		return bad("CALLBACK_WORKERS", "want a whole number >= 1")
	case c.Retention <= 0:
		return bad("RETENTION", "want a duration above 0")
	}
	// A new slice: the caller's (a Config shared by concurrent runs) is left as it is.
	engines := make([]string, len(c.Engines))
	for i, e := range c.Engines {
		engines[i] = strings.TrimSpace(e)
		if engines[i] == "" {
			return bad("ENGINES", "want a comma-separated list of non-empty engine names")
		}
	}
	c.Engines = engines
	return nil
}

// DefaultConfig returns the configuration of an empty environment.
func DefaultConfig() Config {
	c, err := LoadConfig(nil)
	if err != nil {
		panic(fmt.Sprintf("coresim: defaults do not validate: %v", err))
	}
	return c
}
