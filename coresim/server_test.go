package coresim

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestStartCounts: Start serves Core's API on a free port and counts every request
// and, apart, the result polls (GET /file/{data_id}: not /file/rules, not a POST).
func TestStartCounts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Speedup = 200 // the request latency and a poll's core time pass in a few ms
	cfg.ListenAddr, cfg.AdminAddr = "127.0.0.1:0", ""
	srv, err := Start(cfg, StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/file/0123456789abcdef"},
		{http.MethodGet, "/file/rules"},
		{http.MethodGet, "/file/x/y"},
		{http.MethodPost, "/file/0123456789abcdef"},
		{http.MethodGet, "/version"},
		{http.MethodGet, "/file/fedcba9876543210"},
	} {
		req, _ := http.NewRequest(r.method, srv.URL+r.path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		resp.Body.Close()
	}
	if got := srv.Requests(); got != 6 {
		t.Errorf("Requests() = %d, want 6", got)
	}
	if got := srv.Polls(); got != 2 {
		t.Errorf("Polls() = %d, want 2", got)
	}
	srv.Close()
	srv.Close() // idempotent
	if _, err := c.Get(srv.URL + "/version"); err == nil {
		t.Errorf("GET after Close succeeded, want the connection refused")
	}
}

// TestStartAddressInUse: an address that cannot be listened on is an error naming its
// variable, and nothing is left listening.
func TestStartAddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name      string
		api, adm  string
		wantInErr string
	}{
		{"api", busy.Addr().String(), "", "CORESIM_LISTEN_ADDR"},
		{"admin", "127.0.0.1:0", busy.Addr().String(), "CORESIM_ADMIN_ADDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ListenAddr, cfg.AdminAddr = tc.api, tc.adm
			srv, err := Start(cfg, StartOptions{})
			if err == nil {
				srv.Close()
				t.Fatalf("Start on a busy address = nil error, want one naming %s", tc.wantInErr)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("Start on a busy address = %v, want it to name %s", err, tc.wantInErr)
			}
		})
	}
}
