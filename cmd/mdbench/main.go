// Command mdbench replays the published benchmark of MetaDefender Core's request rate
// limit (bench/PUBLISHED.md) against an emulated or a real Core, with and without
// mdproxy, and prints the published table beside its own. See the README.
//
// With --soak DURATION it runs a soak instead: mdproxy's binary in front of an emulator
// under a steady mix of uploads and polls, its memory and goroutines read from its own
// /metrics over time (see bench.Soak).
//
// Its last line is its verdict: whether the published order and calibration hold; it
// exits 1 when they do not.
//
// Exit codes: 0 success, 1 a run failed, the verdict did not hold or a soak was not flat,
// 2 bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/mdproxy/mdproxy/bench"
	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/envconf"
	"github.com/mdproxy/mdproxy/metrics"
	"github.com/mdproxy/mdproxy/sidecar"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], env.ToMap(os.Environ()), os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "mdbench:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "mdbench:", err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// options are mdbench's flags.
type options struct {
	scenarios    string
	quick        bool
	workload     string
	coreURL      string
	apiKey       string
	callbackAddr string
	bridgeCBURL  string
	speedup      float64
	submissions  int
	files        int
	dataDir      string
	seedCSV      string
	jsonPath     string
	chartPath    string
	fromJSON     string
	check        bool
	concurrency  int
	soak         time.Duration // 0: the benchmark's cases, no soak
	soakInterval time.Duration
	mdproxyBin   string
	version      bool

	// pub is the published table the figures are printed beside: --seed-csv's, else
	// the built-in one (bench.SeedTable).
	pub map[string]bench.Published
}

// maxSpeedup is the emulator's highest speed-up (CORESIM_SPEEDUP).
const maxSpeedup = 1e6

