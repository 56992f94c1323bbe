package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mdproxy/mdproxy/internal/child"
)

// envInfo is the machine and the versions of everything measured.
type envInfo struct {
	nproc, cpu, kernel string
	loadBefore         string   // /proc/loadavg's 1, 5 and 15 minute averages when the run began
	versions           []string // "name: version"
	mdproxy            string
}

// gatherEnv reads the machine and asks each binary its version.
func gatherEnv(ctx context.Context, cfg config, mdBin string) envInfo {
	var e envInfo
	e.nproc = strconv.Itoa(runtime.NumCPU())
	if out, err := exec.CommandContext(ctx, "nproc").Output(); err == nil {
		e.nproc = strings.TrimSpace(string(out))
	}
	e.cpu = "unknown"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				e.cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.kernel = strings.TrimSpace(string(b))
	}
	version := func(name string, argv ...string) {
		if why := present(argv[0]); why != "" {
			e.versions = append(e.versions, name+": absent ("+why+")")
			return
		}
		out, _ := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		line, _, _ = strings.Cut(line, " Copyright")
		line, _, _ = strings.Cut(line, " - https://")
		e.versions = append(e.versions, name+": "+strings.TrimSpace(line))
	}
	version("nginx", cfg.bins["nginx"], "-v")
	version("HAProxy", cfg.bins["haproxy"], "-v")
	version("Caddy", cfg.bins["caddy"], "version")
	version("wrk", cfg.bins["wrk"], "-v")
	goBin, _ := child.GoCommand()
	version("Go", goBin, "version")
	switch {
	case mdBin == "":
		e.mdproxy = "not run"
	case cfg.mdproxyBin != "":
		e.mdproxy = "the binary " + cfg.mdproxyBin
	default:
		e.mdproxy = "built from the working tree"
		if out, err := exec.CommandContext(ctx, goBin, "env", "GOMOD").Output(); err == nil {
			root := filepath.Dir(strings.TrimSpace(string(out)))
			if rev, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
				e.mdproxy += " at commit " + strings.TrimSpace(string(rev))
				if st, err := exec.CommandContext(ctx, "git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
					e.mdproxy += ", with uncommitted changes to tracked files"
				} else if err == nil {
					e.mdproxy += ", no uncommitted change to tracked files"
				}
			}
		}
	}
	return e
}

