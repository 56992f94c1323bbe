package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/coresim"
)

// Scenario is one case of the benchmark.
type Scenario struct {
	// Name is the case: No-limit, Rate-N (Core's own limit of N fetches a second),
	// Proxy-N (mdproxy limiting file_result to N a second in front of an unlimited
	// Core) or Webhook (callbacks, no fetching).
	Name       string
	CoreLimit  float64 // requests per virtual second; 0 = off
	ProxyLimit float64 // requests per virtual second; 0 = no mdproxy
	Webhook    bool
}

// ParseScenario reads a case name.
func ParseScenario(name string) (Scenario, error) {
	s := Scenario{Name: name}
	switch {
	case name == "No-limit":
	case name == "Webhook":
		s.Webhook = true
	case strings.HasPrefix(name, "Rate-"), strings.HasPrefix(name, "Proxy-"):
		kind, n, _ := strings.Cut(name, "-")
		v, err := strconv.ParseFloat(n, 64)
		if err != nil || !(v > 0) {
			return s, fmt.Errorf("scenario %q: want a limit above 0 after %s-", name, kind)
		}
		if kind == "Rate" {
			s.CoreLimit = v
		} else {
			s.ProxyLimit = v
		}
	default:
		return s, fmt.Errorf("scenario %q: want No-limit, Rate-N, Proxy-N or Webhook", name)
	}
	return s, nil
}

// AllScenarios are the published benchmark's six cases and the four Proxy-N cases.
var AllScenarios = []string{"No-limit", "Rate-50", "Rate-20", "Rate-10", "Rate-1",
	"Proxy-50", "Proxy-20", "Proxy-10", "Proxy-1", "Webhook"}

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
	// CallbackAddr is where the Webhook receiver listens (host:port); it must be
	// reachable by Core. Empty: a free loopback port.
	CallbackAddr string
	// StartProxy starts mdproxy for a Proxy-N case: environ holds the case's MDPROXY_*
	// settings (loopback addresses on free ports, Core's URL, file_result's limit, no
	// shutdown delay), ctx ends with the case. It returns the proxy's URL and stop,
	// which shuts mdproxy down and returns its error (nil after a clean shutdown).
	// bench never assembles mdproxy itself, so that the cases measure the wiring that
	// ships: cmd/mdbench runs package sidecar in-process. Required by Proxy-N cases only.
	StartProxy func(ctx context.Context, environ map[string]string) (url string, stop func() error, err error)
}

// started is a scenario's servers.
type started struct {
	target   string // where the client sends its requests
	receiver string // the callback URL (Webhook)
	recv     *Receiver
	stop     func() error // stops every server, the last started first
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
// front of it (or of CoreURL) for Proxy-N, and a callback receiver for Webhook. All
// limits given per virtual second are multiplied by the speed-up.
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
		sim, err := coresim.New(cfg, prometheus.NewRegistry())
		if err != nil {
			return fail(fmt.Errorf("emulator: %w", err))
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			sim.Run(ctx, true)
		}()
		stops = append(stops, noErr(func() { cancel(); wg.Wait() }))
		u, stop, err := serve(sim.Handler())
		if err != nil {
			return fail(err)
		}
		stops = append(stops, noErr(stop))
		core = u
	}
	st.target = core
	if sc.ProxyLimit > 0 {
		if e.StartProxy == nil {
			return fail(fmt.Errorf("%s: no way to start mdproxy (Env.StartProxy is nil)", sc.Name))
		}
		// The shape the emulator gives Core's own limit (coresim's FETCH_BURST and
		// FETCH_WAIT): N a second, a burst of 5, a fetch over the limit held up to 2
		// seconds (virtual) for its turn, so that Proxy-N and Rate-N differ only in
		// who enforces the limit. Other routes keep mdproxy's defaults: the workload
		// polls only GET /file/{data_id}.
		u, stop, err := e.StartProxy(ctx, map[string]string{
			"MDPROXY_LISTEN_ADDR":          "127.0.0.1:0",
			"MDPROXY_ADMIN_ADDR":           "127.0.0.1:0",
			"MDPROXY_UPSTREAM_URL":         core,
			"MDPROXY_FILE_RESULT_RATE":     strconv.FormatFloat(sc.ProxyLimit*k, 'g', -1, 64),
			"MDPROXY_FILE_RESULT_BURST":    strconv.Itoa(e.Sim.FetchBurst),
			"MDPROXY_FILE_RESULT_MAX_WAIT": time.Duration(float64(e.Sim.FetchWait) / k).String(),
			"MDPROXY_SHUTDOWN_DELAY":       "0s", // no load balancer to warn
		})
		if err != nil {
			return fail(fmt.Errorf("mdproxy: %w", err))
		}
		stops = append(stops, func() error {
			if err := stop(); err != nil {
				return fmt.Errorf("mdproxy: %w", err)
			}
			return nil
		})
		st.target = u
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
	out, err := w.Run(ctx, st.target, files)
	if err != nil {
		return Figures{}, fmt.Errorf("%s: %w", sc.Name, err)
	}
	return Summarize(sc.Name, out, !sc.Webhook), nil
}
