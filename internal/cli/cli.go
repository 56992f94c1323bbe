// Package cli reads the command line of mdproxy's and coresim's binaries, whose settings
// are environment variables: the only arguments are --version and -h/--help.
package cli

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/mdproxy/mdproxy/metrics"
)

// Usage returns the one-line usage of the binary name whose variables start with
// prefix, e.g. "usage: mdproxy [--version | --help]; settings are MDPROXY_* environment
// variables", with its newline.
func Usage(name, prefix string) string {
	return fmt.Sprintf("usage: %s [--version | --help]; settings are %s* environment variables\n", name, prefix)
}

// Parse reads args (os.Args[1:]) for the binary name. --version prints the version, the
// VCS revision and the Go version (metrics.BuildVersion: the link-time stamps of the
// Dockerfile, else the binary's build information), and -h or --help prints help and
// the flags, to stdout: then exit is true and code 0. Any other argument (one that asks
// for nothing included: --help=false, --version=false, --) prints an error
// and usage to stderr: exit is true and code 2. Without arguments exit is false: the
// binary runs. It is built on the standard library's flag package.
func Parse(name, help, usage string, args []string, stdout, stderr io.Writer) (code int, exit bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // what to print, and where, is decided below
	version := fs.Bool("version", false, "print the version, the VCS revision and the Go version, then exit")
	// Defined rather than left to flag's built-in -h and -help, which would print help
	// for -help=false too.
	wantHelp := fs.Bool("help", false, "print this help, then exit")
	fs.BoolVar(wantHelp, "h", false, "print this help, then exit")
	err := fs.Parse(args)
	switch {
	case err == nil && fs.NArg() > 0:
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case err == nil && !*version && !*wantHelp && len(args) > 0:
		// "--version=false", "--help=false" or a lone "--": an argument that asks for
		// nothing would start the binary as if it had been understood.
		err = fmt.Errorf("unexpected argument %q", args[0])
	}
	switch {
	case err == nil && *wantHelp:
		fmt.Fprint(stdout, help)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return 0, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n%s", name, err, usage)
		return 2, true
	case *version:
		v, rev, goVersion := metrics.BuildVersion()
		fmt.Fprintf(stdout, "%s %s (revision %s, %s)\n", name, v, rev, goVersion)
		return 0, true
	}
	return 0, false
}

// Wrap joins words with ", " into lines of at most about 80 columns, each indented by two
// spaces and the last ending in a newline: the lists of variables and routes in a help.
func Wrap(words []string) string {
	var b strings.Builder
	line := 0
	for i, w := range words {
		switch {
		case i == 0:
		case line+2+len(w) > 78:
			b.WriteString(",\n")
			line = 0
		default:
			b.WriteString(", ")
			line += 2
		}
		if line == 0 {
			b.WriteString("  ")
			line = 2
		}
		b.WriteString(w)
		line += len(w)
	}
	b.WriteString("\n")
	return b.String()
}

// Fill wraps text into lines of at most width columns (a word longer than that on a
// line of its own), each starting with indent, the last ending in a newline.
func Fill(text, indent string, width int) string {
	var b strings.Builder
	line := 0
	for _, w := range strings.Fields(text) {
		if line > 0 && line+1+len(w) > width {
			b.WriteString("\n")
			line = 0
		}
		if line == 0 {
			b.WriteString(indent)
			line = len(indent)
		} else {
			b.WriteString(" ")
			line++
		}
		b.WriteString(w)
		line += len(w)
	}
	b.WriteString("\n")
	return b.String()
}
