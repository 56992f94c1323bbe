package bench

import (
	"context"
	"maps"
	"os"
	"time"

	"github.com/mdproxy/mdproxy/coresim"
	"github.com/mdproxy/mdproxy/sidecar"
)

// The test helpers of package bench: the data set, the emulator and mdproxy of a case,
// the workload, and soak samples.

// smallSpec is a data set small enough for a unit test, with the seed's shape.
var smallSpec = DataSpec{Files: 12, MinBytes: 20_000, MaxBytes: 400_000, MeanSize: 80_000, MeanObjects: 20, Seed: 7}

// testEnv is an emulator configuration fast enough for a unit test, and mdproxy's
// shipped wiring for the Proxy-N cases, as mdbench runs it.
func testEnv() Env {
	cfg := coresim.DefaultConfig()
	cfg.Speedup = 50
	cfg.Tick = time.Millisecond
	return Env{Sim: cfg, StartProxy: startProxy}
}

// startProxy runs mdproxy in-process with environ, logging warnings to stderr.
func startProxy(ctx context.Context, environ map[string]string) (string, func() error, error) {
	environ = maps.Clone(environ)
	environ["MDPROXY_LOG_LEVEL"] = "warn"
	return sidecar.Start(ctx, environ, os.Stderr)
}

// testWorkload is the seed's client at a small scale.
func testWorkload(n int) Workload {
	w := SeedWorkload
	w.Submissions = n
	w.Deadline = 2 * time.Hour
	return w
}

// soakSeriesOf builds samples: a baseline, one load sample a second whose metrics are
// given by f(i), and an idle sample with idleGoroutines.
func soakSeriesOf(n int, f func(i int) SoakSample, idleGoroutines float64) []SoakSample {
	base := SoakSample{Phase: "baseline", RSSBytes: 10 << 20, HeapInuseBytes: 2 << 20, Goroutines: 10, OpenFDs: 12}
	out := []SoakSample{base}
	for i := range n {
		s := f(i)
		s.T, s.Phase = float64(i+1), "load"
		out = append(out, s)
	}
	idle := base
	idle.T, idle.Phase, idle.Goroutines = float64(n+1), "idle", idleGoroutines
	return append(out, idle)
}

// steady is a load sample with the values of a healthy proxy under load, with a
// garbage collector's saw-tooth on the heap and a few requests more or less in flight.
func steady(i int) SoakSample {
	return SoakSample{RSSBytes: 17 << 20, HeapInuseBytes: float64(4<<20 + (i%3)<<19),
		Goroutines: float64(40 + i%4), OpenFDs: float64(28 + i%3)}
}

// ptr returns a pointer to v, for the optional figures.
func ptr(v float64) *float64 { return &v }
