package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// benchID is the data_id polled by the limit-answer and forwarded-poll workloads.
const benchID = "5f0c3e9a7b2d4c6e8a1b3d5f7e9c0a2b"

// target is something measured: a proxy in one configuration, a bare server, or the
// stand-in itself (direct uploads).
type target struct {
	key    string // e.g. "mdproxy-fwd"
	group  string // the -targets group: bare, mdproxy, nginx, haproxy, caddy
	base   string // http://host:port
	absent string // why it is not measured; "" when it is
}

// row is one line of the table: a workload through a target.
type row struct {
	workload string // limit, forward, upload, storehit
	label    string
	target   string // target key
	absent   string // why the row has no figures
	samples  []sample
	errs     []string // measurements that failed
}

// sample is one measurement of a row.
type sample struct {
	round        int // the round it was taken in, from 0
	wrk          wrkResult
	upstreamGets int64 // GETs the stand-in answered during the wrk run
	// uploads
	up       uploadResult
	mbps     float64
	complete int64 // uploads the stand-in received whole during the measurement
	received int64 // bytes it received
}

// rssSample is one round of the RSS workload.
type rssSample struct {
	baseline, peak int64 // bytes: VmRSS before the uploads, highest during them
	hwm            bool  // peak is VmHWM (exact), not the highest VmRSS sampled
	samples        int
	statuses       []int
	errs           []string
}

// verification is what a target answered before it was measured.
type verification struct {
	target, what string
	err          error
}

// bench is one run of the benchmark.
type bench struct {
	cfg       config
	lab       *lab
	logf      func(format string, args ...any)
	start     time.Time
	env       envInfo
	standin   string // host:port
	targets   map[string]*target
	rows      []*row
	rss       []rssSample
	rssErr    string
	storedIDs map[string]string // the id whose result each bridged mdproxy target stored
	mdBin     string
	verified  []verification
	notes     []string
	client    *http.Client
}

// workloadRows are the rows of each workload, in the table's order: the ceiling first.
var workloadRows = []struct{ workload, label, target string }{
	{"limit", "bare net/http 503", "bare503"},
	{"limit", "bare net/http 503, mdproxy's timeouts", "bare503t"},
	{"limit", "mdproxy", "mdproxy"},
	{"limit", "nginx", "nginx"},
	{"limit", "HAProxy", "haproxy"},
	{"limit", "Caddy", "caddy-limit"},
	{"forward", "bare ReverseProxy", "bareproxy"},
	{"forward", "mdproxy", "mdproxy-fwd"},
	{"forward", "nginx", "nginx-fwd"},
	{"forward", "HAProxy", "haproxy-fwd"},
	{"forward", "Caddy", "caddy"},
	{"upload", "direct to the stand-in", "direct"},
	{"upload", "TCP relay, 1 MiB copies, no HTTP", "relay"},
	{"upload", "TCP relay, Linux splice, no HTTP", "relay-splice"},
	{"upload", "bare ReverseProxy", "bareproxy"},
	{"upload", "mdproxy (bridge off)", "mdproxy"},
	{"upload", "mdproxy (bridge on)", "mdproxy-bridge"},
	{"upload", "nginx", "nginx"},
	{"upload", "HAProxy", "haproxy"},
	{"upload", "Caddy", "caddy"},
	{"storehit", "bare net/http 503", "bare503"},
	{"storehit", "bare net/http 200 with a result's bytes, mdproxy's timeouts", "bareresult"},
	{"storehit", "mdproxy (bridge on)", "mdproxy-bridge"},
}

// ceilings name each workload's bare Go row, the ratios' denominator.
var ceilings = map[string]string{"limit": "bare503", "forward": "bareproxy", "upload": "direct", "storehit": "bare503"}

// nginxOf names nginx's target of each workload.
var nginxOf = map[string]string{"limit": "nginx", "forward": "nginx-fwd", "upload": "nginx"}