// parseFlags parses and checks mdbench's flags in args, all before anything runs: it
// reads --seed-csv and checks that --json and --chart can be written. Help goes to
// stderr. A bad flag is a usageError naming it (main exits 2).
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("mdbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cache, _ := os.UserCacheDir()
	fs.StringVar(&o.scenarios, "scenarios", strings.Join(bench.AllScenarios, ","), "comma-separated cases: No-limit, Rate-N, Proxy-N, Proxy-NxR (R replicas of mdproxy sharing Proxy-N's limit on a Redis; needs redis-server; not in the default list), Webhook, Bridge, Adaptive (mdproxy's adaptive limit; not in the default list)")
	fs.StringVar(&o.workload, "workload", "steady", "the client's submissions: steady (the seed's turns of 10 a second) or bursty (two bursts of 1000 against a scan queue of 250, 8 minutes apart; docs/mdbench.md)")
	fs.BoolVar(&o.quick, "quick", false, "small data set (200 submissions of 40 files) at a high speed-up: about a minute")
	fs.StringVar(&o.coreURL, "core-url", "", "a real Core's URL (default: an emulator started for each case)")
	fs.StringVar(&o.apiKey, "apikey", "", "apikey header for a real Core")
	fs.StringVar(&o.callbackAddr, "callback-addr", "", "host:port for the Webhook receiver and for mdproxy's callback listener in the Bridge case, reachable by a real Core (default: a free loopback port)")
	fs.StringVar(&o.bridgeCBURL, "bridge-callback-url", "", "the Bridge case's MDPROXY_BRIDGE_CALLBACK_URL, the URL Core is given for its callbacks (default: derived from the callback listener's address); an address nothing listens on plays callbacks that never arrive")
	fs.Float64Var(&o.speedup, "speedup", 0, "virtual seconds per real second, above 0 and at most 1e6, of the emulator started for each case (default 16; 60 with --quick; 1 in a soak); with --core-url, that of an emulator started apart (default 1: a real Core)")
	fs.IntVar(&o.submissions, "submissions", 0, "number of submissions (default 2000; 200 with --quick)")
	fs.IntVar(&o.files, "files", 0, "number of distinct files (default 800; 40 with --quick)")
	fs.StringVar(&o.dataDir, "data-dir", filepath.Join(cache, "mdbench"), "where the data set is generated and cached")
	fs.StringVar(&o.seedCSV, "seed-csv", "", "a CSV of the published table, in the columns of bench/testdata/published.csv (default: the built-in table, bench/PUBLISHED.md)")
	fs.StringVar(&o.jsonPath, "json", "", "write the figures (a soak's samples and verdict) as JSON to this file")
	fs.StringVar(&o.chartPath, "chart", "", "draw duration and error rate per case (a soak's series over time) to this .png or .svg file")
	fs.StringVar(&o.fromJSON, "from-json", "", "run no case: read the figures of an earlier run from this file (written by --json), then print the table and the comparisons and draw --chart")
	fs.BoolVar(&o.check, "check", false, "kept for scripts: the verdict is always given, and exits 1 unless No-limit is slower than Rate-1, Rate-1 is within 10% of Webhook, Bridge is within 5% of Webhook with no fetch error and at most 0.1 Core poll a submission, every case's verdicts are No-limit's and no submission was lost")
	fs.IntVar(&o.concurrency, "fetch-concurrency", bench.SeedWorkload.FetchConcurrency, "fetches in flight at most (the client's connection pool)")
	fs.DurationVar(&o.soak, "soak", 0, "run a soak of this duration instead of the cases (e.g. 30m): mdproxy's binary in front of an emulator under a steady mix of uploads and polls, its memory and goroutines read from its /metrics; exits 1 unless they stay flat")
	fs.DurationVar(&o.soakInterval, "soak-interval", 10*time.Second, "time between two samples of mdproxy's /metrics in a soak")
	fs.BoolVar(&o.version, "version", false, "print the version, the VCS revision and the Go version, then exit")
	fs.StringVar(&o.mdproxyBin, "mdproxy-bin", "", "the mdproxy binary a soak runs (default: built from ./cmd/mdproxy with the go command on PATH)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// Left out, --speedup is 0: the default of the run (see its help). Given, it is the
	// speed-up itself; !(x > 0) also refuses NaN.
	if set["speedup"] && !(o.speedup > 0 && o.speedup <= maxSpeedup) {
		return nil, usageError{fmt.Errorf("--speedup %v: want a number of virtual seconds per real second above 0 and at most %g (leave it out for the default)", o.speedup, maxSpeedup)}
	}
	if o.submissions < 0 || o.files < 0 || o.concurrency < 1 {
		return nil, usageError{errors.New("--submissions, --files must be >= 0 and --fetch-concurrency >= 1")}
	}
	// soak/6 rather than 6*interval, which overflows for an interval over 427 000 h.
	if o.soak < 0 || o.soakInterval <= 0 || (o.soak > 0 && o.soak/6 < o.soakInterval) {
		return nil, usageError{fmt.Errorf("--soak %v, --soak-interval %v: want an interval above 0 and a soak of at least 6 intervals", o.soak, o.soakInterval)}
	}
	if err := errors.Join(checkURL("core-url", o.coreURL), checkURL("bridge-callback-url", o.bridgeCBURL)); err != nil {
		return nil, usageError{err}
	}
	if o.chartPath != "" {
		if err := bench.CheckChartPath(o.chartPath); err != nil {
			return nil, usageError{fmt.Errorf("--chart %s: want a file ending in .png or .svg", o.chartPath)}
		}
	}
	if err := errors.Join(checkOutput("json", o.jsonPath), checkOutput("chart", o.chartPath)); err != nil {
		return nil, usageError{err}
	}
	o.pub = bench.SeedTable()
	if o.seedCSV != "" {
		p, err := bench.LoadPublished(o.seedCSV)
		if err != nil {
			return nil, usageError{fmt.Errorf("--seed-csv %s: %w; want a readable CSV in the columns of bench/testdata/published.csv", o.seedCSV, err)}
		}
		o.pub = p
	}
	return o, nil
}

// checkURL returns an error naming --name unless u is empty or an http or https URL
// with a host.
func checkURL(name, u string) error {
	if u == "" {
		return nil
	}
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" {
		return fmt.Errorf("--%s %q: want an http or https URL with a host, e.g. http://core:8008", name, u)
	}
	return nil
}

// checkOutput returns an error naming --name unless path is empty or a file mdbench
// can write once the run is over: an existing regular file that opens for writing
// (checked without truncating it), or a new file in an existing directory where one can
// be created (a probe file is created there and removed).
func checkOutput(name, path string) error {
	if path == "" {
		return nil
	}
	bad := func(err error) error {
		return fmt.Errorf("--%s %s: %w; want a file path in an existing, writable directory", name, path, err)
	}
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return bad(errors.New("not a regular file"))
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return bad(err)
		}
		return f.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return bad(err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".mdbench-probe-*")
	if err != nil {
		return bad(err)
	}
	f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return bad(err)
	}
	return nil
}

