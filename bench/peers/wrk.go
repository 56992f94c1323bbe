package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// wrkResult is what one wrk run reports.
type wrkResult struct {
	Requests int64         // answers received
	Seconds  float64       // how long it ran
	RPS      float64       // Requests/sec
	P50, P99 time.Duration // from --latency's distribution
	Non2xx   int64         // "Non-2xx or 3xx responses"
	SockErrs int64         // connect + read + write + timeout errors
}

var (
	reRequests = regexp.MustCompile(`(?m)^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m|h)`)
	reRPS      = regexp.MustCompile(`(?m)^Requests/sec:\s+([0-9.]+)`)
	reNon2xx   = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses: (\d+)`)
	reSock     = regexp.MustCompile(`(?m)^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	rePct      = regexp.MustCompile(`^\s*(50|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s|m|h)\s*$`)
)

// parseWrk reads wrk's --latency output.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	m := reRequests.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("no request count in wrk's output: %q", out)
	}
	r.Requests, _ = strconv.ParseInt(m[1], 10, 64)
	d, err := wrkDuration(m[2], m[3])
	if err != nil {
		return r, err
	}
	r.Seconds = d.Seconds()
	m = reRPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("no Requests/sec in wrk's output: %q", out)
	}
	r.RPS, _ = strconv.ParseFloat(m[1], 64)
	if m = reNon2xx.FindStringSubmatch(out); m != nil {
		r.Non2xx, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m = reSock.FindStringSubmatch(out); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.ParseInt(s, 10, 64)
			r.SockErrs += n
		}
	}
	var got50, got99 bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := rePct.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		d, err := wrkDuration(m[2], m[3])
		if err != nil {
			return r, err
		}
		if m[1] == "50" {
			r.P50, got50 = d, true
		} else {
			r.P99, got99 = d, true
		}
	}
	if !got50 || !got99 {
		return r, fmt.Errorf("no latency distribution in wrk's output (run with --latency): %q", out)
	}
	return r, nil
}

// wrkDuration reads a wrk time: a number and us, ms, s, m or h.
func wrkDuration(num, unit string) (time.Duration, error) {
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, err
	}
	mult := map[string]float64{"us": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}[unit]
	return time.Duration(math.Round(f * mult)), nil
}

// wrkSeconds is d as wrk takes it: whole seconds, at least 1.
func wrkSeconds(d time.Duration) string {
	s := int64((d + time.Second/2) / time.Second)
	return strconv.FormatInt(max(1, s), 10) + "s"
}

// runWrk runs wrk against url for d, pinned to cpu, and returns its output.
func (b *bench) runWrk(ctx context.Context, url string, d time.Duration) (string, error) {
	argv := []string{b.cfg.bins["wrk"], "-t" + strconv.Itoa(b.cfg.threads), "-c" + strconv.Itoa(b.cfg.connections),
		"-d" + wrkSeconds(d), "--latency", url}
	if b.lab.taskset != "" {
		argv = append([]string{b.lab.taskset, "-c", strconv.Itoa(b.cfg.loadCPU)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = b.lab.baseEnv()
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("wrk: %w: %s", err, out)
	}
	return string(out), nil
}