// figure is a row's medians over its rounds.
type figure struct {
	ok            bool
	value         float64 // req/s or MB/s
	p50, p99      time.Duration
	lo, hi        float64 // lowest and highest value of the rounds
	n             int
	non2xx, total int64 // summed over rounds
	upstream      int64
	complete      int64
	sockErrs      int64
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func (r *row) figure() figure {
	var f figure
	if len(r.samples) == 0 {
		return f
	}
	var vals []float64
	var p50s, p99s []time.Duration
	for _, s := range r.samples {
		if r.workload == "upload" {
			vals = append(vals, s.mbps)
			f.complete += s.complete
			continue
		}
		vals = append(vals, s.wrk.RPS)
		p50s = append(p50s, s.wrk.P50)
		p99s = append(p99s, s.wrk.P99)
		f.non2xx += s.wrk.Non2xx
		f.total += s.wrk.Requests
		f.upstream += s.upstreamGets
		f.sockErrs += s.wrk.SockErrs
	}
	f.ok, f.n = true, len(vals)
	f.value = median(vals)
	f.lo, f.hi = slices.Min(vals), slices.Max(vals)
	if len(p50s) > 0 {
		f.p50, f.p99 = median(p50s), median(p99s)
	}
	return f
}

// value is the figure a sample gives: req/s, or MB/s for an upload.
func (s sample) value(workload string) float64 {
	if workload == "upload" {
		return s.mbps
	}
	return s.wrk.RPS
}

// ratio is a row's speed against another's (its ceiling, or nginx): the median, over
// the rounds that measured both, of the ratio of the two samples of a round. The two
// samples of a round are taken seconds apart, so a drift of the machine's speed between
// rounds (a shared host's) cancels out of each ratio; a ratio of the rows' medians
// would keep it. n is how many rounds measured both; ok is false when none did.
func ratio(r, of *row) (v float64, n int, ok bool) {
	if r == nil || of == nil {
		return 0, 0, false
	}
	den := map[int]float64{}
	for _, s := range of.samples {
		den[s.round] = s.value(of.workload)
	}
	var rs []float64
	for _, s := range r.samples {
		if d, ok := den[s.round]; ok && d > 0 {
			rs = append(rs, s.value(r.workload)/d)
		}
	}
	if len(rs) == 0 {
		return 0, 0, false
	}
	return median(rs), len(rs), true
}

// find returns the row of workload through target, nil when there is none.
func (b *bench) find(workload, target string) *row {
	for _, r := range b.rows {
		if r.workload == workload && r.target == target {
			return r
		}
	}
	return nil
}

func (b *bench) fig(workload, target string) figure {
	if r := b.find(workload, target); r != nil {
		return r.figure()
	}
	return figure{}
}

// criterion is one acceptance point of the peers benchmark (issues 13 and 30).
type criterion struct {
	name   string
	result string // PASS, FAIL or SKIP
	detail string
}

// criteria evaluates the acceptance criteria (issues 13 and 30) on the rounds' ratios (see ratio).
func (b *bench) criteria() []criterion {
	var cs []criterion
	// check compares target's rounds with ref's (the workload's ceiling unless given).
	check := func(name, workload, target, ref string, want float64, extra func(got, ceil figure) (bool, string)) {
		ref = cmp.Or(ref, ceilings[workload])
		got, ceil := b.fig(workload, target), b.fig(workload, ref)
		c := criterion{name: name}
		r, n, ok := ratio(b.find(workload, target), b.find(workload, ref))
		if !got.ok || !ceil.ok || !ok {
			c.result, c.detail = "SKIP", "not measured"
			cs = append(cs, c)
			return
		}
		pass := r >= want
		// Three decimals: at two, a ratio of 0.897 would read "0.90, want >= 0.90" beside FAIL.
		c.detail = fmt.Sprintf("%.3f of %s (the median of %d rounds' ratios; medians %s against %s), want >= %.2f", r, ref, n, num(workload, got.value), num(workload, ceil.value), want)
		if extra != nil {
			ok, d := extra(got, ceil)
			pass = pass && ok
			c.detail += "; " + d
		}
		c.result = map[bool]string{true: "PASS", false: "FAIL"}[pass]
		cs = append(cs, c)
	}
	// Beside a criterion, not part of it: the same row against a bare server doing the
	// same work with mdproxy's client timeouts (beside the limit answer and the store
	// hit) or against the copying TCP relay (beside the upload, what relaying the bytes
	// costs with no HTTP work).
	beside := func(workload, target, other, what string) func(_, _ figure) (bool, string) {
		return func(_, _ figure) (bool, string) {
			r, n, ok := ratio(b.find(workload, target), b.find(workload, other))
			if !ok {
				return true, what + " was not measured"
			}
			return true, fmt.Sprintf("%.2f of %s (the median of %d rounds' ratios)", r, what, n)
		}
	}
	check("limit answer >= 0.9 of the bare 503 server", "limit", "mdproxy", "", 0.9,
		beside("limit", "mdproxy", "bare503t", "the bare 503 server with mdproxy's timeouts"))
	check("forwarded poll >= 1.0 of the bare ReverseProxy, p99 no worse", "forward", "mdproxy-fwd", "", 1.0, func(got, ceil figure) (bool, string) {
		return got.p99 <= ceil.p99, fmt.Sprintf("p99 %s against %s", dur(got.p99), dur(ceil.p99))
	})
	// The upload criterion holds for mdproxy as deployed (bridge on) and without the
	// bridge: the lower of the two counts.
	up := "mdproxy"
	direct := b.find("upload", "direct")
	on, _, onOK := ratio(b.find("upload", "mdproxy-bridge"), direct)
	if off, _, offOK := ratio(b.find("upload", "mdproxy"), direct); onOK && (!offOK || on < off) {
		up = "mdproxy-bridge"
	}
	// A relaying proxy cannot beat a relay that only copies the bytes: the criterion is
	// against it, direct beside it.
	check("upload >= 0.95 of the copying TCP relay (the lower of mdproxy's bridge-on and bridge-off rows)", "upload", up, "relay", 0.95,
		beside("upload", up, "direct", "direct to the stand-in"))
	check("store hit >= 0.9 of the bare 503 server", "storehit", "mdproxy-bridge", "", 0.9,
		beside("storehit", "mdproxy-bridge", "bareresult", "the bare server answering a result's bytes with mdproxy's timeouts"))
	c := criterion{name: fmt.Sprintf("resident memory growth < 32 MiB for %d concurrent %s uploads", b.cfg.rssUploads, size(b.cfg.rssSize))}
	if len(b.rss) == 0 {
		c.result, c.detail = "SKIP", "not measured"
	} else {
		worst := b.rss[0]
		for _, s := range b.rss {
			if s.peak-s.baseline > worst.peak-worst.baseline {
				worst = s
			}
		}
		g := mib(worst.peak - worst.baseline)
		c.result = map[bool]string{true: "PASS", false: "FAIL"}[g < 32]
		c.detail = fmt.Sprintf("highest growth of %d rounds %.1f MiB above a baseline of %.1f MiB", len(b.rss), g, mib(worst.baseline))
	}
	cs = append(cs, c)
	return cs
}

// failed reports whether a criterion failed.
func (b *bench) failed() bool {
	for _, c := range b.criteria() {
		if c.result == "FAIL" {
			return true
		}
	}
	return false
}

func num(workload string, v float64) string {
	if workload == "upload" {
		return fmt.Sprintf("%.0f MB/s", v)
	}
	return fmt.Sprintf("%.0f req/s", v)
}

func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
}