// run is mdbench with its flags in args and its environment in environ: the CORESIM_*
// variables there configure the emulators it starts, but for FETCH_LIMIT, which each
// case sets, and SPEEDUP and TICK, which follow --speedup.
func run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.version {
		v, rev, goVersion := metrics.BuildVersion()
		fmt.Fprintf(stdout, "mdbench %s (revision %s, %s)\n", v, rev, goVersion)
		return nil
	}
	if o.soak > 0 {
		return runSoak(ctx, o, environ, stdout, stderr)
	}
	if o.fromJSON != "" {
		return fromJSON(o, o.fromJSON, stdout, stderr)
	}
	var scenarios []bench.Scenario
	for _, name := range strings.Split(o.scenarios, ",") {
		sc, err := bench.ParseScenario(strings.TrimSpace(name))
		if err != nil {
			return usageError{err}
		}
		scenarios = append(scenarios, sc)
	}
	if slices.ContainsFunc(scenarios, func(sc bench.Scenario) bool { return sc.Replicas > 0 }) {
		// Before any case runs, rather than after the cases before it.
		if _, err := bench.FindRedisServer(); err != nil {
			return err
		}
	}

	spec := bench.SeedData
	work := bench.SeedWorkload
	switch o.workload {
	case "steady":
	case "bursty":
		work = bench.BurstyWorkload
	default:
		return usageError{fmt.Errorf("-workload %q: want steady or bursty", o.workload)}
	}
	simCfg, err := coresim.LoadConfig(environ)
	if err != nil {
		return usageError{err}
	}
	warnUnknown(environ, stderr)
	if v, ok := environ[coresim.EnvPrefix+"FETCH_LIMIT"]; ok {
		fmt.Fprintf(stderr, "mdbench: %sFETCH_LIMIT=%s ignored: each case sets Core's limit (Rate-N)\n", coresim.EnvPrefix, v)
	}
	simCfg.Speedup = 16
	if o.quick {
		spec = bench.QuickData
		work = work.Scaled(200)
		simCfg.Speedup = 60
	}
	if o.files > 0 {
		spec.Files = o.files
	}
	if o.submissions > 0 {
		work = work.Scaled(o.submissions)
	}
	if _, set := environ[coresim.EnvPrefix+"QUEUE_SIZE"]; !set && work.CoreQueue > 0 {
		simCfg.QueueSize = work.CoreQueue
	}
	if o.speedup > 0 {
		simCfg.Speedup = o.speedup
	}
	simCfg.Tick = tick(simCfg.Speedup)
	work.FetchConcurrency = o.concurrency
	work.APIKey = o.apiKey
	env := bench.Env{CoreURL: strings.TrimRight(o.coreURL, "/"), Sim: simCfg, CallbackAddr: o.callbackAddr,
		BridgeCallbackURL: o.bridgeCBURL, ClientSpeedup: o.speedup, StartProxy: startProxy(stderr),
		StartRedis: bench.StartRedisServer}

	loadBefore, cpus := machineLoad() // before mdbench's own work: for the verdict
	fmt.Fprintf(stderr, "mdbench: data set of %d files under %s\n", spec.Files, o.dataDir)
	files, err := bench.LoadOrGenerate(o.dataDir, spec)
	if err != nil {
		return err
	}

	tty := isTerminal(stderr)
	var figs []bench.Figures
	start := time.Now()
	for _, sc := range scenarios {
		w := work
		if tty {
			w.Progress = func(sub, done, ferr int) {
				fmt.Fprintf(stderr, "\r%-9s submitted %4d/%d  completed %4d  fetch errors %7d ", sc.Name, sub, w.Submissions, done, ferr)
			}
		} else {
			fmt.Fprintf(stderr, "mdbench: %s...\n", sc.Name)
		}
		f, err := bench.RunScenario(ctx, env, sc, w, files)
		if tty {
			fmt.Fprintln(stderr)
		}
		if err != nil {
			return err
		}
		figs = append(figs, f)
	}
	fmt.Fprintf(stderr, "mdbench: %d cases in %v (speed-up %g)\n", len(figs), time.Since(start).Round(time.Second), env.Speedup())
	if err := report(o, figs, stdout, stderr); err != nil {
		return err
	}
	// The verdict is always given, as the last line: exit 1 when it does not hold.
	line, err := verdict(figs, work.Submissions, loadBefore, cpus)
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr, "mdbench:", line)
	return nil
}

