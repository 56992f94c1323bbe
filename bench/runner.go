package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mdproxy/mdproxy/coresim"
)

// Scenario is one case of the benchmark.
type Scenario struct {
	// Name is the case: No-limit, Rate-N (Core's own limit of N fetches a second),
	// Proxy-N (mdproxy limiting file_result to N a second in front of an unlimited
	// Core, its bridge off), Proxy-NxR (Proxy-N's mdproxy as R replicas that share
	// their limits on one Redis, the client's requests spread over them), Bridge (the
	// seed's polling client through mdproxy with its bridge on and its default limits,
	// in front of an unlimited Core) or Webhook (callbacks, no fetching).
	Name       string
	CoreLimit  float64 // requests per virtual second; 0 = off
	ProxyLimit float64 // requests per virtual second; 0 = no limit of the case's own
	// Replicas is how many mdproxy replicas share the case's limits on a Redis started
	// for the case (Proxy-NxR); 0: one mdproxy, its limits its own (no Redis).
	Replicas int
	Bridge   bool // mdproxy with its bridge on
	// Adaptive is mdproxy with its bridge off and its adaptive limit on
	// (MDPROXY_ADAPTIVE), file_result at its default rate as the ceiling: no rate chosen.
	Adaptive bool
	Webhook  bool
}

// proxied reports whether the case runs mdproxy.
func (s Scenario) proxied() bool { return s.ProxyLimit > 0 || s.Bridge || s.Adaptive }

// ParseScenario reads a case name.
func ParseScenario(name string) (Scenario, error) {
	s := Scenario{Name: name}
	switch {
	case name == "No-limit":
	case name == "Webhook":
		s.Webhook = true
	case name == "Bridge":
		s.Bridge = true
	case name == "Adaptive":
		s.Adaptive = true
	case strings.HasPrefix(name, "Rate-"), strings.HasPrefix(name, "Proxy-"):
		kind, n, _ := strings.Cut(name, "-")
		if kind == "Proxy" {
			if limit, r, ok := strings.Cut(n, "x"); ok {
				v, err := strconv.Atoi(r)
				if err != nil || v < 1 {
					return s, fmt.Errorf("scenario %q: want a whole number of replicas from 1 up after Proxy-Nx", name)
				}
				n, s.Replicas = limit, v
			}
		}
		v, err := strconv.ParseFloat(n, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return s, fmt.Errorf("scenario %q: want a limit above 0 after %s-", name, kind)
		}
		if kind == "Rate" {
			s.CoreLimit = v
		} else {
			s.ProxyLimit = v
		}
	default:
		return s, fmt.Errorf("scenario %q: want No-limit, Rate-N, Proxy-N, Proxy-NxR, Webhook, Bridge or Adaptive", name)
	}
	return s, nil
}

// AllScenarios are the published benchmark's six cases, the four Proxy-N cases and
// Bridge: mdbench's default run. Proxy-NxR cases (Proxy-10x2) are not among them: they
// need Debian's redis-server, which no other case does.
var AllScenarios = []string{"No-limit", "Rate-50", "Rate-20", "Rate-10", "Rate-1",
	"Proxy-50", "Proxy-20", "Proxy-10", "Proxy-1", "Webhook", "Bridge"}

// Bridge's settings: mdproxy's default limit of GET /file/{data_id} (sidecar's
// DefaultLimits, MDPROXY_FILE_RESULT_RATE and _BURST unset) and its default
// MDPROXY_BRIDGE_REFRESH, both in real time, which the Bridge case scales by the
// speed-up as the Proxy-N cases scale their rates. TestBridgeDefaults checks them
// against sidecar's.
const (
	bridgeFileResultRate  = 10 // a second
	bridgeFileResultBurst = 20
	bridgeRefresh         = 60 * time.Second
)

