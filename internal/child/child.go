// Package child builds the repository's binaries with the go command and runs them as
// child processes that log JSON lines: it waits for the line that says a process
// serves and hands over its fields (the listen addresses), passes every line on, and
// stops the process with SIGTERM, then SIGKILL after a grace period. It is the one
// place the repository builds a binary or runs one as a child: the benchmark's soak
// and, through internal/testkit/bintest, the tests.
package child

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// GoCommand returns the go command of the toolchain this program was built with
// (GOROOT/bin/go) when it exists, else the one on PATH.
func GoCommand() (string, error) {
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err == nil {
		return goBin, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("no go command (GOROOT/bin/go or on PATH): %w", err)
	}
	return goBin, nil
}

// Build builds the main package pkg into dir with the extra build flags (e.g. -ldflags)
// and returns the binary's path, named after pkg's last element. pkg is an import path
// such as github.com/mdproxy/mdproxy/cmd/mdproxy (the working directory must be inside
// the module), or a directory path starting with "." or "/": the main package of a
// module of its own (tools/helm), built from that directory. When ctx ends the build is
// interrupted, and killed 10 s later. The error carries the go command's output.
func Build(ctx context.Context, dir, pkg string, flags ...string) (string, error) {
	goBin, err := GoCommand()
	if err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	out, err := filepath.Abs(filepath.Join(dir, filepath.Base(pkg)))
	if err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	if runtime.GOOS == "windows" {
		out += ".exe"
	}
	target, moduleDir := pkg, ""
	if strings.HasPrefix(pkg, ".") || filepath.IsAbs(pkg) {
		target, moduleDir = ".", pkg
	}
	args := append(append([]string{"build", "-o", out}, flags...), target)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = moduleDir
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %w: %s", pkg, err, bytes.TrimSpace(b))
	}
	return out, nil
}

// Options is how Start runs a binary.
type Options struct {
	// Args are the command-line arguments, without the binary's name.
	Args []string
	// Env is the child's whole environment, as "NAME=value"; nil: an empty one (the
	// parent's environment is never passed on unasked).
	Env []string
	// Ready is the msg of the JSON log line (on stdout or stderr) after which the
	// child serves, e.g. "mdproxy serving"; Start returns once it is written. Empty:
	// Start returns once the child is started.
	Ready string
	// Log receives every line the child writes on stderr, and on stdout unless Stdout
	// is set, each with its newline in one Write; nil: the lines are dropped.
	Log io.Writer
	// Stdout, when set, receives the child's stdout as written, apart from Log (and
	// not looked at for Ready).
	Stdout io.Writer
	// Timeout bounds the wait for Ready. Zero: 30 s.
	Timeout time.Duration
	// Name is what errors call the child; empty: the binary's file name.
	Name string
	// Dir is the child's working directory; empty: the parent's.
	Dir string
	// Group runs the child in a process group of its own (on Linux, killed should the
	// parent die), so that Stop also ends the processes it started (nginx's workers).
	Group bool
}

// Proc is a child process started by Start. Its methods are safe for concurrent use.
type Proc struct {
	// Cmd is the child's command; its Process is set.
	Cmd *exec.Cmd
	// Ready holds the fields of the Ready line (e.g. "listen", "admin"); nil without
	// Options.Ready.
	Ready map[string]any

	group    bool          // Options.Group
	done     chan struct{} // closed once the child has exited and been waited for
	waitErr  error         // Wait's result, set before done is closed
	stopOnce sync.Once
}

