package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/internal/child"
)

// The soak: mdproxy runs as its own process in front of an emulated Core while a steady
// mix of uploads and polls, and of clients that misbehave in bounded ways, goes through
// it; its resident memory, heap in use, goroutines and open file descriptors are read
// from its own /metrics every interval. A leak on any path the mix takes shows as a
// series that keeps growing, or as goroutines that stay when the load has stopped.

// SoakMix is the load of a soak, in requests per second (0: that kind is not sent).
// The zero value sends nothing; DefaultSoakMix is the mix `mdbench --soak` drives.
type SoakMix struct {
	// UploadsPerS is the rate of POST /file with a file of the data set and its
	// Content-Length (the benchmark client's submission).
	UploadsPerS float64 `json:"uploads_per_s"`
	// PollsPerS is the rate of GET /file/{data_id} of the PollWindow most recent
	// submissions, round robin (the benchmark client's fetch). Above mdproxy's
	// file_result rate, the excess waits its turn or gets the limit answer.
	PollsPerS float64 `json:"polls_per_s"`
	// PollWindow is how many of the most recent data_ids are polled; 0 means 50.
	PollWindow int `json:"poll_window"`
	// CanceledPollsPerS is the rate of polls sent with a client timeout of
	// CanceledPollTimeout, shorter than Core's answer: the client goes away while the
	// poll waits for a token or for Core. Each carries a new apikey, so that the
	// per-client share meets a new client every time.
	CanceledPollsPerS   float64       `json:"canceled_polls_per_s"`
	CanceledPollTimeout time.Duration `json:"canceled_poll_timeout_ns"` // 0 means 50 ms
	// UnknownPollsPerS is the rate of polls of a random data_id that Core never issued
	// (Core answers 404), each with a new apikey.
	UnknownPollsPerS float64 `json:"unknown_polls_per_s"`
	// AbortedUploadsPerS is the rate of POST /file that announce a file's
	// Content-Length, send half of it, pause AbortAfter and close the connection.
	AbortedUploadsPerS float64       `json:"aborted_uploads_per_s"`
	AbortAfter         time.Duration `json:"abort_after_ns"` // 0 means 200 ms
	// MaxInFlight bounds the requests in flight from the soak; a request due while
	// that many are in flight is skipped and counted. 0 means 64.
	MaxInFlight int `json:"max_in_flight"`
}

// DefaultSoakMix is about 18 requests a second: one upload, 15 polls, one canceled
// poll, one unknown data_id every two seconds and one aborted upload every five.
var DefaultSoakMix = SoakMix{
	UploadsPerS: 1, PollsPerS: 15, PollWindow: 50,
	CanceledPollsPerS: 1, CanceledPollTimeout: 50 * time.Millisecond,
	UnknownPollsPerS: 0.5, AbortedUploadsPerS: 0.2, AbortAfter: 200 * time.Millisecond,
	MaxInFlight: 64,
}

// DefaultSoakProxyEnv are the settings the soak gives mdproxy, before the caller's
// (SoakConfig.ProxyEnv): file_result at 10 a second with a burst of 10 and a wait of
// up to 500 ms, below the mix's 16.5 polls a second so that the waiting and the
// limit answer are both taken; a per-client share that the churning apikeys of the
// misbehaving polls create state in, but that no client reaches; no shutdown delay.
// The bridge is off (MDPROXY_BRIDGE=false), as in the soak of bench/results: with it on,
// polls of the soak's own submissions would be answered from its callbacks and never
// meet the limit, and its callback listener would take the fixed port 127.0.0.1:9010.
// A caller's MDPROXY_BRIDGE=true (with MDPROXY_BRIDGE_LISTEN_ADDR) soaks the bridge.
var DefaultSoakProxyEnv = []string{
	"MDPROXY_FILE_RESULT_RATE=10",
	"MDPROXY_FILE_RESULT_BURST=10",
	"MDPROXY_FILE_RESULT_MAX_WAIT=500ms",
	"MDPROXY_FILE_RESULT_CLIENT_LIMIT=100",
	"MDPROXY_SHUTDOWN_DELAY=0s",
	"MDPROXY_BRIDGE=false",
}