// report prints figs as a table, the comparisons of verdicts, of replicas and of the
// Adaptive case, and writes --json and --chart.
func report(o *options, figs []bench.Figures, stdout, stderr io.Writer) error {
	bench.WriteTable(stdout, figs, o.pub)
	for _, line := range bench.CompareAllVerdicts(figs) {
		fmt.Fprintln(stderr, "mdbench:", line)
	}
	for _, line := range bench.CompareReplicas(figs) {
		fmt.Fprintln(stderr, "mdbench:", line)
	}
	if slices.ContainsFunc(figs, func(f bench.Figures) bool { return f.Case == "Adaptive" }) {
		// Issue 32's comparison, reported beside the verdict: it does not change the exit code.
		if err := bench.CheckAdaptive(figs); err != nil {
			fmt.Fprintln(stderr, "mdbench: adaptive:", strings.ReplaceAll(err.Error(), "\n", "; "))
		} else {
			fmt.Fprintln(stderr, "mdbench: adaptive: no fixed-rate case of the published trade-off (Rate-N) is as good as Adaptive on both Core's duration and the last result")
		}
		for _, line := range bench.AdaptiveBesideProxy(figs) {
			fmt.Fprintln(stderr, "mdbench: adaptive:", line)
		}
	}
	if o.jsonPath != "" {
		b, _ := json.MarshalIndent(figs, "", "  ")
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if o.chartPath != "" {
		if err := bench.Chart(o.chartPath, figs, o.pub); err != nil {
			return err
		}
	}
	return nil
}

// fromJSON reports the figures of an earlier run, read from path (--from-json).
func fromJSON(o *options, path string, stdout, stderr io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var figs []bench.Figures
	if err := json.Unmarshal(b, &figs); err != nil {
		return fmt.Errorf("--from-json %s: %w", path, err)
	}
	if len(figs) == 0 {
		return fmt.Errorf("--from-json %s: no figures", path)
	}
	return report(o, figs, stdout, stderr)
}

// startProxy returns how the Proxy-N, Proxy-NxR and Bridge cases start mdproxy (each
// replica of a Proxy-NxR case apart): its shipped wiring (sidecar.Run) in this process
// with the case's MDPROXY_* settings, logging warnings and errors to stderr (so a
// replica whose limits fall back from Redis to its local share says so there). The
// MDPROXY_* variables of mdbench's environment are not passed on: every run of a case
// has the same settings.
func startProxy(stderr io.Writer) func(context.Context, map[string]string) (string, func() error, error) {
	return func(ctx context.Context, environ map[string]string) (string, func() error, error) {
		environ = maps.Clone(environ)
		environ[sidecar.EnvPrefix+"LOG_LEVEL"] = "warn"
		return sidecar.Start(ctx, environ, stderr)
	}
}

// warnUnknown warns on stderr about CORESIM_* variables in environ that the emulator
// does not know.
func warnUnknown(environ map[string]string, stderr io.Writer) {
	if unknown := envconf.Unknown(coresim.EnvPrefix, environ, envconf.Names[coresim.Config](coresim.EnvPrefix)); len(unknown) > 0 {
		fmt.Fprintf(stderr, "mdbench: unknown variables ignored (misspelt?): %s\n", strings.Join(unknown, ", "))
	}
}

// tick is the emulator's model step at speedup: one step per 60 ms of virtual time at
// most, so that latencies of tens of milliseconds stay visible whatever the speed-up.
func tick(speedup float64) time.Duration {
	return max(500*time.Microsecond, time.Duration(float64(60*time.Millisecond)/speedup))
}

// runSoak is mdbench --soak: the emulator (CORESIM_* from environ, real time unless
// --speedup) with the small data set, mdproxy's binary with the soak's settings and
// the MDPROXY_* variables of environ. It prints the samples' table to stdout, writes
// --json and --chart, and fails if the soak did not run or was not flat.
func runSoak(ctx context.Context, o *options, environ map[string]string, stdout, stderr io.Writer) error {
	simCfg, err := coresim.LoadConfig(environ)
	if err != nil {
		return usageError{err}
	}
	warnUnknown(environ, stderr)
	simCfg.Speedup = 1
	if o.speedup > 0 {
		simCfg.Speedup = o.speedup
	}
	simCfg.Tick = tick(simCfg.Speedup)
	spec := bench.QuickData
	if o.files > 0 {
		spec.Files = o.files
	}
	fmt.Fprintf(stderr, "mdbench: data set of %d files under %s\n", spec.Files, o.dataDir)
	files, err := bench.LoadOrGenerate(o.dataDir, spec)
	if err != nil {
		return err
	}
	var proxyEnv []string
	for k, v := range environ {
		if strings.HasPrefix(k, "MDPROXY_") {
			proxyEnv = append(proxyEnv, k+"="+v)
		}
	}
	slices.Sort(proxyEnv)
	res, err := bench.Soak(ctx, bench.SoakConfig{Duration: o.soak, Interval: o.soakInterval,
		MdproxyBin: o.mdproxyBin, ProxyEnv: proxyEnv, Sim: simCfg, Files: files, Progress: stderr})
	if res != nil && len(res.Samples) > 0 {
		bench.WriteSoakTable(stdout, res)
		if o.jsonPath != "" {
			b, _ := json.MarshalIndent(res, "", "  ")
			if werr := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); werr != nil {
				return errors.Join(err, werr)
			}
		}
		if o.chartPath != "" {
			if cerr := bench.SoakChart(o.chartPath, res); cerr != nil {
				return errors.Join(err, cerr)
			}
		}
	}
	if err != nil {
		return err
	}
	if !res.Verdict.Flat {
		return errors.New("soak: mdproxy's memory, goroutines or descriptors did not stay flat (see the verdict)")
	}
	fmt.Fprintln(stderr, "mdbench: soak flat")
	return nil
}

// isTerminal reports whether w is a terminal, for the live progress line.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
