package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

// TestBinaryClientKeysFreed is issue 9's eighth case against the built binary: many
// distinct apikeys on a route with a per-client share and no rate. The keys tracked never
// exceed MDPROXY_CLIENT_KEYS_MAX, the requests beyond it pass (the route's bucket would
// still apply) and are counted and logged, and once the window passed the keys are freed
// with no further request: only /metrics is read meanwhile.
func TestBinaryClientKeysFreed(t *testing.T) {
	const (
		keys    = 12000
		keysMax = 500
		workers = 8
	)
	up := sidecartest.NewUpstream(t)
	start := time.Now()
	p := startBinary(t, up.URL, map[string]string{
		// The route that grew without bound: a per-client share and no rate.
		"MDPROXY_FILE_RESULT_RATE":          "0",
		"MDPROXY_FILE_RESULT_CLIENT_LIMIT":  "3",
		"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "1s",
		// A window too long to roll during the test, for the per-client decision.
		"MDPROXY_HASH_LOOKUP_CLIENT_LIMIT":  "3",
		"MDPROXY_HASH_LOOKUP_CLIENT_WINDOW": "1h",
		"MDPROXY_CLIENT_KEYS_MAX":           fmt.Sprint(keysMax),
	})
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: safety}
	get := func(path, apikey string) (int, string, error) {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, p.proxyURL+path, nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("apikey", apikey)
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	series := func(name, route string) string { return name + `{route="` + route + `"}` }
	tracked := func(route string) float64 { return p.metric(t, series("mdproxy_limiter_client_keys", route)) }

	// The per-client decision is unchanged: three requests a window, then the limit answer.
	for i, want := range []int{200, 200, 200, 503} {
		code, body, err := get("/hash/abc", "one-client")
		if err != nil {
			t.Fatalf("GET /hash/abc #%d: %v", i+1, err)
		}
		if code != want {
			t.Fatalf("GET /hash/abc #%d = %d %q, want %d", i+1, code, sidecartest.Short(body), want)
		}
		if code == 503 && !strings.Contains(body, "this client") {
			t.Errorf("GET /hash/abc #%d body = %q, want the per-client limit answer", i+1, sidecartest.Short(body))
		}
	}
	if got := tracked("hash_lookup"); got != 1 {
		t.Errorf("%s = %v, want 1", series("mdproxy_limiter_client_keys", "hash_lookup"), got)
	}

	heapBefore := p.metric(t, "go_memstats_heap_inuse_bytes")
	floodStart := time.Now()
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= keys || failed.Load() > 0 {
					return
				}
				code, body, err := get(fmt.Sprintf("/file/d%d", i), fmt.Sprintf("apikey-%d", i))
				if err != nil || code != 200 {
					// A new key is always within its share, tracked or not.
					if failed.Add(1) == 1 {
						t.Errorf("GET /file/d%d with a new apikey = %d %q, %v; want 200", i, code, sidecartest.Short(body), err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.FailNow()
	}
	flood := time.Since(floodStart)
	seen := len(up.Requests())
	heapFlood := p.metric(t, "go_memstats_heap_inuse_bytes")

	if got := tracked("file_result"); got > keysMax {
		t.Errorf("after %d keys, %s = %v, want at most %d", keys, series("mdproxy_limiter_client_keys", "file_result"), got, keysMax)
	}
	if got := p.metric(t, series("mdproxy_limiter_client_untracked_requests_total", "file_result")); got <= 0 {
		t.Errorf("after %d keys, %s = %v, want above 0 (keys beyond %d)",
			keys, series("mdproxy_limiter_client_untracked_requests_total", "file_result"), got, keysMax)
	}

	// The keys are freed with no further request: 1 s windows, swept every second.
	deadline := time.Now().Add(safety)
	for tracked("file_result") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%v after the last request, %s = %v, want 0", safety,
				series("mdproxy_limiter_client_keys", "file_result"), tracked("file_result"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	heapAfter := p.metric(t, "go_memstats_heap_inuse_bytes")
	t.Logf("%d keys sent in %v, freed %v later", keys, flood.Round(time.Millisecond), (time.Since(floodStart) - flood).Round(time.Millisecond))
	t.Logf("go_memstats_heap_inuse_bytes: %.0f before, %.0f after %d keys, %.0f once they were freed",
		heapBefore, heapFlood, keys, heapAfter)
	if got := len(up.Requests()); got != seen {
		t.Errorf("Core received %d requests while the keys were freed, want none", got-seen)
	}
	if got := tracked("hash_lookup"); got != 1 {
		t.Errorf("%s = %v, want 1 (its window has not passed)", series("mdproxy_limiter_client_keys", "hash_lookup"), got)
	}

	// Warned at most once a sweep (a second here), with the route and no key.
	elapsed := time.Since(start)
	var warnings int
	for _, line := range strings.Split(p.logs.String(), "\n") {
		if !strings.Contains(line, "per-client share full") {
			continue
		}
		warnings++
		if !strings.Contains(line, `"route":"file_result"`) || strings.Contains(line, "apikey-") {
			t.Errorf("warning %s, want the route file_result and no apikey", line)
		}
	}
	if warnings == 0 || warnings > int(elapsed/time.Second)+1 {
		t.Errorf("%d warnings of a full share in %v, want 1 to one a second", warnings, elapsed.Round(time.Second))
	}
}

// pollsFrom sends one GET /file/x to p for each X-Forwarded-For value of clients, from
// its own connection on loopback, and returns how many Core answered (200).
func pollsFrom(t *testing.T, p *proc, clients ...string) (passed int) {
	t.Helper()
	c := sidecartest.NewClient(t)
	for _, xff := range clients {
		req, err := http.NewRequest(http.MethodGet, p.proxyURL+"/file/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET /file/x (X-Forwarded-For %s): %v", xff, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			passed++
		case http.StatusServiceUnavailable:
		default:
			t.Errorf("GET /file/x (X-Forwarded-For %s) = %d, want 200 or the limit answer", xff, resp.StatusCode)
		}
	}
	return passed
}

// inPrefix returns the addresses prefix::1 to prefix::n.
func inPrefix(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s::%x", prefix, i+1)
	}
	return out
}

// TestBinaryClientIPv6Prefix is issue 29's trial of a per-client share and IPv6
// clients, against the binary behind a trusted proxy on loopback: at a client limit of
// 2 per 10 s, eight clients of one /64 (2001:db8:1:2::1 to ::8, as X-Forwarded-For
// tells them) get 2 requests through in all, not 8; a client of another /64 is not
// affected; an IPv4 client written as an IPv4-mapped IPv6 address shares the key of its
// IPv4 form. MDPROXY_CLIENT_IPV6_PREFIX=128 keys each address on its own, and 56
// groups two /64s of one /56.
func TestBinaryClientIPv6Prefix(t *testing.T) {
	t.Parallel()
	up := sidecartest.NewUpstream(t)
	env := func(prefix string) map[string]string {
		e := map[string]string{
			"MDPROXY_TRUSTED_PROXIES":           "127.0.0.1,::1",
			"MDPROXY_FILE_RESULT_RATE":          "0", // no bucket: the share alone decides
			"MDPROXY_FILE_RESULT_CLIENT_LIMIT":  "2",
			"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "10s",
		}
		if prefix != "" {
			e["MDPROXY_CLIENT_IPV6_PREFIX"] = prefix
		}
		return e
	}

	t.Run("default /64", func(t *testing.T) {
		t.Parallel()
		p := startBinary(t, up.URL, env(""))
		if n := pollsFrom(t, p, inPrefix("2001:db8:1:2", 8)...); n != 2 {
			t.Errorf("8 clients of 2001:db8:1:2::/64 at a client limit of 2: %d passed, want 2", n)
		}
		if n := pollsFrom(t, p, "2001:db8:1:3::1", "2001:db8:1:3::1"); n != 2 {
			t.Errorf("a client of another /64, twice: %d passed, want 2 (not affected)", n)
		}
		if n := pollsFrom(t, p, "::ffff:203.0.113.9", "203.0.113.9", "::ffff:203.0.113.9"); n != 2 {
			t.Errorf("203.0.113.9, twice as ::ffff:203.0.113.9 and once as itself: %d passed, want 2 (one key)", n)
		}
	})
	t.Run("/128", func(t *testing.T) {
		t.Parallel()
		p := startBinary(t, up.URL, env("128"))
		if n := pollsFrom(t, p, inPrefix("2001:db8:1:2", 8)...); n != 8 {
			t.Errorf("8 clients of one /64, each its own key: %d passed, want 8", n)
		}
	})
	t.Run("/56", func(t *testing.T) {
		t.Parallel()
		p := startBinary(t, up.URL, env("56"))
		if n := pollsFrom(t, p, "2001:db8:1:2::1", "2001:db8:1:3::1", "2001:db8:1:4::1", "2001:db8:1:100::1"); n != 3 {
			t.Errorf("3 clients of 2001:db8:1::/56 and one of another /56: %d passed, want 3", n)
		}
	})
}

// TestBinaryClientIPv6PrefixPeers is TestBinaryClientIPv6Prefix's default case with no
// proxy in front: the clients' own source addresses, 2001:db8:1:2::1 to ::8 and
// 2001:db8:1:3::1, which the machine must have on its loopback interface, e.g. as
// root (and ip -6 addr del ... to remove them):
//
//	for a in 2001:db8:1:2::{1..8} 2001:db8:1:3::1; do ip -6 addr add $a/128 dev lo nodad; done
//
// It is skipped when it cannot send from them.
func TestBinaryClientIPv6PrefixPeers(t *testing.T) {
	t.Parallel()
	clients := append(inPrefix("2001:db8:1:2", 8), "2001:db8:1:3::1")
	for _, a := range clients {
		l, err := net.Listen("tcp6", "["+a+"]:0")
		if err != nil {
			t.Skipf("cannot send from %s on this machine (%v): see the test's comment", a, err)
		}
		l.Close()
	}
	up := sidecartest.NewUpstream(t)
	p := startBinary(t, up.URL, map[string]string{
		"MDPROXY_LISTEN_ADDR":               "[2001:db8:1:2::1]:0",
		"MDPROXY_FILE_RESULT_RATE":          "0",
		"MDPROXY_FILE_RESULT_CLIENT_LIMIT":  "2",
		"MDPROXY_FILE_RESULT_CLIENT_WINDOW": "10s",
	})
	poll := func(from string) int {
		t.Helper()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		tr := &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: safety}).Get("http://" + p.proxyAddr + "/file/x")
		if err != nil {
			t.Fatalf("GET /file/x from %s: %v", from, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	passed := 0
	for _, a := range clients[:8] {
		if poll(a) == http.StatusOK {
			passed++
		}
	}
	if passed != 2 {
		t.Errorf("8 clients of 2001:db8:1:2::/64 at a client limit of 2: %d passed, want 2", passed)
	}
	if code := poll(clients[8]); code != http.StatusOK {
		t.Errorf("a client of another /64 = %d, want 200 (not affected)", code)
	}
}