// SoakConfig is a soak's setting. Files and Duration are required; zero durations
// take the defaults named on each field.
type SoakConfig struct {
	// Duration is how long the mix is driven (the load phase).
	Duration time.Duration
	// Interval is the time between two scrapes of mdproxy's /metrics; 0 means 10 s.
	// Duration must hold at least 6 intervals.
	Interval time.Duration
	// Warmup is the start of the load phase that the verdict leaves out, while
	// buffers, pools and the heap grow to their working size; 0 means Duration/6, at
	// most 5 minutes.
	Warmup time.Duration
	// IdleWait bounds the idle phase after the load: how long goroutines and file
	// descriptors get to return to their baseline; 0 means 30 s.
	IdleWait time.Duration
	// MdproxyBin is the mdproxy binary to run; empty: built from
	// github.com/mdproxy/mdproxy/cmd/mdproxy with the go command on PATH into a
	// temporary directory (the working directory must be inside the module).
	MdproxyBin string
	// ProxyEnv are MDPROXY_* settings (NAME=value) given to mdproxy after
	// DefaultSoakProxyEnv, so they override it; its listen, admin and upstream
	// addresses are the soak's whatever ProxyEnv says, and its log level is info at
	// least (the soak reads the addresses from the "mdproxy serving" line).
	// MDPROXY_* variables of this process's environment are not passed on.
	ProxyEnv []string
	// Sim is the emulated Core's configuration (its addresses are ignored: it listens
	// on a free loopback port, in this process).
	Sim coresim.Config
	// Mix is the load; the zero value means DefaultSoakMix.
	Mix SoakMix
	// Files is the data set the uploads are drawn from, in turn.
	Files []DataFile
	// Progress, if not nil, gets one line of text per sample.
	Progress io.Writer
}

// SoakSample is one scrape of mdproxy's /metrics.
type SoakSample struct {
	// T is the time since the load started, in seconds (0 for the baseline).
	T float64 `json:"t_s"`
	// Phase is "baseline" (after start-up, before any load), "load" or "idle" (after
	// the load, its connections closed).
	Phase          string  `json:"phase"`
	RSSBytes       float64 `json:"rss_bytes"`        // process_resident_memory_bytes
	HeapInuseBytes float64 `json:"heap_inuse_bytes"` // go_memstats_heap_inuse_bytes
	Goroutines     float64 `json:"goroutines"`       // go_goroutines
	OpenFDs        float64 `json:"open_fds"`         // process_open_fds
	// Requests is mdproxy_requests_total summed over methods, by "route code"
	// (e.g. "file_result 503"), cumulative since mdproxy started.
	Requests map[string]float64 `json:"requests"`
}

// SoakClient is what the soak's clients saw, counted by kind of request.
type SoakClient struct {
	Uploads        int64 `json:"uploads"`         // answered 200 with a data_id
	UploadsRefused int64 `json:"uploads_refused"` // answered 503 (Core's queue full)
	UploadErrors   int64 `json:"upload_errors"`   // any other answer, or no answer
	Polls          int64 `json:"polls"`           // answered 200
	PollsLimited   int64 `json:"polls_limited"`   // answered 503
	PollErrors     int64 `json:"poll_errors"`     // any other answer, or no answer
	// CanceledPolls were canceled by their short timeout; CanceledPollsAnswered were
	// answered before it.
	CanceledPolls         int64 `json:"canceled_polls"`
	CanceledPollsAnswered int64 `json:"canceled_polls_answered"`
	// UnknownPolls were answered 404, UnknownPollsOther otherwise (a 503 of the limit
	// among them).
	UnknownPolls      int64 `json:"unknown_polls"`
	UnknownPollsOther int64 `json:"unknown_polls_other"`
	AbortedUploads    int64 `json:"aborted_uploads"` // cut after half their body
	Skipped           int64 `json:"skipped"`         // not sent: MaxInFlight reached
}