func size(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

var workloadTitles = map[string]string{
	"limit":    "limit answer (GET /file/{id} over 50/s)",
	"forward":  "forwarded poll (GET /file/{id}, 1.7 KB result)",
	"upload":   "upload, MB/s",
	"storehit": "store hit (bridge on, GET /file/{stored id})",
}

// markdown is the report.
func (b *bench) markdown() string {
	var sb strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	cfg := b.cfg
	w("# Peers benchmark: mdproxy beside nginx, HAProxy, Caddy and bare Go\n\n")
	w("Command, from the repository's root:\n\n    %s\n\n", cfg.command)
	w("- Date: %s (%s to run)\n", b.start.UTC().Format("2006-01-02 15:04 MST"), time.Since(b.start).Round(time.Second))
	w("- Machine: %s CPUs (nproc), %s, Linux %s; load average (1, 5, 15 min) %s at the start, %s at the end\n",
		b.env.nproc, b.env.cpu, b.env.kernel, b.env.loadBefore, loadavg())
	w("- mdproxy: %s\n", b.env.mdproxy)
	w("- Versions: %s\n", strings.Join(b.env.versions, "; "))
	pin := fmt.Sprintf("every proxy alone on CPU %d (GOMAXPROCS=1 for the Go ones, nginx worker_processes 1, HAProxy nbthread 1); wrk, the upload client and the stand-in upstream (Go, GOMAXPROCS=1) on CPU %d", cfg.proxyCPU, cfg.loadCPU)
	if b.lab.taskset == "" {
		pin = "nothing pinned (taskset absent)"
	}
	w("- Setup: %s; wrk -t%d -c%d -d%s --latency %s; uploads of %s, one connection at a time; interleaved rounds: %d (every target once a round, the order rotated), the median of the rounds shown, and each ratio the median of the rounds' ratios. The limit is 50/s, burst 50, on GET /file/{id} (see `go doc ./bench/peers` for each peer's configuration).\n\n",
		pin, cfg.threads, cfg.connections, wrkSeconds(cfg.duration), warm(cfg.warmup), size(cfg.uploadSize), cfg.rounds)

	w("| workload | target | req/s (MB/s for uploads) | p50 | p99 | ratio to bare Go | ratio to nginx | rounds: lowest-highest | answers |\n")
	w("|---|---|---|---|---|---|---|---|---|\n")
	for _, wl := range allWorkloads {
		ceil, ngx := b.find(wl, ceilings[wl]), b.find(wl, nginxOf[wl])
		for _, r := range b.rows {
			if r.workload != wl {
				continue
			}
			f := r.figure()
			if !f.ok {
				why := r.absent
				if why == "" && len(r.errs) > 0 {
					why = "every measurement failed: " + r.errs[0]
				}
				w("| %s | %s | - | - | - | - | - | - | %s |\n", workloadTitles[wl], r.label, cell(why))
				continue
			}
			cr, nr := "-", "-"
			if v, _, ok := ratio(r, ceil); ok {
				cr = fmt.Sprintf("%.2f", v)
			}
			if v, _, ok := ratio(r, ngx); ok {
				nr = fmt.Sprintf("%.2f", v)
			}
			p50, p99 := dur(f.p50), dur(f.p99)
			if wl == "upload" {
				p50, p99 = "-", "-"
			}
			w("| %s | %s | %.0f | %s | %s | %s | %s | %.0f-%.0f | %s |\n", workloadTitles[wl], r.label, f.value, p50, p99, cr, nr, f.lo, f.hi, b.answers(r, f))
		}
	}
	if len(cfg.variants) > 0 {
		w("\n## Variants against mdproxy\n\n")
		for _, v := range cfg.variants {
			bin := "mdproxy's binary"
			if v.bin != "" {
				bin = v.bin
			}
			w("- %s: %s, with %s\n", v.name, bin, cell(strings.Join(append([]string{"its defaults"}, v.env...), ", ")))
		}
		w("\n| workload | variant | ratio to mdproxy (median of the rounds' ratios) | rounds |\n|---|---|---|---|\n")
		for _, r := range b.rows {
			base, name := baseKey(r.target)
			if name == "" {
				continue
			}
			if v, n, ok := ratio(r, b.find(r.workload, base)); ok {
				w("| %s | %s | %.3f | %d |\n", workloadTitles[r.workload], name, v, n)
			} else {
				w("| %s | %s | - | 0 |\n", workloadTitles[r.workload], name)
			}
		}
	}
	if cfg.workloads["rss"] {
		w("\nmdproxy's resident memory (bridge on, a fresh process each round), %d concurrent uploads of %s: ", cfg.rssUploads, size(cfg.rssSize))
		if len(b.rss) == 0 {
			why := b.rssErr
			if why == "" {
				why = "mdproxy not run"
			}
			w("not measured (%s).\n", why)
		} else {
			var gs []string
			for _, s := range b.rss {
				src := "VmRSS sampled every 10 ms"
				if s.hwm {
					src = "VmHWM"
				}
				gs = append(gs, fmt.Sprintf("+%.1f MiB over %.1f MiB (%s)", mib(s.peak-s.baseline), mib(s.baseline), src))
			}
			w("peak growth by round: %s.\n", strings.Join(gs, "; "))
		}
	}

	w("\n## Acceptance\n\n")
	for _, c := range b.criteria() {
		w("- %s %s: %s\n", c.result, c.name, oneLine(c.detail))
	}

	w("\n## Checks before measuring\n\n")
	if len(b.verified) == 0 {
		w("None ran.\n")
	}
	for _, v := range b.verified {
		res := "ok"
		if v.err != nil {
			res = "FAILED: " + oneLine(v.err.Error())
		}
		w("- %s, %s: %s\n", v.target, v.what, res)
	}

	w("\n## Notes\n\n")
	for _, n := range b.notes {
		w("- %s\n", oneLine(n))
	}
	for _, r := range b.rows {
		for _, e := range r.errs {
			w("- A measurement of %s through %s failed: %s\n", r.workload, r.label, oneLine(e))
		}
	}
	w("- Ratios are to the bare Go ceiling of the workload (the bare net/http 503 server for the limit answer and the store hit, the bare httputil.ReverseProxy for the forwarded poll, direct to the stand-in for uploads) and to nginx: each the median, over the rounds, of the ratio of the two rows' samples of the same round. The two samples of a round are taken seconds apart, so that a change of the machine's speed between rounds (this is a shared virtual machine: the same server measures a third faster or slower from one minute to the next) cancels out of each ratio, where it would stay in a ratio of medians.\n")
	w("- HAProxy has no token bucket: its limit is a stick-table counting the requests let through (gpc0) and refusing while their rate over the last second (gpc0_rate(1s), a sliding estimate) is 50 or more; same long-run 50/s, but at most about 50 in any second where a full token bucket of 50 lets 50 at once and 50 more within the second.\n")
	w("- Uploads, TCP relays: a process of this program on the proxies' core that relays each connection byte for byte to its own connection to the stand-in, knowing nothing of HTTP; one copies through a 1 MiB buffer, as mdproxy does, the other lets Go use Linux splice(2) (net.TCPConn.ReadFrom between two TCP connections). The copying relay is what relaying an upload's bytes costs with no HTTP work; its gap from direct is the second hop, the bytes copied in and out of the relay and crossing between the cores.\n")
	w("- Bare servers with mdproxy's timeouts: net/http servers with mdproxy's default MDPROXY_READ_HEADER_TIMEOUT and MDPROXY_IDLE_TIMEOUT, which net/http enforces with read deadlines set on the connection several times a request, two of them in the future (a runtime timer each); one answers the fixed 503, the other 200 with one of the stand-in's results, as many bytes as a store hit (1.7 KB against the 503's 67). They show what the timeouts and the larger answer cost net/http itself; the criteria stay against the bare 503 server without timeouts.\n")
	w("- Caddy: Debian's caddy has no rate-limit module, so it has no limit-answer row; it forwards polls and uploads.\n")
	w("- Forwarded poll: mdproxy runs with MDPROXY_FILE_RESULT_RATE=1000000 (a token is taken for every poll, as under a limit not reached), nginx and HAProxy without a limit; every proxy keeps up to 256 idle connections to the stand-in.\n")
	w("- answers: for the limit answer, the answers that were not 503 (the polls the limit let through, summed over the rounds) and how many reached the stand-in, and the same for the bare 503 server beside the store hit; for the other wrk workloads, the answers that were not 2xx (wrk does not tell 503 from other non-2xx statuses; the checks above did, with a Go client); for uploads, the uploads the stand-in received whole, every byte with its Content-Length.\n")
	return sb.String()
}

// loadavg is the machine's load average over 1, 5 and 15 minutes.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}

// oneLine is s on one line, for a Markdown list item.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// cell is s fit for a Markdown table cell.
func cell(s string) string {
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return strings.ReplaceAll(oneLine(s), "|", `\|`)
}

func warm(d time.Duration) string {
	if d <= 0 {
		return "without a warm-up"
	}
	return "after a " + wrkSeconds(d) + " warm-up"
}

// answers is the row's answers column.
func (b *bench) answers(r *row, f figure) string {
	s := b.answers1(r, f)
	if f.sockErrs > 0 {
		s += fmt.Sprintf("; wrk socket errors: %d", f.sockErrs)
	}
	return s
}

func (b *bench) answers1(r *row, f figure) string {
	switch {
	case r.workload == "limit", r.workload == "storehit" && r.target == "bare503":
		// The bare 503 server beside the store hit answers 503 by design: counted as a
		// limit answer's are.
		return fmt.Sprintf("not 503: %d of %d (reached the stand-in: %d)", f.total-f.non2xx, f.total, f.upstream)
	case r.workload == "upload":
		return fmt.Sprintf("%d of %d whole at the stand-in", f.complete, f.n)
	case r.workload == "storehit":
		return fmt.Sprintf("not 2xx: %d of %d (reached the stand-in: %d)", f.non2xx, f.total, f.upstream)
	default:
		return fmt.Sprintf("not 2xx: %d of %d", f.non2xx, f.total)
	}
}
