// Package coretest starts the Core emulator in the test's process, through
// coresim.Start, on a free loopback port, and stops it at the test's cleanup. The
// coresim.Server it returns counts the requests and result polls that reached Core.
// It is for tests only.
package coretest

import (
	"testing"

	"github.com/mdproxy/mdproxy/coresim"
)

// Start starts the emulator with cfg on a free loopback port, without an admin
// listener (cfg's addresses are replaced), until cleanup. It fails t when cfg is
// refused.
func Start(t testing.TB, cfg coresim.Config, opts coresim.StartOptions) *coresim.Server {
	t.Helper()
	cfg.ListenAddr, cfg.AdminAddr = "127.0.0.1:0", ""
	s, err := coresim.Start(cfg, opts)
	if err != nil {
		t.Fatalf("coresim.Start = %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Fast is the emulator's default configuration at 200 times real time, so that a
// small file is scanned, and a request's latency passes, in a few real milliseconds.
func Fast() coresim.Config {
	cfg := coresim.DefaultConfig()
	cfg.Speedup = 200
	return cfg
}