// SoakResult is a soak's record: its settings, samples, client counts and verdict.
type SoakResult struct {
	DurationS float64      `json:"duration_s"`
	IntervalS float64      `json:"interval_s"`
	WarmupS   float64      `json:"warmup_s"`
	Mix       SoakMix      `json:"mix"`
	ProxyEnv  []string     `json:"proxy_env"` // the MDPROXY_* settings mdproxy ran with
	Speedup   float64      `json:"core_speedup"`
	Samples   []SoakSample `json:"samples"`
	Client    SoakClient   `json:"client"`
	// ProxyLog counts mdproxy's log lines of level WARN and ERROR by "LEVEL msg".
	ProxyLog map[string]int `json:"proxy_log"`
	// ProxyExit is how mdproxy ended when stopped with SIGTERM: "exit status 0" is a
	// clean shutdown.
	ProxyExit string      `json:"proxy_exit"`
	Verdict   SoakVerdict `json:"verdict"`
}

// SoakCheck is one comparison of the verdict: Got must not exceed Limit.
type SoakCheck struct {
	// Metric is the series: rss_bytes, heap_inuse_bytes, goroutines or open_fds.
	Metric string `json:"metric"`
	// Kind is "trend" (Ref the mean of the first third of the load phase after the
	// warm-up, Got that of the last third) or "idle" (Ref the baseline, Got the idle
	// sample).
	Kind  string  `json:"kind"`
	Ref   float64 `json:"ref"`
	Got   float64 `json:"got"`
	Limit float64 `json:"limit"` // Ref × (1 + relative tolerance) + absolute tolerance
	OK    bool    `json:"ok"`
}

// SoakVerdict says whether the series stayed flat.
type SoakVerdict struct {
	Flat   bool        `json:"flat"`
	Checks []SoakCheck `json:"checks"`
	// Problem, when not empty, is why the samples could not be judged (too few, no
	// idle sample); Flat is then false.
	Problem string `json:"problem,omitempty"`
}

// Tolerance is how much a series may exceed its reference and still count as flat: a
// fraction of the reference (Rel) plus an amount in the series' unit (Abs).
type Tolerance struct {
	Rel, Abs float64
}

// SoakTolerances are the tolerances of the verdict, by metric and kind. The trend
// ones absorb the garbage collector's saw-tooth and the in-flight requests of a
// steady load; the idle ones allow a connection or two (a scrape's, one Core closes
// late).
var SoakTolerances = map[string]Tolerance{
	"trend rss_bytes":        {Rel: 0.10, Abs: 4 << 20},
	"trend heap_inuse_bytes": {Rel: 0.10, Abs: 2 << 20},
	"trend goroutines":       {Rel: 0.10, Abs: 5},
	"trend open_fds":         {Rel: 0.10, Abs: 5},
	"idle goroutines":        {Abs: 2},
	"idle open_fds":          {Abs: 2},
}

// soakSeries are the judged series, in the order of the checks.
var soakSeries = []struct {
	name string
	get  func(SoakSample) float64
	idle bool // also compared with the baseline after the load
}{
	{"rss_bytes", func(s SoakSample) float64 { return s.RSSBytes }, false},
	{"heap_inuse_bytes", func(s SoakSample) float64 { return s.HeapInuseBytes }, false},
	{"goroutines", func(s SoakSample) float64 { return s.Goroutines }, true},
	{"open_fds", func(s SoakSample) float64 { return s.OpenFDs }, true},
}

// JudgeSoak judges samples: each series' mean over the last third of the load samples
// taken at warmup or later must stay within SoakTolerances of its mean over the first
// third, and goroutines and open descriptors of the last idle sample within theirs of
// the baseline. Fewer than 3 load samples after the warm-up, or no baseline or idle
// sample, give a verdict that is not flat, with Problem saying why.
func JudgeSoak(samples []SoakSample, warmup time.Duration) SoakVerdict {
	var load []SoakSample
	var base, idle *SoakSample
	for i, s := range samples {
		switch {
		case s.Phase == "load" && s.T >= warmup.Seconds():
			load = append(load, s)
		case s.Phase == "baseline" && base == nil:
			base = &samples[i]
		case s.Phase == "idle":
			idle = &samples[i]
		}
	}
	v := SoakVerdict{Flat: true}
	if len(load) < 3 {
		return SoakVerdict{Problem: fmt.Sprintf("%d load samples after the warm-up of %v, want at least 3", len(load), warmup)}
	}
	third := len(load) / 3
	check := func(metric, kind string, ref, got float64) {
		tol := SoakTolerances[kind+" "+metric]
		c := SoakCheck{Metric: metric, Kind: kind, Ref: ref, Got: got, Limit: ref*(1+tol.Rel) + tol.Abs}
		c.OK = got <= c.Limit
		v.Flat = v.Flat && c.OK
		v.Checks = append(v.Checks, c)
	}
	for _, s := range soakSeries {
		check(s.name, "trend", meanOf(load[:third], s.get), meanOf(load[len(load)-third:], s.get))
	}
	if base == nil || idle == nil {
		v.Flat, v.Problem = false, "no baseline or no idle sample to compare"
		return v
	}
	for _, s := range soakSeries {
		if s.idle {
			check(s.name, "idle", s.get(*base), s.get(*idle))
		}
	}
	return v
}

