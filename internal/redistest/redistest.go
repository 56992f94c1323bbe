// Package redistest runs a real Redis for tests: Debian's redis-server, started on a free
// loopback port with nothing persisted, stopped when the test ends (issue 12). It is a
// non-test package so that the tests of every package can import it; nothing but tests
// should.
//
// A test that needs Redis calls Start; without redis-server on the machine the test is
// skipped, unless the environment variable CI is set (to anything), where a missing
// redis-server fails the test instead, so that CI cannot pass by skipping.
package redistest

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/mdproxy/mdproxy/internal/redisproc"
)

// serverPath is where Start looks for redis-server when it is not on PATH (Debian's
// package puts it there); a variable so that this package's tests can pretend it absent.
var serverPath = redisproc.DefaultPath

// Server is a redis-server run for one test (a redisproc.Server): listening on 127.0.0.1
// at a port of its own, with its files in a temporary directory of the test's, no
// configuration file, no snapshots (--save "") and no append-only file, so that a stop
// loses every key, as a crash of a Redis without persistence does. Its methods are safe
// for concurrent use.
type Server struct {
	t   testing.TB
	srv *redisproc.Server
	dir string // the server's directory, t.TempDir()
}

// Start starts redis-server for t on a free loopback port and returns once it answers
// PING (within 10 s, else t fails). t's clean-up stops it: SIGTERM, then a wait for the
// process to exit (SIGKILL after 10 s), so that no process and no goroutine of it outlives
// the test. On Linux the server is also killed if the test binary dies without its
// clean-up (a test timeout).
//
// When redis-server is neither on PATH nor at /usr/bin/redis-server, Start skips t with
// a line that says so, or fails t when the environment variable CI is set. Start must be
// called from the test's goroutine (it may call t.Skip or t.Fatal).
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := redisproc.Find(serverPath)
	if err != nil {
		msg := "redistest: " + err.Error()
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI is set, so the test fails rather than skip")
		}
		t.Skip(msg + "; skipping")
	}
	dir := t.TempDir()
	srv, err := redisproc.Start(context.Background(), redisproc.Options{Bin: bin, Dir: dir})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	// The server's own errors at its stop (say, it crashed) are no business of the test.
	t.Cleanup(func() { _ = srv.Stop() })
	return &Server{t: t, srv: srv, dir: dir}
}

// Addr returns the server's address, 127.0.0.1:port, the same across Stop and Restart.
func (s *Server) Addr() string { return s.srv.Addr() }

// URL returns the server's URL for redis.ParseURL and MDPROXY_REDIS_URL:
// redis://127.0.0.1:port/0.
func (s *Server) URL() string { return s.srv.URL() }

// Stop kills the server (SIGKILL, as a crash) and waits until its process has exited,
// so that the port refuses connections once Stop returns: an outage in the middle of a
// test. Every key is lost. Stopping a stopped server does nothing.
func (s *Server) Stop() { s.srv.Kill() }

// Restart starts the server again on the same port, empty, and returns once it answers
// PING; it fails the test (t.Fatal, so call it from the test's goroutine) if it cannot.
// Restarting a running server stops it first.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.srv.Restart(context.Background()); err != nil {
		s.t.Fatalf("redistest: %v", err)
	}
}

// Client returns a client of the server (database 0) with ContextTimeoutEnabled set, so
// that a context's deadline bounds each call, as mdproxy's must be; it is closed by
// t's clean-up, before the server is stopped if the server was started by t or a parent
// of t. It keeps working across Stop and Restart (its calls fail in between).
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// pid returns the process id of the running server, 0 while stopped.
func (s *Server) pid() int { return s.srv.Pid() }
