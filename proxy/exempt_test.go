package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/mdproxy/mdproxy/limiter"
)

// TestExemptClients: at rate 1, burst 1 (a fake clock that never moves: no token comes
// back), an exempt address prefix and an exempt apikey get 10 of 10 polls through and
// count as decision exempt, taking no token; another client gets the one token, then
// the limit answer. The client address is the trusted proxy's X-Forwarded-For.
func TestExemptClients(t *testing.T) {
	digest := sha256.Sum256([]byte("trusted-key"))
	exempt := " 10.1.0.0/16 , sha256:" + hex.EncodeToString(digest[:]) + ", 2001:db8::7"
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 1, Burst: 1, Exempt: exempt}}, newFakeClock())
	up := &countingUpstream{}
	base, reg := newTestProxy(t, up, func(o *Options) {
		o.Limits = set
		o.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	client := keepAliveClient(t, 2)
	polls := func(from, apikey string) (ok, limited int) {
		t.Helper()
		for range 10 {
			h := http.Header{"X-Forwarded-For": {from}}
			if apikey != "" {
				h.Set("apikey", apikey)
			}
			resp, _ := do(t, client, http.MethodGet, base+"/file/abc", h)
			switch resp.StatusCode {
			case http.StatusOK:
				ok++
			case http.StatusServiceUnavailable:
				limited++
			default:
				t.Errorf("GET /file/abc from %s = %d, want 200 or 503", from, resp.StatusCode)
			}
		}
		return ok, limited
	}
	for _, tc := range []struct {
		name, from, apikey string
		wantOK             int
	}{
		{"exempt prefix", "10.1.200.3", "", 10},
		{"exempt apikey", "192.0.2.1", "trusted-key", 10},
		{"exempt address", "2001:db8::7", "", 10},
		{"another apikey", "192.0.2.1", "other-key", 1},
		{"outside the prefix", "10.2.0.1", "", 0}, // the one token is gone
	} {
		if ok, limited := polls(tc.from, tc.apikey); ok != tc.wantOK || limited != 10-tc.wantOK {
			t.Errorf("%s: 10 polls = %d 200 and %d 503, want %d and %d", tc.name, ok, limited, tc.wantOK, 10-tc.wantOK)
		}
	}
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "exempt"}, 30)
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "allowed"}, 1)
	checkMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}, 19)
	if got := up.n.Load(); got != 31 {
		t.Errorf("polls that reached Core = %d, want 31 (30 exempt, 1 token)", got)
	}
}

// TestExemptUntrustedForwardedFor: an exempt prefix is matched against the client
// address as the per-client share reads it, so that X-Forwarded-For from a peer that is
// not a trusted proxy exempts no one.
func TestExemptUntrustedForwardedFor(t *testing.T) {
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 1, Burst: 1, Exempt: "10.0.0.0/8"}}, newFakeClock())
	base, _ := newTestProxy(t, &countingUpstream{}, func(o *Options) { o.Limits = set })
	client := keepAliveClient(t, 1)
	var codes []int
	for range 3 {
		resp, _ := do(t, client, http.MethodGet, base+"/file/abc", http.Header{"X-Forwarded-For": {"10.0.0.1"}})
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 503 || codes[2] != 503 {
		t.Errorf("3 polls claiming X-Forwarded-For 10.0.0.1 from an untrusted peer = %v, want 200, 503, 503", codes)
	}
}

// TestParseExempt: prefixes, bare addresses and digests are read; anything else is an
// error that names the entry by its position and never quotes it (it may be a key).
func TestParseExempt(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	good := []string{"", " ", "10.0.0.0/8", "192.0.2.1", "2001:db8::/32", "::ffff:10.0.0.0/104",
		"sha256:" + digest, "SHA256:" + strings.ToUpper(digest), "10.0.0.0/8,,sha256:" + digest}
	for _, s := range good {
		if _, err := ParseExempt(s); err != nil {
			t.Errorf("ParseExempt(%q) = %v, want no error", s, err)
		}
	}
	for _, s := range []string{"my-secret-apikey", "10.0.0.0/33", "sha256:abc", "sha256:" + digest + "00",
		"sha256:" + strings.Repeat("zz", 32), "fe80::1%eth0", "10.0.0.0/8,my-secret-apikey"} {
		_, err := ParseExempt(s)
		if err == nil {
			t.Errorf("ParseExempt(%q) = no error, want one", s)
			continue
		}
		if strings.Contains(err.Error(), "my-secret-apikey") {
			t.Errorf("ParseExempt(%q) = %v: quotes the entry", s, err)
		}
	}
	e, _ := ParseExempt("::ffff:10.0.0.0/104")
	if r := (&http.Request{RemoteAddr: "10.9.9.9:1234"}); !e.allows(r, nil) {
		t.Error("an IPv4-mapped prefix does not exempt an IPv4 client in it")
	}
}
