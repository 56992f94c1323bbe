package proxy

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// sentForwarding is what a load balancer in front of mdproxy tells of its client, as
// the trial of issue 29 sent it: the client asked for https://public.example/ on port
// 443.
var sentForwarding = map[string]string{
	"X-Forwarded-For":    "203.0.113.9",
	"X-Forwarded-Proto":  "https",
	"X-Forwarded-Host":   "public.example",
	"X-Forwarded-Port":   "443",
	"X-Forwarded-Prefix": "/core",
	"X-Forwarded-Ssl":    "on",
	"X-Real-Ip":          "203.0.113.9",
	"Forwarded":          `for=203.0.113.9;proto=https;host=public.example`,
}

// TestForwardedFields checks what Core is told of the client: a trusted peer's
// forwarding fields as it sent them (X-Forwarded-For extended with the peer), an
// untrusted peer's replaced by mdproxy's own view (X-Forwarded-For the peer,
// X-Forwarded-Proto http, X-Forwarded-Host the Host it asked for) or dropped (the
// others, Forwarded included); a trusted peer that sent none gets mdproxy's view too.
func TestForwardedFields(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		send    map[string]string
		want    map[string]string // "" for a field Core must not get
	}{
		{"trusted peer", loopback, sentForwarding, map[string]string{
			"X-Forwarded-For":    "203.0.113.9, 127.0.0.1",
			"X-Forwarded-Proto":  "https",
			"X-Forwarded-Host":   "public.example",
			"X-Forwarded-Port":   "443",
			"X-Forwarded-Prefix": "/core",
			"X-Forwarded-Ssl":    "on",
			"X-Real-Ip":          "203.0.113.9",
			"Forwarded":          `for=203.0.113.9;proto=https;host=public.example`,
		}},
		{"untrusted peer", nil, sentForwarding, map[string]string{
			"X-Forwarded-For":    "127.0.0.1",
			"X-Forwarded-Proto":  "http",
			"X-Forwarded-Host":   "HOST",
			"X-Forwarded-Port":   "",
			"X-Forwarded-Prefix": "",
			"X-Forwarded-Ssl":    "",
			"X-Real-Ip":          "",
			"Forwarded":          "",
		}},
		{"another peer trusted", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, sentForwarding, map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "http",
			"X-Forwarded-Host":  "HOST",
			"X-Forwarded-Port":  "",
			"Forwarded":         "",
		}},
		{"trusted peer that sent none", loopback, nil, map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "http",
			"X-Forwarded-Host":  "HOST",
			"X-Forwarded-Port":  "",
			"Forwarded":         "",
		}},
		{"trusted peer, some sent", loopback, map[string]string{"X-Forwarded-Proto": "https"}, map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "https",
			"X-Forwarded-Host":  "HOST",
		}},
		{"trusted peer, fields named in Connection", loopback, map[string]string{
			"Connection": "X-Forwarded-Proto, x-forwarded-port", "X-Forwarded-Proto": "https", "X-Forwarded-Port": "443",
			"X-Forwarded-Host": "public.example",
		}, map[string]string{
			"X-Forwarded-Proto": "http", // for mdproxy alone: set from its own view
			"X-Forwarded-Port":  "",
			"X-Forwarded-Host":  "public.example",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan http.Header, 1)
			core := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() })
			front, _ := newTestProxy(t, core, func(o *Options) { o.TrustedProxies = tc.trusted })
			h := http.Header{}
			for k, v := range tc.send {
				h.Set(k, v)
			}
			resp, body := do(t, newClient(t), http.MethodGet, front+"/file/abc", h)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /file/abc = %d %q, want 200", resp.StatusCode, body)
			}
			seen := <-got
			for k, want := range tc.want {
				want = strings.ReplaceAll(want, "HOST", strings.TrimPrefix(front, "http://"))
				if v := strings.Join(seen.Values(k), ", "); v != want {
					t.Errorf("Core got %s: %q, want %q", k, v, want)
				}
			}
		})
	}
}
