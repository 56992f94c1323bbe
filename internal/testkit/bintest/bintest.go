// Package bintest is the tests' way to build one of the repository's binaries once per
// test run and run it as a child process (through package child): started with its
// environment, waited for until it logs that it serves, its log captured, and stopped
// at the test's cleanup. It is for tests only.
package bintest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/child"
	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// Module is the import path of the repository's module; Build takes the path of a
// main package below it, e.g. Module+"/cmd/mdproxy".
const Module = "github.com/mdproxy/mdproxy"

var built struct {
	mu   sync.Mutex
	dirs []string          // to remove
	bins map[string]*build // by package and flags
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build returns the path of the main package pkg (an import path) built with the
// extra build flags, once per test binary run: the tests of a package share it. The
// directory it is built in is removed by RemoveBuilt, which the package's TestMain
// calls. It skips t in -short mode and fails t when the build fails.
func Build(t testing.TB, pkg string, flags ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs a binary")
	}
	key := strings.Join(append([]string{pkg}, flags...), "\x00")
	built.mu.Lock()
	if built.bins == nil {
		built.bins = map[string]*build{}
	}
	b := built.bins[key]
	if b == nil {
		b = &build{}
		built.bins[key] = b
	}
	built.mu.Unlock()
	b.once.Do(func() {
		// A directory a build: builds with other flags have the same name.
		dir, err := os.MkdirTemp("", "bintest-")
		if err != nil {
			b.err = err
			return
		}
		built.mu.Lock()
		built.dirs = append(built.dirs, dir)
		built.mu.Unlock()
		b.path, b.err = child.Build(context.Background(), dir, pkg, flags...)
	})
	if b.err != nil {
		t.Fatalf("go build: %v", b.err)
	}
	return b.path
}

// RemoveBuilt removes what Build built; a package's TestMain calls it after its tests.
func RemoveBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	for _, d := range built.dirs {
		os.RemoveAll(d)
	}
	built.dirs, built.bins = nil, nil
}

// Proc is a child started by Start, with everything it logged.
type Proc struct {
	*child.Proc
	// Logs holds every line the child wrote on stdout and stderr.
	Logs *sidecartest.LogBuffer
}

// Start runs bin with env (a map of variables: the child's whole environment) and
// opts' other fields, waits for opts.Ready as child.Start does, and fails t when the
// child does not get there. Cleanup stops the child (SIGTERM, then SIGKILL after
// sidecartest.Safety) and waits for it. opts.Env and opts.Log are set by Start: the
// log goes to Proc.Logs, and to opts.Log too when it is set.
func Start(t testing.TB, bin string, env map[string]string, opts child.Options) *Proc {
	t.Helper()
	p := &Proc{Logs: &sidecartest.LogBuffer{}}
	opts.Env = Environ(env)
	if opts.Log != nil {
		opts.Log = multiWriter{p.Logs, opts.Log}
	} else {
		opts.Log = p.Logs
	}
	if opts.Timeout == 0 {
		opts.Timeout = sidecartest.Safety
	}
	cp, err := child.Start(context.Background(), bin, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.Proc = cp
	t.Cleanup(func() { _ = cp.Stop(sidecartest.Safety) })
	return p
}

type multiWriter [2]io.Writer

func (m multiWriter) Write(b []byte) (int, error) {
	_, _ = m[0].Write(b)
	return m[1].Write(b)
}

// Wait returns the child's exit code once it exited, failing t after
// sidecartest.Safety.
func (p *Proc) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-p.Done():
		return ExitCode(t, p.Err())
	case <-time.After(sidecartest.Safety):
		t.Fatalf("%s did not exit within %v", p.Cmd.Path, sidecartest.Safety)
		return -1
	}
}

// Send sends sig to the child, failing t when it cannot.
func (p *Proc) Send(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// Result is how a run of a binary ended, as Run returns it.
type Result struct {
	Code           int // the exit code
	Stdout, Stderr string
}

// Run runs bin with args and env (the child's whole environment) to its end, bounded
// by sidecartest.Safety, and returns its exit code and output. It fails t when the
// binary cannot be run or was killed.
func Run(t testing.TB, bin string, env map[string]string, args ...string) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	p, err := child.Start(context.Background(), bin, child.Options{Args: args, Env: Environ(env), Stdout: &stdout, Log: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(sidecartest.Safety):
		t.Errorf("%s %q did not exit within %v", bin, args, sidecartest.Safety)
		_ = p.Stop(0)
	}
	return Result{Code: ExitCode(t, p.Err()), Stdout: stdout.String(), Stderr: stderr.String()}
}

// ExitCode returns the exit code of a finished command's Run or Wait error, failing t
// for any other error (the command could not start, or a signal ended it).
func ExitCode(t testing.TB, err error) int {
	t.Helper()
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() < 0 {
		t.Fatalf("running the binary: %v", err)
	}
	return ee.ExitCode()
}

// Environ returns env as "NAME=value" entries in the order of the names; an empty,
// non-nil slice for none.
func Environ(env map[string]string) []string {
	out := []string{}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}
