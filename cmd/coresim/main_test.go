package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// safety bounds a run of the binary that only a broken program would reach.
const safety = 30 * time.Second

// TestBinary runs the built coresim as an operator would: its command line and the exit
// code of a bad setting. What it serves is tested in package coresim, through Run.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		if goBin, err = exec.LookPath("go"); err != nil {
			t.Skipf("no go command to build coresim: %v", err)
		}
	}
	// Stamped as the Dockerfile stamps an image, from its VERSION and REVISION.
	const version, revision = "1.2.3-test", "0123456789abcdef"
	bin := filepath.Join(t.TempDir(), "coresim")
	out, err := exec.Command(goBin, "build", "-o", bin, "-ldflags",
		"-X github.com/mdproxy/mdproxy/metrics.Version="+version+" -X github.com/mdproxy/mdproxy/metrics.Revision="+revision,
		".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// --version and --help print to stdout and exit 0 without serving; any other
	// argument exits 2 with a usage line on stderr, as a bad setting does with the
	// variable's name.
	for _, tc := range []struct {
		args   []string
		env    []string
		code   int
		stdout []string // each must appear; none: stdout must be empty
		stderr []string // each must appear; none: stderr must be empty
	}{
		{args: []string{"--version"}, stdout: []string{"coresim " + version + " (revision " + revision + ", " + runtime.Version() + ")\n"}},
		{args: []string{"--help"}, stdout: []string{"emulates OPSWAT MetaDefender Core", "CORESIM_SPEEDUP", "CORESIM_FETCH_LIMIT", "README", "-version"}},
		{args: []string{"-h"}, stdout: []string{"emulates OPSWAT MetaDefender Core", "CORESIM_LISTEN_ADDR", "README"}},
		{args: []string{"--speedup=10"}, code: 2, stderr: []string{"-speedup", "usage: coresim"}},
		{args: []string{"run"}, code: 2, stderr: []string{`"run"`, "usage: coresim"}},
		{env: []string{"CORESIM_CORES=0"}, code: 2, stderr: []string{"CORESIM_CORES", `"level":"ERROR"`, `"msg":"coresim failed"`}}, // one JSON line
	} {
		t.Run(strings.Join(slices.Concat(tc.args, tc.env), " "), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), safety)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tc.args...)
			// Should it serve instead, it does so on free ports until the safety bound.
			cmd.Env = append([]string{"CORESIM_LISTEN_ADDR=127.0.0.1:0", "CORESIM_ADMIN_ADDR="}, tc.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("running coresim %q: %v", tc.args, err)
			}
			if code != tc.code {
				t.Errorf("coresim %q with %q exit code = %d, want %d; stderr:\n%s", tc.args, tc.env, code, tc.code, stderr.String())
			}
			for _, s := range []struct {
				name string
				got  string
				want []string
			}{{"stdout", stdout.String(), tc.stdout}, {"stderr", stderr.String(), tc.stderr}} {
				for _, want := range s.want {
					if !strings.Contains(s.got, want) {
						t.Errorf("coresim %q with %q %s = %q, want it to contain %q", tc.args, tc.env, s.name, s.got, want)
					}
				}
				if len(s.want) == 0 && s.got != "" {
					t.Errorf("coresim %q with %q %s = %q, want nothing", tc.args, tc.env, s.name, s.got)
				}
			}
		})
	}
}