// run starts everything, checks what each target answers, measures cfg.rounds rounds
// and stops everything. The report is b.markdown().
func run(ctx context.Context, cfg config, logf func(string, ...any)) (*bench, error) {
	dir, err := os.MkdirTemp("", "mdpeers-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// nginx's worker drops root for nobody, who must reach the temporary paths.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o755); err != nil {
		return nil, err
	}
	load := loadavg()
	b := &bench{cfg: cfg, logf: logf, start: time.Now(), targets: map[string]*target{}, storedIDs: map[string]string{},
		lab:    &lab{dir: dir},
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}}
	defer b.lab.close()
	if why := present(cfg.bins["taskset"]); why == "" {
		b.lab.taskset = cfg.bins["taskset"]
	} else {
		b.notes = append(b.notes, "taskset absent ("+why+"): nothing was pinned to a CPU; the figures are not comparable with pinned runs")
	}
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	b.env = gatherEnv(ctx, cfg, b.mdBin)
	b.env.loadBefore = load
	b.verify(ctx)
	b.layout()
	for r := range cfg.rounds {
		if err := b.round(ctx, r); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// setup builds mdproxy and starts the stand-in and every target selected.
func (b *bench) setup(ctx context.Context) error {
	cfg := b.cfg
	add := func(key, group, addr, absent string) {
		t := &target{key: key, group: group, absent: absent}
		if addr != "" {
			t.base = "http://" + addr
		}
		if !cfg.targets[group] && absent == "" {
			t.absent = "not selected (-targets)"
		}
		b.targets[key] = t
	}
	var err error
	if b.standin, err = freePort(); err != nil {
		return err
	}
	if _, err := b.lab.startSelf("standin", "standin", cfg.loadCPU, b.standin); err != nil {
		return fmt.Errorf("the stand-in upstream: %w", err)
	}
	add("direct", "bare", b.standin, "")
	if cfg.targets["bare"] {
		for _, s := range []struct{ key, role string }{
			{"bare503", "bare503"}, {"bare503t", "bare503t"}, {"bareresult", "bareresult"}, {"bareproxy", "bareproxy"},
			{"relay", "relay"}, {"relay-splice", "relay-splice"},
		} {
			addr, err := freePort()
			if err != nil {
				return err
			}
			if _, err := b.lab.startSelf(s.key, s.role, cfg.proxyCPU, addr, upstreamEnv+"="+b.standin); err != nil {
				return err
			}
			add(s.key, "bare", addr, "")
		}
	} else {
		add("bare503", "bare", "", "")
		add("bare503t", "bare", "", "")
		add("bareresult", "bare", "", "")
		add("bareproxy", "bare", "", "")
		add("relay", "bare", "", "")
		add("relay-splice", "bare", "", "")
	}

	if cfg.targets["mdproxy"] {
		b.mdBin = cfg.mdproxyBin
		if b.mdBin == "" {
			b.logf("building ./cmd/mdproxy")
			if b.mdBin, err = buildMdproxy(ctx, b.lab.dir); err != nil {
				return err
			}
		}
		for _, v := range append([]variant{{}}, cfg.variants...) {
			bin := b.mdBin
			if v.bin != "" {
				bin = v.bin
			}
			for _, m := range []struct {
				key         string
				bridge      bool
				rate, burst string
			}{
				{"mdproxy", false, "50", "50"},
				{"mdproxy-fwd", false, "1000000", "1000000"},
				{"mdproxy-bridge", true, "50", "50"},
			} {
				key := variantKey(m.key, v.name)
				in, err := b.lab.startMdproxy(key, bin, cfg.proxyCPU, b.standin, m.bridge, m.rate, m.burst, v.env...)
				if err != nil {
					return fmt.Errorf("mdproxy %s: %w", key, err)
				}
				add(key, "mdproxy", in.addr, "")
			}
		}
	} else {
		for _, v := range append([]variant{{}}, cfg.variants...) {
			for _, k := range []string{"mdproxy", "mdproxy-fwd", "mdproxy-bridge"} {
				add(variantKey(k, v.name), "mdproxy", "", "")
			}
		}
	}

	for _, pr := range []struct {
		name  string
		start func(string, int, string) (*peer, error)
	}{{"nginx", b.lab.startNginx}, {"haproxy", b.lab.startHAProxy}, {"caddy", b.lab.startCaddy}} {
		keys := []string{pr.name, pr.name + "-fwd"}
		if pr.name == "caddy" {
			keys = []string{"caddy"}
		}
		why := ""
		if !cfg.targets[pr.name] {
			why = "not selected (-targets)"
		} else if why = present(cfg.bins[pr.name]); why != "" {
			why = "absent: " + why
			b.notes = append(b.notes, fmt.Sprintf("%s is absent (%s): its rows have no figures; everything else ran.", pr.name, cfg.bins[pr.name]))
		}
		var p *peer
		if why == "" {
			if p, err = pr.start(cfg.bins[pr.name], cfg.proxyCPU, b.standin); err != nil {
				why = "did not start (see the notes)"
				b.notes = append(b.notes, fmt.Sprintf("%s did not start: %v", pr.name, err))
			}
		}
		if why != "" {
			for _, k := range keys {
				add(k, pr.name, "", why)
			}
			continue
		}
		if pr.name == "caddy" {
			add("caddy", "caddy", p.fwd, "")
		} else {
			add(pr.name, pr.name, p.limit, "")
			add(pr.name+"-fwd", pr.name, p.fwd, "")
		}
	}
	lim := "Debian's caddy has no rate-limit module (caddy-ratelimit is a third-party plugin): no limit to answer"
	if why := b.targets["caddy"].absent; why != "" {
		lim = why
	}
	add("caddy-limit", "caddy", "", lim)
	return nil
}

// variantKey is the target key of mdproxy's target key in variant name ("": mdproxy's
// own).
func variantKey(key, name string) string {
	if name == "" {
		return key
	}
	return key + "~" + name
}

// baseKey is the target key of mdproxy's own that key is a variant of (key itself when
// it is none), and the variant's name.
func baseKey(key string) (base, name string) {
	base, name, _ = strings.Cut(key, "~")
	return base, name
}

// mdproxyRow is mdproxy's row of each workload, beside which each variant's row goes.
var mdproxyRow = map[string]string{"limit": "mdproxy", "forward": "mdproxy-fwd", "upload": "mdproxy", "storehit": "mdproxy-bridge"}

// rowsWanted are workloadRows with a row of each variant after mdproxy's of each
// workload.
func (b *bench) rowsWanted() []struct{ workload, label, target string } {
	var out []struct{ workload, label, target string }
	for _, wr := range workloadRows {
		out = append(out, wr)
		if mdproxyRow[wr.workload] != wr.target || (wr.workload == "upload" && wr.label != "mdproxy (bridge off)") {
			continue
		}
		for _, v := range b.cfg.variants {
			out = append(out, struct{ workload, label, target string }{wr.workload, wr.label + " [" + v.name + "]", variantKey(wr.target, v.name)})
		}
	}
	return out
}

// layout makes the rows of the workloads selected.
func (b *bench) layout() {
	needWrk := present(b.cfg.bins["wrk"])
	if needWrk != "" && (b.cfg.workloads["limit"] || b.cfg.workloads["forward"] || b.cfg.workloads["storehit"]) {
		b.notes = append(b.notes, "wrk is absent ("+needWrk+"): the limit-answer, forwarded-poll and store-hit workloads were not measured.")
	}
	for _, wr := range b.rowsWanted() {
		if !b.cfg.workloads[wr.workload] {
			continue
		}
		t := b.targets[wr.target]
		r := &row{workload: wr.workload, label: wr.label, target: wr.target}
		switch {
		case t == nil:
			r.absent = "not started"
		case t.absent != "":
			r.absent = t.absent
		case wr.workload != "upload" && needWrk != "":
			r.absent = "wrk absent"
		case pollsStoredID(wr.workload, wr.target) && b.storedIDs[wr.target] == "":
			r.absent = "no stored result to poll (see the checks)"
		}
		if r.absent == "" {
			for _, v := range b.verified {
				if v.target == wr.target && v.err != nil && v.what == verifyWhat[wr.workload] {
					r.absent = "answered wrongly: " + v.err.Error()
				}
			}
		}
		b.rows = append(b.rows, r)
	}
}

// round measures every row once, each workload's rows in an order rotated by r, then
// the RSS workload.
func (b *bench) round(ctx context.Context, r int) error {
	for _, w := range allWorkloads {
		var rows []*row
		for _, rw := range b.rows {
			if rw.workload == w && rw.absent == "" {
				rows = append(rows, rw)
			}
		}
		for i := range rows {
			rw := rows[(i+r)%len(rows)]
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := b.measure(ctx, rw, r); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				rw.errs = append(rw.errs, err.Error())
				b.logf("round %d %s %s: %v", r+1, rw.workload, rw.label, err)
			}
		}
	}
	if b.cfg.workloads["rss"] && b.targets["mdproxy"].absent == "" {
		s, err := b.measureRSS(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.rssErr = err.Error()
			b.logf("round %d rss: %v", r+1, err)
		} else {
			b.rss = append(b.rss, s)
			b.logf("round %d rss: +%.1f MiB (baseline %.1f MiB)", r+1, mib(s.peak-s.baseline), mib(s.baseline))
		}
	}
	return nil
}

