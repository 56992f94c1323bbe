package main

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/mdproxy/mdproxy/internal/testkit/bintest"
)

// TestMain fails the package when a test leaves a goroutine behind, and removes the
// binary the tests built.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { bintest.RemoveBuilt() }))
}

// TestBinary runs the built coresim as an operator would: its command line and the exit
// code of a bad setting. What it serves is tested in package coresim, through Run.
func TestBinary(t *testing.T) {
	// Stamped as the Dockerfile stamps an image, from its VERSION and REVISION.
	const version, revision = "1.2.3-test", "0123456789abcdef"
	bin := bintest.Build(t, bintest.Module+"/cmd/coresim", "-ldflags",
		"-X github.com/mdproxy/mdproxy/metrics.Version="+version+" -X github.com/mdproxy/mdproxy/metrics.Revision="+revision)

	// --version and --help print to stdout and exit 0 without serving; any other
	// argument exits 2 with a usage line on stderr, as a bad setting does with the
	// variable's name.
	for _, tc := range []struct {
		args   []string
		env    map[string]string
		code   int
		stdout []string // each must appear; none: stdout must be empty
		stderr []string // each must appear; none: stderr must be empty
	}{
		{args: []string{"--version"}, stdout: []string{"coresim " + version + " (revision " + revision + ", " + runtime.Version() + ")\n"}},
		{args: []string{"--help"}, stdout: []string{"emulates OPSWAT MetaDefender Core", "CORESIM_SPEEDUP", "CORESIM_FETCH_LIMIT", "docs/coresim.md", "-version"}},
		{args: []string{"-h"}, stdout: []string{"emulates OPSWAT MetaDefender Core", "CORESIM_LISTEN_ADDR", "docs/coresim.md"}},
		{args: []string{"--speedup=10"}, code: 2, stderr: []string{"-speedup", "usage: coresim"}},
		{args: []string{"run"}, code: 2, stderr: []string{`"run"`, "usage: coresim"}},
		{env: map[string]string{"CORESIM_CORES": "0"}, code: 2, stderr: []string{"CORESIM_CORES", `"level":"ERROR"`, `"msg":"coresim failed"`}}, // one JSON line
	} {
		t.Run(strings.Join(slices.Concat(tc.args, envList(tc.env)), " "), func(t *testing.T) {
			t.Parallel()
			// Should it serve instead, it does so on free ports until the safety bound.
			env := map[string]string{"CORESIM_LISTEN_ADDR": "127.0.0.1:0", "CORESIM_ADMIN_ADDR": ""}
			for k, v := range tc.env {
				env[k] = v
			}
			res := bintest.Run(t, bin, env, tc.args...)
			if res.Code != tc.code {
				t.Errorf("coresim %q with %q exit code = %d, want %d; stderr:\n%s", tc.args, tc.env, res.Code, tc.code, res.Stderr)
			}
			for _, s := range []struct {
				name string
				got  string
				want []string
			}{{"stdout", res.Stdout, tc.stdout}, {"stderr", res.Stderr, tc.stderr}} {
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

// envList returns env as NAME=value entries, for a test's name.
func envList(env map[string]string) []string { return bintest.Environ(env) }