// Env is where a scenario runs: either an emulator (and mdproxy) that the runner starts
// on free loopback ports for each scenario, or an existing Core.
type Env struct {
	// CoreURL, when set, is a real Core: no emulator is started; Rate-N cases then
	// require Core's own limit to be set to N by hand beforehand.
	CoreURL string
	// Sim is the emulator's configuration (Speedup included) when CoreURL is empty.
	Sim coresim.Config
	// ClientSpeedup is the speed-up of an existing Core at CoreURL: 1 for a real Core,
	// the emulator's CORESIM_SPEEDUP for one started apart. 0 means 1.
	ClientSpeedup float64
	// CallbackAddr is where the Webhook receiver, and in the Bridge case mdproxy's
	// callback listener (MDPROXY_BRIDGE_LISTEN_ADDR), listen (host:port); it must be
	// reachable by Core. Empty: a free loopback port.
	CallbackAddr string
	// BridgeCallbackURL, when set, is the Bridge case's MDPROXY_BRIDGE_CALLBACK_URL, the
	// URL Core is given for its callbacks. Empty: mdproxy derives it from its callback
	// listener's address. A test sets an address nothing listens on to play callbacks
	// that never arrive.
	BridgeCallbackURL string
	// StartProxy starts mdproxy for a Proxy-N or the Bridge case: environ holds the
	// case's MDPROXY_* settings (loopback addresses on free ports, Core's URL,
	// file_result's limit, the bridge on or off, no shutdown delay; for a Proxy-NxR
	// case, called once a replica, the Redis they share too), ctx ends with the
	// case. It returns the proxy's URL and stop,
	// which shuts mdproxy down and returns its error (nil after a clean shutdown).
	// bench never assembles mdproxy itself, so that the cases measure the wiring that
	// ships: cmd/mdbench runs package sidecar in-process. Required by the Proxy-N,
	// Proxy-NxR and Bridge cases only.
	StartProxy func(ctx context.Context, environ map[string]string) (url string, stop func() error, err error)
	// StartRedis starts the Redis that the replicas of a Proxy-NxR case share, empty,
	// and returns its URL (redis://host:port/db, MDPROXY_REDIS_URL) and stop, which
	// stops it and returns its error. It is called once a case and stopped after the
	// case's replicas. Nil: StartRedisServer, Debian's redis-server run as a child
	// process on a free loopback port.
	StartRedis func(ctx context.Context) (url string, stop func() error, err error)
}

// started is a scenario's servers.
type started struct {
	targets  []string // where the client sends its requests: Core, mdproxy or its replicas
	receiver string   // the callback URL (Webhook)
	recv     *Receiver
	stop     func() error // stops every server, the last started first
	// corePolls returns the polls (GET /file/{data_id}) that reached the emulator;
	// nil with a Core at CoreURL, where they are not counted.
	corePolls func() int64
	// watch samples the emulator's scan queue and, in the Adaptive case, mdproxy's
	// file_result rate while the case runs; nil with a Core at CoreURL.
	watch *watch
}

// Speedup is the virtual time per real second of the scenario's clock.
func (e Env) Speedup() float64 {
	if e.CoreURL != "" {
		return max(1, e.ClientSpeedup)
	}
	return e.Sim.Speedup
}

// serve serves h on addr (empty: a free loopback port) and returns its URL and a stop
// function.
func serve(h http.Handler, addr ...string) (string, func(), error) {
	a := "127.0.0.1:0"
	if len(addr) > 0 && addr[0] != "" {
		a = addr[0]
	}
	l, err := net.Listen("tcp", a)
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return "http://" + l.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		srv.Close()
		<-done
	}, nil
}