func meanOf(ss []SoakSample, get func(SoakSample) float64) float64 {
	sum := 0.0
	for _, s := range ss {
		sum += get(s)
	}
	return sum / float64(len(ss))
}

// Soak runs a soak as cfg says and judges it. It starts an emulated Core in this
// process and mdproxy as a child process (built first unless cfg.MdproxyBin is set),
// both on free loopback ports, and stops both, and every client, before it returns,
// on every path. It returns an error when the soak cannot run or mdproxy fails or
// dies under way (with the samples so far, if any, in the result); a series that is
// not flat is no error: see the result's Verdict. When ctx ends, the soak stops and
// returns what it has with ctx's error.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	res := &SoakResult{DurationS: cfg.Duration.Seconds(), IntervalS: cfg.Interval.Seconds(),
		WarmupS: cfg.Warmup.Seconds(), Mix: cfg.Mix, Speedup: cfg.Sim.Speedup}

	bin := cfg.MdproxyBin
	if bin == "" {
		dir, err := os.MkdirTemp("", "mdbench-soak-")
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		defer os.RemoveAll(dir)
		cfg.progress("building mdproxy")
		if bin, err = child.Build(ctx, dir, "github.com/mdproxy/mdproxy/cmd/mdproxy"); err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
	}

	simCfg := cfg.Sim
	simCfg.ListenAddr, simCfg.AdminAddr = "127.0.0.1:0", ""
	core, err := coresim.Start(simCfg, coresim.StartOptions{})
	if err != nil {
		return nil, fmt.Errorf("soak: emulator: %w", err)
	}
	defer core.Close()

	settings := append(slices.Clone(DefaultSoakProxyEnv), cfg.ProxyEnv...)
	for _, kv := range effectiveSettings(settings) {
		if lvl, ok := strings.CutPrefix(kv, "MDPROXY_LOG_LEVEL="); ok && (strings.EqualFold(lvl, "warn") || strings.EqualFold(lvl, "error")) {
			settings = append(settings, "MDPROXY_LOG_LEVEL=info")
		}
	}
	res.ProxyEnv = effectiveSettings(settings)
	log := &procLog{byMsg: map[string]int{}}
	proc, err := startMdproxy(ctx, bin, core.URL, settings, log)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer stopMdproxy(proc)
	cfg.progress(fmt.Sprintf("mdproxy (pid %d) on %s, metrics on %s, in front of the emulator on %s",
		proc.Cmd.Process.Pid, proc.Field("listen"), proc.Field("admin"), core.URL))

	runErr := soakPhases(ctx, cfg, res, proc, log, core)
	res.ProxyExit = stopMdproxy(proc)
	res.ProxyLog = log.counts()
	res.Verdict = JudgeSoak(res.Samples, cfg.Warmup)
	if runErr != nil {
		return res, fmt.Errorf("soak: %w", runErr)
	}
	return res, nil
}

