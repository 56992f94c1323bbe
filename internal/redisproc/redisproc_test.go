package redisproc

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: the one that waits
// for a redis-server, a client's.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start starts a server for t, skipping t without redis-server (internal/redistest,
// which fails under CI, covers that case), and stops it at t's end.
func start(t *testing.T, opts Options) *Server {
	t.Helper()
	if _, err := Find(DefaultPath); err != nil {
		t.Skipf("%v; skipping", err)
	}
	s, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("Start = %v", err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	return s
}

// refused reports whether addr refuses a connection.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err != nil
}

// TestKillRestartStop: Kill is an outage that Restart ends on the same port; Stop is
// final, clean, idempotent and removes the directory Start made.
func TestKillRestartStop(t *testing.T) {
	s := start(t, Options{})
	if !strings.HasPrefix(s.URL(), "redis://127.0.0.1:") || !strings.HasSuffix(s.URL(), "/0") {
		t.Errorf("URL() = %q, want redis://127.0.0.1:port/0", s.URL())
	}
	addr, pid := s.Addr(), s.Pid()
	if pid <= 0 {
		t.Fatalf("Pid() = %d after Start, want the process's", pid)
	}
	s.Kill()
	s.Kill() // twice is fine
	if s.Pid() != 0 || !refused(addr) {
		t.Errorf("after Kill: Pid() = %d, %s refused: %v; want 0 and refused", s.Pid(), addr, refused(addr))
	}
	if err := s.Restart(context.Background()); err != nil {
		t.Fatalf("Restart = %v", err)
	}
	if s.Addr() != addr || s.Pid() == 0 || s.Pid() == pid || refused(addr) {
		t.Errorf("after Restart: %s, pid %d (was %s, %d), want the same address, a new process", s.Addr(), s.Pid(), addr, pid)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop = %v, want a clean stop", err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop again = %v, want the first one's nil", err)
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the server's directory after Stop: %v, want it removed", err)
	}
	if !refused(addr) {
		t.Errorf("%s accepts connections after Stop", addr)
	}
	if err := s.Restart(context.Background()); err == nil {
		t.Errorf("Restart after Stop = nil, want an error")
	}
}

// TestStopAfterCrash: Stop reports a server that exited on its own, and leaves a
// directory it was given.
func TestStopAfterCrash(t *testing.T) {
	dir := t.TempDir()
	s := start(t, Options{Dir: dir})
	if err := syscall.Kill(s.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-s.proc.done // reaped, so that Stop sees the crash
	if err := s.Stop(); err == nil || !strings.Contains(err.Error(), "exited before its stop") {
		t.Errorf("Stop after a crash = %v, want an error that says so", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the caller's directory after Stop: %v, want it kept", err)
	}
}

// TestExitedEarly: a port taken by someone else makes redis-server exit, which run
// reports as errExited rather than waiting out startTimeout.
func TestExitedEarly(t *testing.T) {
	s := start(t, Options{Dir: t.TempDir()})
	other := &Server{bin: s.bin, dir: t.TempDir(), port: s.port}
	other.logFile = other.dir + "/redis.log"
	begin := time.Now()
	_, err := other.run(context.Background())
	if !errors.Is(err, errExited) {
		t.Fatalf("run on a taken port = %v, want errExited", err)
	}
	if d := time.Since(begin); d > startTimeout/2 {
		t.Errorf("run on a taken port took %v, want it to notice the exit early", d)
	}
	if !strings.Contains(err.Error(), "in use") {
		t.Logf("the error does not quote the log's reason: %v", err)
	}
}

// TestNotFound: without redis-server, Find's error wraps ErrNotFound and names Debian's
// package.
func TestNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Find("/nonexistent/redis-server")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Errorf("Find without redis-server = %v, want ErrNotFound naming the Debian package", err)
	}
}
