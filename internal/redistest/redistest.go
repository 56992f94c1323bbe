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
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timeouts of the server's life, in real time.
const (
	// startTimeout bounds how long Start and Restart wait for the server to answer PING.
	startTimeout = 10 * time.Second
	// pollInterval is how often the server is asked PING while it starts.
	pollInterval = 10 * time.Millisecond
	// stopGrace is how long the clean-up waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// startTries is how many free ports Start tries when another process takes the one
	// it picked before redis-server could bind it.
	startTries = 3
)

// serverPath is where Start looks for redis-server when it is not on PATH (Debian's
// package puts it there); a variable so that this package's tests can pretend it absent.
var serverPath = "/usr/bin/redis-server"

// Server is a redis-server run for one test: listening on 127.0.0.1 at a port of its
// own, with its own temporary directory, no configuration file, no snapshots (--save "")
// and no append-only file, so that a stop loses every key, as a crash of a Redis without
// persistence does. Its methods are safe for concurrent use.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex
	proc *process // nil while stopped
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd.Wait returned
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
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if _, serr := os.Stat(serverPath); serr == nil {
			bin = serverPath
		} else {
			msg := "redistest: redis-server not found on PATH nor at " + serverPath +
				" (Debian: apt-get install redis-server)"
			if os.Getenv("CI") != "" {
				t.Fatal(msg + "; CI is set, so the test fails rather than skip")
			}
			t.Skip(msg + "; skipping")
		}
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.cleanup)
	var errs []error
	for range startTries {
		port, err := freePort()
		if err != nil {
			t.Fatalf("redistest: finding a free port: %v", err)
		}
		s.port = port
		err = s.start()
		if err == nil {
			return s
		}
		errs = append(errs, err)
		if !errors.Is(err, errExited) {
			break // it did not exit early, so another port will not help
		}
	}
	t.Fatalf("redistest: starting redis-server: %v", errors.Join(errs...))
	return nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// errExited is wrapped by start's error when redis-server exited before it answered,
// e.g. because its port was taken meanwhile.
var errExited = errors.New("redis-server exited before it answered PING")

// start runs redis-server on s.port and waits until it answers PING. s.mu must not be
// held; s.proc must be nil.
func (s *Server) start() error {
	logFile := filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log")
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--logfile", logFile,
	)
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("running %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	err := waitReady(s.Addr(), cmd.Process.Pid, p.done)
	if err != nil {
		p.kill()
		log, _ := os.ReadFile(logFile)
		return fmt.Errorf("port %d: %w; its log:\n%s", s.port, err, strings.TrimSpace(string(log)))
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// waitReady asks addr PING every pollInterval until it answers PONG, the process ends
// (done closed) or startTimeout passes; then it checks that the server answering is
// process pid (INFO's process_id), not another one that holds the port.
func waitReady(addr string, pid int, done <-chan struct{}) error {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           time.Second,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1, // the loop below is the retry
		PoolSize:              1,
	})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var err error
	for {
		err = rdb.Ping(ctx).Err()
		if err == nil {
			info, err := rdb.Info(ctx, "server").Result()
			if err != nil {
				return fmt.Errorf("INFO server: %w", err)
			}
			if !strings.Contains(info, "process_id:"+strconv.Itoa(pid)+"\r\n") {
				select {
				case <-done:
					return errExited
				case <-time.After(time.Second): // its exit is still to be reaped
					return errors.New("another server answers on its port")
				}
			}
			return nil
		}
		select {
		case <-done:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("no answer to PING within %v: %w", startTimeout, err)
		case <-tick.C:
		}
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// terminate sends SIGTERM and waits for the process to exit, for grace at most, then
// kills it.
func (p *process) terminate(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.kill()
	}
}

// Addr returns the server's address, 127.0.0.1:port, the same across Stop and Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's URL for redis.ParseURL and MDPROXY_REDIS_URL:
// redis://127.0.0.1:port/0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Stop kills the server (SIGKILL, as a crash) and waits until its process has exited,
// so that the port refuses connections once Stop returns: an outage in the middle of a
// test. Every key is lost. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		p.kill()
	}
}

// Restart starts the server again on the same port, empty, and returns once it answers
// PING; it fails the test (t.Fatal, so call it from the test's goroutine) if it cannot.
// Restarting a running server stops it first.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restarting redis-server: %v", err)
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

// cleanup stops the server at the end of the test: SIGTERM, then a wait.
func (s *Server) cleanup() {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p != nil {
		p.terminate(stopGrace)
	}
}

// pid returns the process id of the running server, 0 while stopped.
func (s *Server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}