// start brings up the servers of sc: a fresh emulator with Core's own limit, mdproxy in
// front of it (or of CoreURL) for Proxy-N, a Redis and the replicas of mdproxy sharing
// it for Proxy-NxR, and a callback receiver for Webhook. All limits given per virtual
// second are multiplied by the speed-up.
func (e Env) start(ctx context.Context, sc Scenario) (*started, error) {
	var stops []func() error
	st := &started{stop: func() error {
		var errs []error
		for i := len(stops) - 1; i >= 0; i-- {
			errs = append(errs, stops[i]())
		}
		return errors.Join(errs...)
	}}
	fail := func(err error) (*started, error) { _ = st.stop(); return nil, err }
	noErr := func(f func()) func() error { return func() error { f(); return nil } }
	k := e.Speedup()

	core := e.CoreURL
	if core == "" {
		cfg := e.Sim
		cfg.FetchLimit = sc.CoreLimit
		cfg.ListenAddr, cfg.AdminAddr = "127.0.0.1:0", ""
		sim, err := coresim.Start(cfg, coresim.StartOptions{})
		if err != nil {
			return fail(fmt.Errorf("emulator: %w", err))
		}
		stops = append(stops, noErr(sim.Close))
		st.corePolls = sim.Polls
		st.watch = &watch{queueLen: sim.Sim.QueueLen, queueSize: cfg.QueueSize, speedup: k}
		core = sim.URL
	}
	st.targets = []string{core}
	if sc.proxied() {
		if e.StartProxy == nil {
			return fail(fmt.Errorf("%s: no way to start mdproxy (Env.StartProxy is nil)", sc.Name))
		}
		if sc.Bridge && e.CoreURL != "" && e.CallbackAddr == "" {
			return fail(errors.New("the Bridge case against a real Core needs a callback listener address Core can reach (--callback-addr)"))
		}
		environ := map[string]string{
			"MDPROXY_LISTEN_ADDR":    "127.0.0.1:0",
			"MDPROXY_ADMIN_ADDR":     "127.0.0.1:0",
			"MDPROXY_UPSTREAM_URL":   core,
			"MDPROXY_SHUTDOWN_DELAY": "0s", // no load balancer to warn
		}
		if sc.Bridge {
			// mdproxy's defaults, in real time, scaled by the speed-up: file_result
			// 10 a second, burst 20, no wait; Core asked about a pending id whose
			// callback looks 60 s overdue. The callback listener on a free loopback
			// port, Core's callback URL derived from its address.
			listen := cmp.Or(e.CallbackAddr, "127.0.0.1:0")
			environ["MDPROXY_BRIDGE"] = "true"
			environ["MDPROXY_BRIDGE_LISTEN_ADDR"] = listen
			environ["MDPROXY_BRIDGE_REFRESH"] = time.Duration(float64(bridgeRefresh) / k).String()
			environ["MDPROXY_FILE_RESULT_RATE"] = strconv.FormatFloat(bridgeFileResultRate*k, 'g', -1, 64)
			environ["MDPROXY_FILE_RESULT_BURST"] = strconv.Itoa(bridgeFileResultBurst)
			if e.BridgeCallbackURL != "" {
				environ["MDPROXY_BRIDGE_CALLBACK_URL"] = e.BridgeCallbackURL
			}
		} else if sc.Adaptive {
			// mdproxy's defaults for file_result (10 a second, burst 20) as the
			// ceiling, the adaptive limit reading Core every 5 s (virtual), scaled by
			// the speed-up (at least 100 ms real); the bridge off, as in Proxy-N.
			environ["MDPROXY_BRIDGE"] = "false"
			environ["MDPROXY_FILE_RESULT_RATE"] = strconv.FormatFloat(bridgeFileResultRate*k, 'g', -1, 64)
			environ["MDPROXY_FILE_RESULT_BURST"] = strconv.Itoa(bridgeFileResultBurst)
			environ["MDPROXY_ADAPTIVE"] = "true"
			environ["MDPROXY_ADAPTIVE_INTERVAL"] = max(time.Duration(float64(5*time.Second)/k), 100*time.Millisecond).String()
			if st.watch != nil {
				// An admin listener whose /metrics the watch reads: the rate in force.
				addr, err := freeLoopbackAddr()
				if err != nil {
					return fail(err)
				}
				environ["MDPROXY_ADMIN_ADDR"] = addr
				st.watch.metricsURL, st.watch.ceiling = "http://"+addr+"/metrics", bridgeFileResultRate*k
			}
		} else {
			// The shape the emulator gives Core's own limit (coresim's FETCH_BURST
			// and FETCH_WAIT): N a second, a burst of 5, a fetch over the limit held
			// up to 2 seconds (virtual) for its turn, so that Proxy-N and Rate-N differ
			// only in who enforces the limit. The bridge off, so that the case
			// measures the limit alone. Other routes keep mdproxy's defaults: the
			// workload polls only GET /file/{data_id}.
			environ["MDPROXY_BRIDGE"] = "false"
			environ["MDPROXY_FILE_RESULT_RATE"] = strconv.FormatFloat(sc.ProxyLimit*k, 'g', -1, 64)
			environ["MDPROXY_FILE_RESULT_BURST"] = strconv.Itoa(e.Sim.FetchBurst)
			environ["MDPROXY_FILE_RESULT_MAX_WAIT"] = time.Duration(float64(e.Sim.FetchWait) / k).String()
		}
		replicas := 1
		if sc.Replicas > 0 {
			// Proxy-NxR: the same settings for each replica, and one Redis where
			// they share each route's bucket (so a replica's share of the rate in
			// fallback, rate/R, holds the total too). Redis is stopped after them.
			startRedis := e.StartRedis
			if startRedis == nil {
				startRedis = StartRedisServer
			}
			u, stop, err := startRedis(ctx)
			if err != nil {
				return fail(fmt.Errorf("%s: Redis: %w", sc.Name, err))
			}
			stops = append(stops, func() error {
				if err := stop(); err != nil {
					return fmt.Errorf("redis: %w", err)
				}
				return nil
			})
			replicas = sc.Replicas
			environ["MDPROXY_REDIS_URL"] = u
			environ["MDPROXY_REPLICAS"] = strconv.Itoa(replicas)
		}
		st.targets = nil
		for i := range replicas {
			u, stop, err := e.StartProxy(ctx, maps.Clone(environ))
			if err != nil {
				return fail(fmt.Errorf("mdproxy%s: %w", replicaName(i, replicas), err))
			}
			stops = append(stops, func() error {
				if err := stop(); err != nil {
					return fmt.Errorf("mdproxy%s: %w", replicaName(i, replicas), err)
				}
				return nil
			})
			st.targets = append(st.targets, u)
		}
	}
	if sc.Webhook {
		st.recv = &Receiver{}
		u, stop, err := serve(st.recv, e.CallbackAddr)
		if err != nil {
			return fail(err)
		}
		stops = append(stops, noErr(stop))
		st.receiver = u + "/callback"
	}
	return st, nil
}