// soakPhases takes the baseline, drives the load while sampling, then waits for the
// idle sample, appending samples to res as it goes.
func soakPhases(ctx context.Context, cfg SoakConfig, res *SoakResult, proc *child.Proc, log *procLog, core *coresim.Server) error {
	scraper := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	metricsURL := "http://" + proc.Field("admin") + "/metrics"
	scrape := func() (SoakSample, error) {
		s, err := scrapeMdproxy(ctx, scraper, metricsURL)
		if err != nil && proc.Exited() {
			return s, fmt.Errorf("mdproxy exited (%s): %s", stopMdproxy(proc), log.tail())
		}
		return s, err
	}
	record := func(s SoakSample, t time.Duration, phase string) SoakSample {
		s.T, s.Phase = t.Seconds(), phase
		res.Samples = append(res.Samples, s)
		cfg.progress(fmt.Sprintf("%-8s %7v  rss %6.1f MiB  heap %6.1f MiB  goroutines %4.0f  fds %4.0f  requests %6.0f",
			phase, t.Round(time.Second), s.RSSBytes/(1<<20), s.HeapInuseBytes/(1<<20), s.Goroutines, s.OpenFDs, sumValues(s.Requests)))
		return s
	}
	sample := func(t time.Duration, phase string) (SoakSample, error) {
		s, err := scrape()
		if err != nil {
			return s, err
		}
		return record(s, t, phase), nil
	}
	base, err := sample(0, "baseline")
	if err != nil {
		return err
	}

	load := newSoakLoad(cfg, "http://"+proc.Field("listen"), proc.Field("listen"))
	start := time.Now()
	load.start(ctx)
	tick := time.NewTicker(cfg.Interval)
	var loadErr error
	for loadErr == nil {
		select {
		case <-ctx.Done():
			loadErr = ctx.Err()
			continue
		case <-tick.C:
		}
		t := time.Since(start)
		if _, loadErr = sample(t, "load"); loadErr != nil {
			break
		}
		if t+cfg.Interval/2 >= cfg.Duration {
			break
		}
	}
	tick.Stop()
	load.stop()
	res.Client = load.counts()
	if loadErr != nil {
		return loadErr
	}

	// Idle: the clients' and Core's kept-alive connections are closed, so that what
	// remains in mdproxy is what it holds on its own.
	core.CloseIdle()
	deadline := time.Now().Add(cfg.IdleWait)
	for {
		s, err := scrape()
		if err != nil {
			return err
		}
		settled := s.Goroutines <= base.Goroutines+SoakTolerances["idle goroutines"].Abs &&
			s.OpenFDs <= base.OpenFDs+SoakTolerances["idle open_fds"].Abs
		if settled || time.Now().After(deadline) {
			// The sample that settled is the idle one: another scrape could count a
			// connection of its own, or one closing, that this one did not.
			record(s, time.Since(start), "idle")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (cfg SoakConfig) withDefaults() (SoakConfig, error) {
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.IdleWait == 0 {
		cfg.IdleWait = 30 * time.Second
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = min(cfg.Duration/6, 5*time.Minute)
	}
	if cfg.Mix == (SoakMix{}) {
		cfg.Mix = DefaultSoakMix
	}
	m := &cfg.Mix
	if m.PollWindow == 0 {
		m.PollWindow = 50
	}
	if m.CanceledPollTimeout == 0 {
		m.CanceledPollTimeout = 50 * time.Millisecond
	}
	if m.AbortAfter == 0 {
		m.AbortAfter = 200 * time.Millisecond
	}
	if m.MaxInFlight == 0 {
		m.MaxInFlight = 64
	}
	switch {
	case cfg.Interval < 0 || cfg.Duration < 6*cfg.Interval:
		return cfg, fmt.Errorf("soak: a duration of %v holds fewer than 6 intervals of %v", cfg.Duration, cfg.Interval)
	case cfg.Warmup < 0 || cfg.Warmup >= cfg.Duration || cfg.IdleWait < 0:
		return cfg, fmt.Errorf("soak: warm-up %v and idle wait %v: want the warm-up within the duration %v, both >= 0", cfg.Warmup, cfg.IdleWait, cfg.Duration)
	case len(cfg.Files) == 0:
		return cfg, fmt.Errorf("soak: %w", errNoFiles)
	case m.UploadsPerS < 0 || m.PollsPerS < 0 || m.CanceledPollsPerS < 0 || m.UnknownPollsPerS < 0 ||
		m.AbortedUploadsPerS < 0 || m.PollWindow < 0 || m.MaxInFlight < 0:
		return cfg, fmt.Errorf("soak: mix %+v: want rates and counts >= 0", *m)
	}
	return cfg, nil
}

func (cfg SoakConfig) progress(line string) {
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "mdbench: soak: %s\n", line)
	}
}

// effectiveSettings returns the NAME=value settings with each name's last value, in
// the order names first appear.
func effectiveSettings(env []string) []string {
	last := map[string]string{}
	var order []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := last[k]; !ok {
			order = append(order, k)
		}
		last[k] = kv
	}
	out := make([]string, len(order))
	for i, k := range order {
		out[i] = last[k]
	}
	return out
}

