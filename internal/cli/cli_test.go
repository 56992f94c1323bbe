package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestParse: --version and -h/--help print and exit 0; no argument runs the binary;
// anything else, an argument that asks for nothing included ("--version=false",
// "--help=false", "--"),
// exits 2 with usage on stderr rather than start the binary as if understood.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		exit bool
		out  string // in stdout, or stderr for code 2
	}{
		{nil, 0, false, ""},
		{[]string{"--version"}, 0, true, "tool "},
		{[]string{"-version"}, 0, true, "tool "},
		{[]string{"--version=true"}, 0, true, "tool "},
		{[]string{"-h"}, 0, true, "HELP"},
		{[]string{"--help"}, 0, true, "HELP"},
		{[]string{"--help=true"}, 0, true, "HELP"},
		{[]string{"--version=false"}, 2, true, "usage:"},
		{[]string{"--help=false"}, 2, true, "usage:"},
		{[]string{"-h=false"}, 2, true, "usage:"},
		{[]string{"--"}, 2, true, "usage:"},
		{[]string{"--", "--version"}, 2, true, "usage:"},
		{[]string{"serve"}, 2, true, "usage:"},
		{[]string{"--verbose"}, 2, true, "usage:"},
	} {
		var stdout, stderr bytes.Buffer
		code, exit := Parse("tool", "HELP\n", Usage("tool", "TOOL_"), tc.args, &stdout, &stderr)
		if code != tc.code || exit != tc.exit {
			t.Errorf("Parse(%q) = %d, %v; want %d, %v (stderr %q)", tc.args, code, exit, tc.code, tc.exit, stderr.String())
		}
		got := stdout.String()
		if tc.code == 2 {
			got = stderr.String()
		}
		if !strings.Contains(got, tc.out) {
			t.Errorf("Parse(%q) printed %q, want %q in it", tc.args, got, tc.out)
		}
	}
}

func TestFill(t *testing.T) {
	got := Fill("one two three four five six", "  ", 14)
	want := "  one two\n  three four\n  five six\n"
	if got != want {
		t.Errorf("Fill = %q, want %q", got, want)
	}
}