// Start runs bin with opts and, with opts.Ready, returns once the child logged that
// line. On an error (it could not start, it exited first, the timeout or ctx ended
// first) the child has been stopped and waited for, and the error carries the last
// lines it wrote. Ending ctx later does not stop the child: Stop does.
func Start(ctx context.Context, bin string, opts Options) (*Proc, error) {
	name := cmp.Or(opts.Name, filepath.Base(bin))
	cmd := exec.Command(bin, opts.Args...)
	cmd.Env = opts.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	lw := &lineWriter{ready: opts.Ready, out: opts.Log, readyc: make(chan map[string]any, 1)}
	cmd.Stdout, cmd.Stderr = lw, lw
	if opts.Stdout != nil {
		cmd.Stdout = opts.Stdout
	}
	cmd.Dir = opts.Dir
	if opts.Group {
		cmd.SysProcAttr = groupAttr()
	}
	cmd.WaitDelay = 5 * time.Second // a grandchild holding the pipes open
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Cmd: cmd, group: opts.Group, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		lw.flush()
		close(p.done)
	}()
	if opts.Ready == "" {
		return p, nil
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case p.Ready = <-lw.readyc:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited at start (%v), before logging %q; its last lines:\n%s", name, p.waitErr, opts.Ready, lw.tail())
	case <-timer.C:
		err := p.Stop(5 * time.Second)
		return nil, fmt.Errorf("%s did not log %q within %v (stopped: %v); its last lines:\n%s", name, opts.Ready, timeout, err, lw.tail())
	case <-ctx.Done():
		_ = p.Stop(5 * time.Second)
		return nil, ctx.Err()
	}
}

// Field returns the string field key of the Ready line ("" when absent).
func (p *Proc) Field(key string) string {
	s, _ := p.Ready[key].(string)
	return s
}

// Done returns a channel closed once the child has exited and been waited for.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns Wait's error (nil for exit status 0) once Done is closed; nil before.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// ExitCode returns the child's exit code once Done is closed, -1 before or when it was
// ended by a signal.
func (p *Proc) ExitCode() int {
	if !p.Exited() {
		return -1
	}
	return p.Cmd.ProcessState.ExitCode()
}

// Signal sends sig to the child; an error once it has exited.
func (p *Proc) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop ends the child, if it still runs, with SIGTERM, and with SIGKILL after grace;
// waits for it; and returns Wait's error (nil for exit status 0). With Options.Group
// the signals go to its process group, and whatever is left of the group once the
// child has exited is killed. It is idempotent.
func (p *Proc) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		if !p.Exited() {
			p.signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			select {
			case <-p.done:
			case <-t.C:
				p.signal(syscall.SIGKILL)
				<-p.done
			}
		}
		if p.group {
			killGroup(p.Cmd.Process.Pid)
		}
	})
	<-p.done
	return p.waitErr
}

// signal sends sig to the child, or to its process group with Options.Group.
func (p *Proc) signal(sig syscall.Signal) {
	if p.group {
		signalGroup(p.Cmd.Process.Pid, sig)
		return
	}
	_ = p.Cmd.Process.Signal(sig)
}

// lineWriter takes the child's output: it passes whole lines on, hands over the
// fields of the first Ready line and keeps the last lines for errors. Safe for
// concurrent use (stdout and stderr are copied by two goroutines).
type lineWriter struct {
	ready  string
	out    io.Writer
	readyc chan map[string]any // capacity 1, sent once

	mu      sync.Mutex
	partial []byte
	last    []string // the last 20 lines
	seen    bool     // the Ready line was seen
}

// maxLine is the longest line kept whole; a longer one is passed on in parts.
const maxLine = 1 << 20

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(w.partial[:i+1])
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > maxLine {
		w.line(append(w.partial, '\n'))
		w.partial = nil
	}
	w.partial = bytes.Clone(w.partial)
	return len(b), nil
}

// line takes one line with its newline; the caller holds w.mu.
func (w *lineWriter) line(l []byte) {
	if len(w.last) == 20 {
		w.last = w.last[1:]
	}
	w.last = append(w.last, string(bytes.TrimSuffix(l, []byte("\n"))))
	if w.ready != "" && !w.seen {
		var rec map[string]any
		if json.Unmarshal(l, &rec) == nil && rec["msg"] == w.ready {
			w.seen = true
			w.readyc <- rec
		}
	}
	if w.out != nil {
		_, _ = w.out.Write(bytes.Clone(l))
	}
}

// flush passes on a last line that has no newline, as it was written.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 && w.out != nil {
		_, _ = w.out.Write(w.partial)
	}
	w.partial = nil
}

func (w *lineWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.last, "\n")
}