func sumValues(m map[string]float64) float64 {
	sum := 0.0
	for _, v := range m {
		sum += v
	}
	return sum
}

// startMdproxy starts bin with the environment of this process without its MDPROXY_*
// variables, then settings, then listen and admin addresses on free loopback ports and
// upstream, its output going to log. It returns once mdproxy has logged "mdproxy
// serving" with its addresses; on any failure the process has been stopped and waited
// for.
func startMdproxy(ctx context.Context, bin, upstream string, settings []string, log *procLog) (*child.Proc, error) {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MDPROXY_") {
			env = append(env, kv)
		}
	}
	env = append(env, settings...)
	env = append(env, "MDPROXY_LISTEN_ADDR=127.0.0.1:0", "MDPROXY_ADMIN_ADDR=127.0.0.1:0",
		"MDPROXY_UPSTREAM_URL="+upstream)
	return child.Start(ctx, bin, child.Options{Env: env, Ready: "mdproxy serving", Log: log, Name: "mdproxy"})
}

// stopMdproxy ends p, if it still runs, with SIGTERM, and with SIGKILL after 15 s,
// waits for it and returns how it ended ("exit status 0" for a clean shutdown). Safe
// to call more than once.
func stopMdproxy(p *child.Proc) string {
	if err := p.Stop(15 * time.Second); err != nil {
		return err.Error()
	}
	return "exit status 0"
}

// procLog takes mdproxy's output: JSON log lines. It counts WARN and ERROR lines by
// message and keeps the last lines for error messages. Safe for concurrent use.
type procLog struct {
	mu      sync.Mutex
	partial []byte
	last    []string       // the last 10 lines
	byMsg   map[string]int // "LEVEL msg", at most 50 keys
}

func (l *procLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.line(string(l.partial[:i]))
		l.partial = append(l.partial[:0], l.partial[i+1:]...)
	}
	if len(l.partial) > 64<<10 {
		l.line(string(l.partial))
		l.partial = l.partial[:0]
	}
	return len(p), nil
}

// line takes one line; the caller holds l.mu.
func (l *procLog) line(s string) {
	if len(l.last) == 10 {
		l.last = l.last[1:]
	}
	l.last = append(l.last, s)
	var e struct {
		Level string `json:"level"`
		Msg   string `json:"msg"`
	}
	if json.Unmarshal([]byte(s), &e) != nil {
		return
	}
	if e.Level == "WARN" || e.Level == "ERROR" {
		k := e.Level + " " + e.Msg
		if _, ok := l.byMsg[k]; ok || len(l.byMsg) < 50 {
			l.byMsg[k]++
		}
	}
}

func (l *procLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}

func (l *procLog) counts() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.byMsg)
}

// scrapeMdproxy reads mdproxy's /metrics at url (text format, parsed with expfmt) into
// a sample without T and Phase.
func scrapeMdproxy(ctx context.Context, c *http.Client, url string) (SoakSample, error) {
	var s SoakSample
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return s, fmt.Errorf("scraping %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		return s, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("scraping %s: status %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s, fmt.Errorf("scraping %s: %w", url, err)
	}
	for _, g := range []struct {
		name string
		to   *float64
	}{
		{"process_resident_memory_bytes", &s.RSSBytes},
		{"go_memstats_heap_inuse_bytes", &s.HeapInuseBytes},
		{"go_goroutines", &s.Goroutines},
		{"process_open_fds", &s.OpenFDs},
	} {
		mf := mfs[g.name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetGauge() == nil {
			return s, fmt.Errorf("scraping %s: no gauge %s", url, g.name)
		}
		*g.to = mf.GetMetric()[0].GetGauge().GetValue()
	}
	s.Requests = map[string]float64{}
	if mf := mfs["mdproxy_requests_total"]; mf != nil { // absent until a first request
		for _, m := range mf.GetMetric() {
			var route, code string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "route":
					route = lp.GetValue()
				case "code":
					code = lp.GetValue()
				}
			}
			s.Requests[route+" "+code] += m.GetCounter().GetValue()
		}
	}
	return s, nil
}
