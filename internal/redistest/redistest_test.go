package redistest

import (
	"context"
	"os"
	"runtime"
	"strings"
	"sync"
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

// ping asks the server at s PING with a client of t's, for at most d, and returns the
// error.
func ping(t *testing.T, s *Server, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.Client(t).Ping(ctx).Err()
}

// alive reports whether a process with pid exists (and is not a zombie of ours: Stop
// and the clean-up reap it).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func TestStartStopRestart(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process checks use kill(pid, 0)")
	}
	var pids []int
	t.Run("server", func(t *testing.T) {
		s := Start(t)
		if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
			t.Errorf("URL() = %q, want %q", s.URL(), want)
		}
		if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
			t.Errorf("Addr() = %q, want 127.0.0.1:port", s.Addr())
		}
		if err := ping(t, s, 2*time.Second); err != nil {
			t.Fatalf("PING after Start = %v, want PONG", err)
		}
		rdb := s.Client(t)
		ctx := context.Background()
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatalf("SET k = %v", err)
		}
		pid := s.pid()
		pids = append(pids, pid)

		s.Stop()
		if alive(pid) {
			t.Errorf("redis-server (pid %d) alive after Stop", pid)
		}
		if s.pid() != 0 {
			t.Errorf("pid() after Stop = %d, want 0", s.pid())
		}
		if err := ping(t, s, 200*time.Millisecond); err == nil {
			t.Errorf("PING after Stop answered, want an error")
		}
		s.Stop() // twice is fine

		addr := s.Addr()
		s.Restart()
		if s.Addr() != addr {
			t.Errorf("Addr() after Restart = %q, want %q (the same port)", s.Addr(), addr)
		}
		pids = append(pids, s.pid())
		// The client made before the outage works again, on an empty server.
		if err := rdb.Ping(ctx).Err(); err != nil {
			// A pooled connection may have been cut: one error, then it reconnects.
			if err := rdb.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING after Restart = %v, want PONG", err)
			}
		}
		if err := rdb.Get(ctx, "k").Err(); err == nil {
			t.Errorf("GET k after Restart found it, want an empty server (nothing persisted)")
		}
		files, _ := os.ReadDir(s.dir)
		for _, f := range files {
			if !strings.HasSuffix(f.Name(), ".log") {
				t.Errorf("%s in the server's directory, want only logs (no snapshot, no AOF)", f.Name())
			}
		}
	})
	for _, pid := range pids {
		if pid == 0 || alive(pid) {
			t.Errorf("redis-server (pid %d) alive after the test's clean-up, want none", pid)
		}
	}
}

// TestParallelServers: two servers at once get two ports.
func TestParallelServers(t *testing.T) {
	a, b := Start(t), Start(t)
	if a.Addr() == b.Addr() {
		t.Fatalf("two servers on %s", a.Addr())
	}
	for _, s := range []*Server{a, b} {
		if err := ping(t, s, 2*time.Second); err != nil {
			t.Errorf("PING %s = %v", s.Addr(), err)
		}
	}
}

// fakeTB records Skip and Fatal and ends the goroutine as testing does.
type fakeTB struct {
	testing.TB
	mu      sync.Mutex
	skipped string
	failed  string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skip(args ...any) {
	f.mu.Lock()
	f.skipped = args[0].(string)
	f.mu.Unlock()
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.mu.Lock()
	f.failed = args[0].(string)
	f.mu.Unlock()
	runtime.Goexit()
}

// TestMissingServer: without redis-server, Start skips, or fails when CI is set.
func TestMissingServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	old := serverPath
	serverPath = "/nonexistent/redis-server"
	t.Cleanup(func() { serverPath = old })
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		f := &fakeTB{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Start(f)
			f.failed = "Start returned"
		}()
		<-done
		if ci == "" {
			if f.failed != "" || !strings.Contains(f.skipped, "redis-server not found") {
				t.Errorf("without CI: skipped %q, failed %q, want a skip that names redis-server", f.skipped, f.failed)
			}
		} else {
			if f.skipped != "" || !strings.Contains(f.failed, "CI is set") {
				t.Errorf("with CI: skipped %q, failed %q, want a failure that says CI is set", f.skipped, f.failed)
			}
		}
	}
}
