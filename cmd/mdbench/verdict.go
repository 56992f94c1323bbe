package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/mdproxy/mdproxy/bench"
)

// judged are the cases whose order and calibration the published benchmark sets
// (bench.CheckQuick): without one of them there is nothing to judge.
var judged = []string{"No-limit", "Rate-1", "Webhook", "Bridge"}

// machineLoad returns the 1-minute load average (Linux's /proc/loadavg) and the number
// of CPUs; a load of -1 where it cannot be read.
func machineLoad() (load float64, cpus int) {
	cpus = runtime.NumCPU()
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1, cpus
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1, cpus
	}
	if load, err = strconv.ParseFloat(f[0], 64); err != nil {
		return -1, cpus
	}
	return load, cpus
}

// verdict judges a run's figures as bench.CheckQuick does (No-limit slower than
// Rate-1, Rate-1 within 10% of Webhook, Bridge within 5% of Webhook with no fetch
// refused, every submission answered, every case's verdicts No-limit's) and returns
// the demo's last line: "verdict: ... hold" and nil, or an error whose message is
// "verdict: ... do NOT hold: <why>", naming a loaded machine as the likely cause when
// the load average before the run (loadBefore, -1: unknown) was at least half the
// CPUs: the emulator runs on virtual time sped up, and a busy machine stretches every
// case unevenly.
func verdict(figs []bench.Figures, submissions int, loadBefore float64, cpus int) (string, error) {
	var ran []string
	for _, f := range figs {
		for _, c := range judged {
			if f.Case == c {
				ran = append(ran, c)
			}
		}
	}
	if len(ran) == 0 {
		return "verdict: none of " + strings.Join(judged, ", ") + " ran: no published order to judge", nil
	}
	err := bench.CheckQuick(figs, submissions)
	if err == nil {
		return "verdict: the published order and calibration hold (" + strings.Join(ran, ", ") + ")", nil
	}
	why := strings.ReplaceAll(err.Error(), "\n", "; ")
	cause := "the machine was idle at the start; if a rerun fails alike, mdproxy or the emulator changed"
	switch {
	case loadBefore < 0:
		cause = "the machine's load is unknown: a loaded machine may be the cause; rerun on an idle one"
	case loadBefore >= float64(cpus)/2:
		cause = fmt.Sprintf("the machine was busy before the run (load average %.2f on %d CPUs): a loaded machine is the likely cause; rerun on an idle one", loadBefore, cpus)
	}
	return "", errors.New("verdict: the published order and calibration do NOT hold: " + why + " (" + cause + ")")
}
