package coresim

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// Run reads the emulator's settings from environ (variable name to value; the process
// environment itself is not read), serves Core's API and, unless CORESIM_ADMIN_ADDR is
// empty, the emulator's /metrics, and drives the model in real time until ctx ends
// (coresim's main ends it on SIGTERM or SIGINT); then it stops its servers, waiting up
// to 5 s for requests in flight, and its model. Logs go to logw as JSON lines. When
// started is not nil it is called, from Run's goroutine, with the API's and the admin
// listener's addresses once both listen (admin is nil without an admin listener).
//
// Run returns nil once stopped; an *envconf.Error naming the variable for a bad
// setting, before anything listens; an error naming the variable when an address
// cannot be listened on; or a server's error. It leaves no goroutine behind.
func Run(ctx context.Context, environ map[string]string, logw io.Writer, started func(api, admin net.Addr)) error {
	cfg, err := LoadConfig(environ)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logw, nil))
	if unknown := envconf.Unknown(EnvPrefix, environ, envconf.Names[Config](EnvPrefix)); len(unknown) > 0 {
		log.Warn("unknown variables ignored (misspelt?)", "variables", unknown)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := Start(cfg, StartOptions{Registry: reg})
	if err != nil {
		return err
	}
	admin := ""
	if srv.Admin != nil {
		admin = srv.Admin.String()
	}
	log.Info("coresim serving", "listen", srv.API.String(), "admin", admin, "cores", cfg.Cores,
		"speedup", cfg.Speedup, "fetch_limit", cfg.FetchLimit, "queue_size", cfg.QueueSize)
	if started != nil {
		started(srv.API, srv.Admin)
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-srv.Err():
	}
	srv.Close()
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	log.Info("coresim stopped")
	return nil
}
