package coresim

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// StartOptions are what Start takes beside the Config. The zero value starts the
// emulator on a registry of its own with its model driven in real time.
type StartOptions struct {
	// Registry takes the emulator's metrics and is served on the admin listener; nil:
	// a new registry.
	Registry *prometheus.Registry
	// ManualTime keeps the model's virtual time still: no scan, delay or callback
	// falls due unless the emulator's own tests move the time by hand. False drives it
	// in real time at Config.Speedup.
	ManualTime bool
}

// Server is an emulator serving Core's API, and its /metrics when Config.AdminAddr is
// set, on listeners of its own, as Start returns it. It counts the requests and the
// result polls that reach it. It is safe for concurrent use.
type Server struct {
	// Sim is the emulator behind the API.
	Sim *Sim
	// URL is the API's base URL, "http://" and the listener's address.
	URL string
	// API and Admin are the listeners' addresses; Admin is nil without an admin
	// listener.
	API, Admin net.Addr

	requests, polls atomic.Int64
	servers         []*http.Server
	errc            chan error // each server's Serve result; capacity len(servers)
	stopSim         context.CancelFunc
	grace           time.Duration // for the requests in flight at Close
	wg              sync.WaitGroup
	closeOnce       sync.Once
}

// Start listens on cfg.ListenAddr (and on cfg.AdminAddr unless it is empty), serves
// Core's API there and runs the emulator's model, until Close. A listen address of
// port 0 takes a free port; Server.API tells which. Its error names the variable
// (CORESIM_LISTEN_ADDR, CORESIM_ADMIN_ADDR) whose address cannot be listened on, or
// says what in cfg is wrong; nothing is left running then.
//
// Start is the one way the repository starts an emulator in a process: coresim's
// binary (through Run), the benchmark and the tests.
func Start(cfg Config, opts StartOptions) (*Server, error) {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	sim, err := New(cfg, reg)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on CORESIM_LISTEN_ADDR: %w", err)
	}
	s := &Server{Sim: sim, URL: "http://" + l.Addr().String(), API: l.Addr(), grace: 5 * time.Second}
	if opts.ManualTime {
		s.grace = 0 // a request waiting for virtual time would wait for nothing
	}
	s.servers = []*http.Server{{Handler: s.count(sim.Handler()), ReadHeaderTimeout: 10 * time.Second}}
	listeners := []net.Listener{l}
	if cfg.AdminAddr != "" {
		al, err := net.Listen("tcp", cfg.AdminAddr)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("listening on CORESIM_ADMIN_ADDR: %w", err)
		}
		s.Admin = al.Addr()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		s.servers = append(s.servers, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, al)
	}

	var simCtx context.Context
	simCtx, s.stopSim = context.WithCancel(context.Background())
	s.wg.Go(func() { sim.Run(simCtx, !opts.ManualTime) })
	s.errc = make(chan error, len(s.servers))
	for i, srv := range s.servers {
		s.wg.Go(func() { s.errc <- srv.Serve(listeners[i]) })
	}
	return s, nil
}

// count wraps the API's handler h with the request and poll counts.
func (s *Server) count(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if id, ok := strings.CutPrefix(r.URL.Path, "/file/"); ok && r.Method == http.MethodGet &&
			id != "" && id != "rules" && !strings.Contains(id, "/") {
			s.polls.Add(1)
		}
		h.ServeHTTP(w, r)
	})
}

// Polls returns the number of result polls (GET /file/{data_id}) that reached the API
// so far, answered or refused, whoever sent them.
func (s *Server) Polls() int64 { return s.polls.Load() }

// Requests returns the number of requests that reached the API so far.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Err returns a channel that receives a server's error should one stop serving
// before Close (an http.Server's Serve error).
func (s *Server) Err() <-chan error { return s.errc }

// CloseIdle closes the API's idle kept-alive connections and keeps later ones from
// being kept, as a restarted Core would (a client's pooled connections break).
func (s *Server) CloseIdle() { s.servers[0].SetKeepAlivesEnabled(false) }

// Close stops the servers, waiting up to 5 s for the requests in flight before
// closing their connections (with StartOptions.ManualTime it closes them at once),
// then the model, and waits for all of it. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.grace)
		defer cancel()
		for _, srv := range s.servers {
			if s.grace > 0 {
				_ = srv.Shutdown(ctx)
			}
			srv.Close()
		}
		s.stopSim()
		s.wg.Wait()
	})
}