// replicaName names replica i of n in an error: "" when it is the only one.
func replicaName(i, n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(" replica %d of %d", i+1, n)
}

// RunScenario runs w in scenario sc on env and summarizes it. It fails when a server
// of the case does not start, when the run fails, or when a server of the case fails
// to stop cleanly (e.g. mdproxy cutting requests at its shutdown timeout).
func RunScenario(ctx context.Context, env Env, sc Scenario, w Workload, files []DataFile) (_ Figures, err error) {
	st, err := env.start(ctx, sc)
	if err != nil {
		return Figures{}, err
	}
	defer func() {
		if serr := st.stop(); serr != nil && err == nil {
			err = fmt.Errorf("%s: stopping: %w", sc.Name, serr)
		}
	}()
	w.Speedup = env.Speedup()
	if sc.Webhook {
		if env.CoreURL != "" && env.CallbackAddr == "" {
			return Figures{}, errors.New("the Webhook case against a real Core needs a receiver address Core can reach (--callback-addr)")
		}
		w.CallbackURL, w.Callbacks = st.receiver, st.recv
	}
	stopWatch := st.watch.start()
	out, err := w.RunSpread(ctx, st.targets, files)
	seen := stopWatch()
	if err != nil {
		return Figures{}, fmt.Errorf("%s: %w", sc.Name, err)
	}
	if st.corePolls != nil {
		out.CorePolls = st.corePolls()
	} else if !sc.proxied() {
		out.CorePolls = out.FetchOK + out.FetchErrors + out.FetchOther // every fetch went to Core
	} else {
		out.CorePolls = -1 // behind mdproxy, in front of a real Core: not counted
	}
	f := Summarize(sc.Name, out, !sc.Webhook)
	st.watch.fill(&f, seen)
	return f, nil
}
