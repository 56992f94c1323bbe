// Package redisproc runs Debian's redis-server as a child process: on a free loopback
// port, with nothing persisted, until it is stopped. It serves the tests of every
// package (through internal/redistest) and mdbench's Proxy-NxR cases (through
// bench.StartRedisServer); it is not meant for production.
package redisproc

import (
	"bytes"
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
	"time"

	"github.com/redis/go-redis/v9"
)

// Timeouts of a server's life, in real time.
const (
	// startTimeout bounds how long Start and Restart wait for the server to answer PING.
	startTimeout = 10 * time.Second
	// pollInterval is how often the server is tried while it starts.
	pollInterval = 10 * time.Millisecond
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// startTries is how many free ports Start tries when another process takes the one
	// it picked before redis-server could bind it.
	startTries = 3
)

// DefaultPath is where Debian's package installs redis-server: where Start looks for it
// when it is not on PATH, and the fallback that callers of Find normally pass.
const DefaultPath = "/usr/bin/redis-server"

// ErrNotFound is wrapped by the error of Find and Start when redis-server is not
// installed.
var ErrNotFound = errors.New("redis-server not found")

// Find returns the path of redis-server: the one on PATH, else fallback (normally
// DefaultPath; a parameter so that tests can pretend it absent) if that file exists.
// Otherwise its error wraps ErrNotFound, names both places and Debian's package:
// "redis-server not found on PATH nor at <fallback> (Debian: apt-get install
// redis-server)".
func Find(fallback string) (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", fmt.Errorf("%w on PATH nor at %s (Debian: apt-get install redis-server)", ErrNotFound, fallback)
}

// Options says which redis-server Start runs and where its files go.
type Options struct {
	// Bin is the path of redis-server; "" means Find(DefaultPath).
	Bin string
	// Dir is the server's working directory, where its log goes
	// (redis-<port>.log; there are no snapshots nor AOF). The caller owns it. ""
	// means a new temporary directory, which Stop removes.
	Dir string
}

// Server is one redis-server: listening on 127.0.0.1 at a port of its own, with no
// configuration file, no snapshots (--save "") and no append-only file, so that a stop
// loses every key, as a crash of a Redis without persistence does. Its address stays the
// same across Kill and Restart.
//
// Its methods are safe for concurrent use; Kill, Restart, Stop and Pid wait for a
// Restart in progress.
type Server struct {
	bin     string
	dir     string
	ownDir  bool // dir was made by Start; Stop removes it
	port    int
	logFile string

	mu      sync.Mutex
	proc    *process // nil while killed or stopped
	stopped bool     // Stop was called
	stopErr error    // the first Stop's error
}

// process is one run of redis-server.
type process struct {
	cmd     *exec.Cmd
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's error, once done is closed
}

// errExited is wrapped by run's error when redis-server exited before it answered,
// e.g. because its port was taken meanwhile.
var errExited = errors.New("redis-server exited before it answered PING")

// Start starts redis-server on a free loopback port and returns once it answers PING
// and is the process started (INFO's process_id), within 10 s. ctx bounds that wait
// only: cancelling it later does not stop the server. If another process takes the
// port first, Start tries another, three ports in all. On Linux the server is killed
// (SIGKILL) if the process that started it dies without stopping it.
//
// Its error wraps ErrNotFound when opts.Bin is "" and redis-server is not installed;
// otherwise it names the binary and ends with the end of the server's log, if any. On
// error nothing is left running and a directory Start made is removed. The caller must
// call Stop once it is done with the server.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s := &Server{bin: opts.Bin, dir: opts.Dir}
	if s.bin == "" {
		bin, err := Find(DefaultPath)
		if err != nil {
			return nil, err
		}
		s.bin = bin
	}
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "redis-server-")
		if err != nil {
			return nil, err
		}
		s.dir, s.ownDir = dir, true
	}
	var errs []error
	for range startTries {
		port, err := freePort()
		if err != nil {
			errs = append(errs, fmt.Errorf("finding a free port: %w", err))
			break
		}
		s.port = port
		s.logFile = filepath.Join(s.dir, "redis-"+strconv.Itoa(port)+".log")
		p, err := s.run(ctx)
		if err == nil {
			s.proc = p
			return s, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errExited) {
			break // it did not exit early, so another port will not help
		}
	}
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
	return nil, fmt.Errorf("starting %s: %w", s.bin, errors.Join(errs...))
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