// pollsStoredID reports whether target's row of workload polls the id whose result
// mdproxy stored (checkStoreHit) rather than benchID: mdproxy's store hit, whose
// ceilings answer the same for any id.
func pollsStoredID(workload, target string) bool {
	base, _ := baseKey(target)
	return workload == "storehit" && base == "mdproxy-bridge"
}

// measure takes one sample of rw in round r.
func (b *bench) measure(ctx context.Context, rw *row, r int) error {
	t := b.targets[rw.target]
	if rw.workload == "upload" {
		s, err := b.measureUpload(ctx, t.base+"/file", b.cfg.uploadSize)
		if err != nil {
			return err
		}
		s.round = r
		rw.samples = append(rw.samples, s)
		b.logf("%s %-22s %8.0f MB/s", rw.workload, rw.label, s.mbps)
		return nil
	}
	id := benchID
	if pollsStoredID(rw.workload, rw.target) {
		id = b.storedIDs[rw.target]
	}
	u := t.base + "/file/" + id
	if b.cfg.warmup > 0 {
		if _, err := b.runWrk(ctx, u, b.cfg.warmup); err != nil {
			return err
		}
	}
	before, err := b.stats(ctx)
	if err != nil {
		return err
	}
	out, err := b.runWrk(ctx, u, b.cfg.duration)
	if err != nil {
		return err
	}
	after, err := b.stats(ctx)
	if err != nil {
		return err
	}
	res, err := parseWrk(out)
	if err != nil {
		return err
	}
	rw.samples = append(rw.samples, sample{round: r, wrk: res, upstreamGets: after.Gets - before.Gets})
	b.logf("%s %-22s %8.0f req/s p50 %v p99 %v non-2xx %d", rw.workload, rw.label, res.RPS, res.P50, res.P99, res.Non2xx)
	return nil
}

