package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestBinaryForwardedFields is issue 29's trial of what Core is told of a client behind
// a load balancer that ends TLS: the binary, with the balancer's address in
// MDPROXY_TRUSTED_PROXIES, passes its X-Forwarded-Proto (https), X-Forwarded-Host,
// X-Forwarded-Port and Forwarded as sent, and extends its X-Forwarded-For chain; without
// it, Core is told mdproxy's own view (http, the Host asked for, the peer) and none of
// the peer's other claims.
func TestBinaryForwardedFields(t *testing.T) {
	t.Parallel()
	sent := map[string]string{
		"X-Forwarded-For":   "203.0.113.9",
		"X-Forwarded-Proto": "https",
		"X-Forwarded-Host":  "public.example",
		"X-Forwarded-Port":  "443",
		"X-Real-Ip":         "203.0.113.9",
		"Forwarded":         "for=203.0.113.9;proto=https;host=public.example",
	}
	for _, tc := range []struct {
		name    string
		trusted string
		want    map[string]string // "" for a field Core must not get; HOST: mdproxy's address
	}{
		{"trusted balancer", "127.0.0.0/8,::1", map[string]string{
			"X-Forwarded-For":   "203.0.113.9, 127.0.0.1",
			"X-Forwarded-Proto": "https",
			"X-Forwarded-Host":  "public.example",
			"X-Forwarded-Port":  "443",
			"X-Real-Ip":         "203.0.113.9",
			"Forwarded":         "for=203.0.113.9;proto=https;host=public.example",
		}},
		{"untrusted peer", "", map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "http",
			"X-Forwarded-Host":  "HOST",
			"X-Forwarded-Port":  "",
			"X-Real-Ip":         "",
			"Forwarded":         "",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan http.Header, 1)
			core := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Clone()
			}))
			t.Cleanup(core.Close)
			p := startBinary(t, core.URL, map[string]string{"MDPROXY_TRUSTED_PROXIES": tc.trusted})
			req, err := http.NewRequest(http.MethodGet, p.proxyURL+"/file/abc", nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range sent {
				req.Header.Set(k, v)
			}
			resp, err := sidecartest.NewClient(t).Do(req)
			if err != nil {
				t.Fatalf("GET /file/abc: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /file/abc = %d, want 200 from Core", resp.StatusCode)
			}
			seen := <-got
			for k, want := range tc.want {
				want = strings.ReplaceAll(want, "HOST", p.proxyAddr)
				if v := strings.Join(seen.Values(k), ", "); v != want {
					t.Errorf("Core got %s: %q, want %q", k, v, want)
				}
			}
		})
	}
}