// run runs redis-server on s.port and waits until it answers PING. On error the process
// has exited.
func (s *Server) run(ctx context.Context) (*process, error) {
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", s.dir,
		"--logfile", s.logFile,
	)
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("running %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	if err := waitReady(ctx, s.Addr(), p); err != nil {
		p.kill()
		return nil, fmt.Errorf("port %d: %w%s", s.port, err, s.logTail())
	}
	return p, nil
}

// waitReady waits until addr accepts a connection, then until it answers PING
// (go-redis) and is process p (INFO's process_id), for startTimeout at most, polling
// every pollInterval. It dials the port itself first, so that go-redis never logs a
// failed dial. It returns errExited as soon as p ends.
func waitReady(ctx context.Context, addr string, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	wait := func(last error) error {
		select {
		case <-p.done:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("no answer within %v: %w", startTimeout, errors.Join(ctx.Err(), last))
		case <-tick.C:
			return nil
		}
	}
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if err := wait(err); err != nil {
			return err
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second,
		ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1, DisableIdentity: true})
	defer rdb.Close()
	want := "process_id:" + strconv.Itoa(p.cmd.Process.Pid) + "\r\n"
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			info, ierr := rdb.Info(ctx, "server").Result()
			if ierr != nil {
				return fmt.Errorf("INFO server: %w", ierr)
			}
			if !strings.Contains(info, want) {
				// Another server holds the port; ours is to exit, unable to bind it.
				select {
				case <-p.done:
					return errExited
				case <-time.After(time.Second):
					return errors.New("another server answers on its port")
				}
			}
			return nil
		}
		if err := wait(err); err != nil {
			return err
		}
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Addr returns the server's address, 127.0.0.1:port, the same across Kill and Restart.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's URL for redis.ParseURL and MDPROXY_REDIS_URL:
// redis://127.0.0.1:port/0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Pid returns the process id of the running server, 0 while killed or stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Kill kills the server (SIGKILL, as a crash) and waits until its process has exited,
// so that the port refuses connections once Kill returns: an outage, which Restart
// ends. Every key is lost. Killing a killed or stopped server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart starts the server again on the same port, empty, and returns once it answers
// PING (within 10 s; ctx bounds that wait only). Restarting a running server kills it
// first. Its error says why the server did not start, with the end of its log, or that
// the server was stopped (Stop is final).
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("restarting redis-server %s: it was stopped", s.Addr())
	}
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
	p, err := s.run(ctx)
	if err != nil {
		return fmt.Errorf("restarting %s: %w", s.bin, err)
	}
	s.proc = p
	return nil
}

// Stop stops the server for good: SIGTERM, then a wait for its process to exit (SIGKILL
// after 10 s), then it removes the directory Start made, if it made one. Its error says
// whether the server had exited on its own before (not by Kill), did not exit cleanly,
// or had to be killed, with the end of its log; or that the directory could not be
// removed. Later calls return the first one's error and do nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return s.stopErr
	}
	s.stopped = true
	var errs []error
	if p := s.proc; p != nil {
		s.proc = nil
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("redis-server %s exited before its stop: %v%s", s.Addr(), p.waitErr, s.logTail()))
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
				if p.waitErr != nil {
					errs = append(errs, fmt.Errorf("redis-server %s at its stop: %v%s", s.Addr(), p.waitErr, s.logTail()))
				}
			case <-time.After(stopGrace):
				p.kill()
				errs = append(errs, fmt.Errorf("redis-server %s still running %v after SIGTERM: killed", s.Addr(), stopGrace))
			}
		}
	}
	if s.ownDir {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	s.stopErr = errors.Join(errs...)
	return s.stopErr
}

// logTail returns the last ten lines of the server's log, for an error, or "" when it
// has none.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logFile)
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	return "; its log ends:\n" + strings.Join(lines[max(0, len(lines)-10):], "\n")
}
