package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the command line.
type config struct {
	duration, warmup    time.Duration
	rounds              int
	targets             map[string]bool // groups: bare, mdproxy, nginx, haproxy, caddy
	workloads           map[string]bool // limit, forward, upload, storehit, rss
	uploadSize, rssSize int64
	rssUploads          int
	connections         int
	threads             int
	loadCPU, proxyCPU   int
	out                 string
	mdproxyBin          string
	check               bool
	bins                map[string]string // nginx, haproxy, caddy, wrk, taskset
	command             string            // the command line, for the report
	variants            []variant         // -variant: more mdproxy configurations, measured beside it
}

// variant is an mdproxy built or configured otherwise (-variant name=bin[,K=V...]):
// each of its rows is measured in the same rounds as mdproxy's and compared with it
// round by round, to tell what a piece of mdproxy's machinery buys on this machine.
type variant struct {
	name string
	bin  string   // the binary; "": the mdproxy binary the other rows run
	env  []string // K=V added to each of its processes' environment
}

// parseVariant reads a -variant value: name=bin[,K=V...], bin empty for mdproxy's own.
func parseVariant(s string) (variant, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" || strings.ContainsAny(name, " ~,") {
		return variant{}, fmt.Errorf("%q: want name=binary[,KEY=VALUE...] (binary empty: mdproxy's own)", s)
	}
	parts := strings.Split(rest, ",")
	v := variant{name: name, bin: parts[0]}
	for _, kv := range parts[1:] {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return variant{}, fmt.Errorf("%q: %q is not KEY=VALUE", s, kv)
		}
		v.env = append(v.env, kv)
	}
	if v.bin != "" {
		abs, err := filepath.Abs(v.bin)
		if err != nil {
			return variant{}, err
		}
		v.bin = abs
	}
	return v, nil
}

var (
	allTargets   = []string{"bare", "mdproxy", "nginx", "haproxy", "caddy"}
	allWorkloads = []string{"limit", "forward", "upload", "storehit", "rss"}
)