// stats reads the stand-in's counters.
func (b *bench) stats(ctx context.Context) (standinStats, error) {
	var st standinStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+b.standin+statsPath, nil)
	if err != nil {
		return st, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return st, fmt.Errorf("the stand-in's counters: %w", err)
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// runUploader runs this program's upload client pinned to the load CPU: n uploads of
// size bytes at once to u.
func (b *bench) runUploader(ctx context.Context, u string, size int64, n int) (*exec.Cmd, *bytes.Buffer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	argv := []string{exe}
	if b.lab.taskset != "" {
		argv = append([]string{b.lab.taskset, "-c", strconv.Itoa(b.cfg.loadCPU)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(b.lab.baseEnv(), "GOMAXPROCS=1", roleEnv+"=upload", urlEnv+"="+u,
		sizeEnv+"="+strconv.FormatInt(size, 10), countEnv+"="+strconv.Itoa(n))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 5 * time.Second
	return cmd, &out, cmd.Start()
}

// uploadOutcome reads what the upload client printed.
func uploadOutcome(err error, out *bytes.Buffer) (uploadResult, error) {
	var res uploadResult
	if err != nil {
		return res, fmt.Errorf("upload client: %w: %s", err, out.String())
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return res, fmt.Errorf("upload client's answer %q: %w", out.String(), err)
	}
	return res, nil
}

// measureUpload posts one upload of size bytes to u and checks that the stand-in got
// all of it.
func (b *bench) measureUpload(ctx context.Context, u string, size int64) (sample, error) {
	var s sample
	before, err := b.stats(ctx)
	if err != nil {
		return s, err
	}
	cmd, out, err := b.runUploader(ctx, u, size, 1)
	if err != nil {
		return s, err
	}
	res, err := uploadOutcome(cmd.Wait(), out)
	if err != nil {
		return s, err
	}
	after, err := b.stats(ctx)
	if err != nil {
		return s, err
	}
	s.up, s.complete, s.received = res, after.UploadsComplete-before.UploadsComplete, after.UploadBytes-before.UploadBytes
	if len(res.Errors) > 0 || res.Statuses[0] != http.StatusOK {
		return s, fmt.Errorf("upload answered %v %v", res.Statuses, res.Errors)
	}
	if s.complete != 1 || s.received != size {
		return s, fmt.Errorf("the stand-in received %d bytes (%d uploads whole), want %d", s.received, s.complete, size)
	}
	s.mbps = float64(size) / res.Seconds / 1e6
	return s, nil
}

// measureRSS starts a fresh mdproxy (bridge on, its default), runs cfg.rssUploads
// uploads of cfg.rssSize at once through it and returns how far its resident memory
// grew above what it was before.
func (b *bench) measureRSS(ctx context.Context) (rssSample, error) {
	var s rssSample
	in, err := b.lab.startMdproxy("mdproxy-rss", b.mdBin, b.cfg.proxyCPU, b.standin, true, "50", "50")
	if err != nil {
		return s, err
	}
	defer b.lab.remove(in.p)
	pid := in.p.Cmd.Process.Pid
	base := "http://" + in.addr
	// Warm it: a small upload and a poll, as a running sidecar has seen both.
	if _, err := upload(ctx, base+"/file", 64<<10); err != nil {
		return s, err
	}
	if err := b.get(ctx, base+"/file/"+benchID); err != nil {
		return s, err
	}
	time.Sleep(300 * time.Millisecond)
	st, err := procStatus(pid)
	if err != nil {
		return s, err
	}
	s.baseline = st["VmRSS"]
	hwmBefore := st["VmHWM"]
	cmd, out, err := b.runUploader(ctx, base+"/file", b.cfg.rssSize, b.cfg.rssUploads)
	if err != nil {
		return s, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var werr error
loop:
	for {
		select {
		case werr = <-done:
			break loop
		case <-tick.C:
			if st, err := procStatus(pid); err == nil {
				s.peak = max(s.peak, st["VmRSS"])
				s.samples++
			}
		}
	}
	if st, err := procStatus(pid); err == nil {
		s.peak = max(s.peak, st["VmRSS"])
		if st["VmHWM"] > hwmBefore {
			s.peak, s.hwm = max(s.peak, st["VmHWM"]), true
		}
	}
	res, err := uploadOutcome(werr, out)
	if err != nil {
		return s, err
	}
	s.statuses, s.errs = res.Statuses, res.Errors
	for _, c := range res.Statuses {
		if c != http.StatusOK {
			return s, fmt.Errorf("uploads answered %v %v", res.Statuses, res.Errors)
		}
	}
	return s, nil
}

// procStatus reads the kB fields of /proc/pid/status, in bytes.
func procStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		v = strings.TrimSpace(v)
		if !ok || !strings.HasSuffix(v, " kB") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(v, " kB"), 10, 64)
		if err == nil {
			m[k] = n << 10
		}
	}
	if _, ok := m["VmRSS"]; !ok {
		return nil, errors.New("no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
	}
	return m, sc.Err()
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// get GETs u and returns an error unless it is answered 2xx.
func (b *bench) get(ctx context.Context, u string) error {
	code, _, body, err := b.do(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return fmt.Errorf("GET %s: %d %s", u, code, trunc(body))
	}
	return nil
}

// do sends one request and reads the whole answer.
func (b *bench) do(ctx context.Context, method, u string, body []byte) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, rb, err
}