// parseFlags reads the command line.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{bins: map[string]string{}}
	fs.DurationVar(&cfg.duration, "duration", 4*time.Second, "length of each wrk measurement (whole seconds)")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "wrk run before each measurement, not counted (whole seconds; 0: none)")
	fs.IntVar(&cfg.rounds, "rounds", 11, "interleaved rounds: every target once a round; the median is reported, and each ratio is the median of the rounds' ratios")
	targets := fs.String("targets", strings.Join(allTargets, ","), "targets to run, comma-separated: "+strings.Join(allTargets, ", ")+
		" (bare: the bare 503 servers, the bare ReverseProxy, the TCP relays and direct uploads, the ceilings)")
	workloads := fs.String("workloads", strings.Join(allWorkloads, ","), "workloads to run, comma-separated: "+strings.Join(allWorkloads, ", "))
	uploadSize := fs.String("upload-size", "1GiB", "bytes of each upload of the upload workload (suffixes KiB, MiB, GiB)")
	rssSize := fs.String("rss-size", "200MiB", "bytes of each upload of the RSS workload")
	fs.IntVar(&cfg.rssUploads, "rss-uploads", 10, "concurrent uploads of the RSS workload")
	fs.IntVar(&cfg.connections, "connections", 64, "wrk's -c")
	fs.IntVar(&cfg.threads, "threads", 2, "wrk's -t")
	fs.IntVar(&cfg.loadCPU, "load-cpu", 0, "CPU of wrk, the upload client and the stand-in upstream")
	fs.IntVar(&cfg.proxyCPU, "proxy-cpu", 1, "CPU of the proxy under test (every proxy and bare server)")
	fs.StringVar(&cfg.out, "out", "", "also write the Markdown report to this file")
	fs.StringVar(&cfg.mdproxyBin, "mdproxy-bin", "", "mdproxy binary to run (default: go build ./cmd/mdproxy into a temporary directory)")
	fs.BoolVar(&cfg.check, "check", false, "exit 1 when an acceptance criterion fails")
	fs.Func("variant", "name=binary[,KEY=VALUE...]: also measure mdproxy as this binary (empty: mdproxy's own) with these variables, beside mdproxy in the same rounds (repeatable)", func(s string) error {
		v, err := parseVariant(s)
		if err == nil {
			cfg.variants = append(cfg.variants, v)
		}
		return err
	})
	for _, b := range []struct{ name, def string }{
		{"nginx", "/usr/sbin/nginx"}, {"haproxy", "/usr/sbin/haproxy"}, {"caddy", "/usr/bin/caddy"},
		{"wrk", "/usr/bin/wrk"}, {"taskset", "/usr/bin/taskset"},
	} {
		cfg.bins[b.name] = b.def
		fs.Func(b.name+"-bin", fmt.Sprintf("path of %s (default %s)", b.name, b.def), func(s string) error {
			cfg.bins[b.name] = s
			return nil
		})
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if cfg.targets, err = set(*targets, allTargets); err != nil {
		return cfg, fmt.Errorf("-targets: %w", err)
	}
	if cfg.workloads, err = set(*workloads, allWorkloads); err != nil {
		return cfg, fmt.Errorf("-workloads: %w", err)
	}
	if cfg.uploadSize, err = parseSize(*uploadSize); err != nil {
		return cfg, fmt.Errorf("-upload-size: %w", err)
	}
	if cfg.rssSize, err = parseSize(*rssSize); err != nil {
		return cfg, fmt.Errorf("-rss-size: %w", err)
	}
	switch {
	case cfg.duration < time.Second:
		return cfg, errors.New("-duration: want at least 1s (wrk counts whole seconds)")
	case cfg.warmup < 0:
		return cfg, errors.New("-warmup: want 0 or more")
	case cfg.rounds < 1:
		return cfg, errors.New("-rounds: want at least 1")
	case cfg.rssUploads < 1:
		return cfg, errors.New("-rss-uploads: want at least 1")
	case cfg.connections < 1 || cfg.threads < 1 || cfg.connections < cfg.threads:
		return cfg, errors.New("-connections and -threads: want connections >= threads >= 1")
	}
	if cfg.mdproxyBin != "" {
		// Processes run in the temporary directory: a relative path would miss.
		if cfg.mdproxyBin, err = filepath.Abs(cfg.mdproxyBin); err != nil {
			return cfg, fmt.Errorf("-mdproxy-bin: %w", err)
		}
	}
	cfg.command = "go run ./bench/peers"
	for _, a := range args {
		cfg.command += " " + shellQuote(a)
	}
	return cfg, nil
}

// set reads a comma-separated list of names out of known.
func set(list string, known []string) (map[string]bool, error) {
	m := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		found := false
		for _, k := range known {
			found = found || k == s
		}
		if !found {
			return nil, fmt.Errorf("unknown %q, want some of %s", s, strings.Join(known, ", "))
		}
		m[s] = true
	}
	return m, nil
}

// parseSize reads a byte count: a whole number and an optional KiB, MiB or GiB.
func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("want a positive whole number of bytes, KiB, MiB or GiB, e.g. 1GiB")
	}
	return n * mult, nil
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=,:@+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	b, err := run(ctx, cfg, logf)
	if err != nil {
		stop()
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
	md := b.markdown()
	fmt.Print(md)
	if cfg.out != "" {
		if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "peers:", err)
			os.Exit(1)
		}
	}
	if cfg.check && b.failed() {
		os.Exit(1)
	}
}

// present reports whether bin can be run; "" when it can, else why not.
func present(bin string) string {
	if bin == "" {
		return "no path given"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return bin + " not found"
	}
	if st, err := os.Stat(p); err != nil || st.IsDir() {
		return bin + " not found"
	}
	return ""
}
