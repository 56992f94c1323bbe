package proxy

import (
	"cmp"
	"net/http"
	"net/netip"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/metrics"
)

// TestClientAddr checks which address keys a request's per-client share.
func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("fd00::/8"),
	}
	tests := []struct {
		name    string
		peer    string
		xff     []string
		realIP  string
		trusted []netip.Prefix
		want    string
	}{
		{"untrusted peer, no headers", "203.0.113.5:1234", nil, "", trusted, "203.0.113.5"},
		{"untrusted peer with XFF", "203.0.113.5:1234", []string{"1.2.3.4"}, "", trusted, "203.0.113.5"},
		{"untrusted peer with X-Real-IP", "203.0.113.5:1234", nil, "1.2.3.4", trusted, "203.0.113.5"},
		{"no trusted list", "10.0.0.1:1234", []string{"1.2.3.4"}, "1.2.3.4", nil, "10.0.0.1"},
		{"trusted peer, one entry", "10.0.0.1:1234", []string{"1.2.3.4"}, "", trusted, "1.2.3.4"},
		{"trusted peer, rightmost untrusted", "10.0.0.1:1234", []string{"6.6.6.6, 1.2.3.4, 5.6.7.8, 10.0.0.2"}, "", trusted, "5.6.7.8"},
		{"multiple XFF headers", "10.0.0.1:1234", []string{"6.6.6.6, 1.2.3.4", "5.6.7.8, 10.0.0.3"}, "", trusted, "5.6.7.8"},
		{"multiple headers, last all trusted", "10.0.0.1:1234", []string{"9.9.9.9", "10.0.0.3", "10.0.0.4"}, "", trusted, "9.9.9.9"},
		{"every entry trusted: leftmost", "10.0.0.1:1234", []string{"10.0.0.5, 10.0.0.6"}, "", trusted, "10.0.0.5"},
		{"garbage behind trusted hops", "10.0.0.1:1234", []string{"1.2.3.4, garbage, 10.0.0.2"}, "", trusted, "10.0.0.2"},
		{"garbage rightmost", "10.0.0.1:1234", []string{"5.6.7.8, nonsense"}, "", trusted, "10.0.0.1"},
		{"garbage only", "10.0.0.1:1234", []string{"unknown"}, "", trusted, "10.0.0.1"},
		{"empty entry", "10.0.0.1:1234", []string{"1.2.3.4, "}, "", trusted, "10.0.0.1"},
		{"entry with port", "10.0.0.1:1234", []string{"1.2.3.4:5678"}, "", trusted, "1.2.3.4"},
		{"spaces", "10.0.0.1:1234", []string{"  1.2.3.4  ,10.0.0.9 "}, "", trusted, "1.2.3.4"},
		{"IPv6 trusted peer, IPv6 client", "[fd00::1]:443", []string{"2001:db8::1"}, "", trusted, "2001:db8::1"},
		{"IPv6 client with brackets and port", "[fd00::1]:443", []string{"[2001:db8::2]:1234"}, "", trusted, "2001:db8::2"},
		{"IPv6 untrusted peer", "[2001:db8::9]:443", []string{"1.2.3.4"}, "", trusted, "2001:db8::9"},
		{"IPv4-mapped trusted peer", "[::ffff:10.0.0.1]:80", []string{"1.2.3.4"}, "", trusted, "1.2.3.4"},
		{"IPv4-mapped client", "10.0.0.1:80", []string{"::ffff:1.2.3.4"}, "", trusted, "1.2.3.4"},
		{"X-Real-IP from trusted peer", "10.0.0.1:1234", nil, "1.2.3.4", trusted, "1.2.3.4"},
		{"X-Real-IP IPv6 from trusted peer", "[fd00::1]:1234", nil, "2001:db8::7", trusted, "2001:db8::7"},
		{"XFF wins over X-Real-IP", "10.0.0.1:1234", []string{"5.6.7.8"}, "1.2.3.4", trusted, "5.6.7.8"},
		{"garbage X-Real-IP", "10.0.0.1:1234", nil, "nope", trusted, "10.0.0.1"},
		{"bad RemoteAddr", "nonsense", []string{"1.2.3.4"}, "", trusted, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if tt.realIP != "" {
				r.Header.Set("X-Real-IP", tt.realIP)
			}
			if got := clientAddr(r, tt.trusted).String(); got != tt.want {
				t.Errorf("clientAddr(peer %s, XFF %q, X-Real-IP %q) = %s, want %s", tt.peer, tt.xff, tt.realIP, got, tt.want)
			}
		})
	}
}

// TestClientKey checks the per-client key: apikey first, else the client address,
// IPv6 ones grouped by their /64 (the default) or the prefix set, IPv4 ones by /32 (the
// default) or the prefix set, IPv4-mapped IPv6 ones as IPv4, from the peer or from a
// trusted proxy's X-Forwarded-For or X-Real-IP alike.
func TestClientKey(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		peer, apikey, xff, realIP string
		ipv4, ipv6                int // 0: the defaults, 32 and 64
		want                      string
	}{
		{peer: "1.2.3.4:5", apikey: "secret", want: "apikey:secret"},
		{peer: "10.0.0.1:5", apikey: "secret", xff: "9.9.9.9", want: "apikey:secret"},
		{peer: "[2001:db8:1:2::1]:5", apikey: "secret", want: "apikey:secret"},
		{peer: "1.2.3.4:5", want: "addr:1.2.3.4"},
		{peer: "1.2.3.4:6", xff: "9.9.9.9", want: "addr:1.2.3.4"},
		{peer: "10.0.0.1:5", xff: "9.9.9.9", want: "addr:9.9.9.9"},
		{peer: "[2001:db8:1:2::1]:5", want: "addr:2001:db8:1:2::/64"},
		{peer: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:5", want: "addr:2001:db8:1:2::/64"},
		{peer: "[2001:db8:1:3::1]:5", want: "addr:2001:db8:1:3::/64"},
		{peer: "[2001:db8:1:2::1]:5", ipv6: 128, want: "addr:2001:db8:1:2::1"},
		{peer: "[2001:db8:1:2::1]:5", ipv6: 48, want: "addr:2001:db8:1::/48"},
		{peer: "[2001:db8:1:2::1]:5", ipv6: 1, want: "addr:::/1"},
		{peer: "[fe80::1%eth0]:5", ipv6: 128, want: "addr:fe80::1%eth0"},
		{peer: "[fe80::1%eth0]:5", want: "addr:fe80::/64"},
		{peer: "[::ffff:192.0.2.7]:5", want: "addr:192.0.2.7"},
		{peer: "[::ffff:192.0.2.7]:5", ipv4: 24, want: "addr:192.0.2.0/24"},
		{peer: "192.0.2.7:5", ipv4: 24, want: "addr:192.0.2.0/24"},
		{peer: "192.0.2.7:5", ipv4: 1, want: "addr:128.0.0.0/1"},
		{peer: "[fd00::1]:5", xff: "2001:db8:1:2::8", want: "addr:2001:db8:1:2::/64"},
		{peer: "[fd00::1]:5", xff: "2001:db8:1:2::8, fd00::2", want: "addr:2001:db8:1:2::/64"},
		{peer: "10.0.0.1:5", xff: "[2001:db8:1:2::7]:443", want: "addr:2001:db8:1:2::/64"},
		{peer: "10.0.0.1:5", xff: "::ffff:203.0.113.9", want: "addr:203.0.113.9"},
		{peer: "10.0.0.1:5", realIP: "2001:db8:1:2::5", want: "addr:2001:db8:1:2::/64"},
		{peer: "10.0.0.1:5", xff: "203.0.113.9", ipv4: 16, want: "addr:203.0.0.0/16"},
		{peer: "[2001:db8:9:9::1]:5", xff: "2001:db8:1:2::8", want: "addr:2001:db8:9:9::/64"}, // untrusted peer
	}
	for _, tt := range tests {
		r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
		if tt.apikey != "" {
			r.Header.Set("apikey", tt.apikey)
		}
		if tt.xff != "" {
			r.Header.Set("X-Forwarded-For", tt.xff)
		}
		if tt.realIP != "" {
			r.Header.Set("X-Real-IP", tt.realIP)
		}
		k := clientKeys{trusted: trusted, ipv4: cmp.Or(tt.ipv4, 32), ipv6: cmp.Or(tt.ipv6, 64)}
		if got := k.key(r); got != tt.want {
			t.Errorf("key(peer %s, apikey %q, XFF %q, X-Real-IP %q; /%d, /%d) = %q, want %q",
				tt.peer, tt.apikey, tt.xff, tt.realIP, k.ipv4, k.ipv6, got, tt.want)
		}
	}
}

// TestNewClientPrefixes checks the range New takes of the client prefixes.
func TestNewClientPrefixes(t *testing.T) {
	for _, tc := range []struct {
		ipv4, ipv6 int
		ok         bool
	}{
		{0, 0, true}, {32, 128, true}, {1, 1, true}, {24, 48, true},
		{33, 0, false}, {0, 129, false}, {-1, 0, false}, {0, -64, false},
	} {
		u, _ := url.Parse("http://127.0.0.1:1")
		_, err := New(Options{Upstream: u, Metrics: metrics.New(prometheus.NewRegistry()),
			ClientIPv4Prefix: tc.ipv4, ClientIPv6Prefix: tc.ipv6})
		if (err == nil) != tc.ok {
			t.Errorf("New(ClientIPv4Prefix %d, ClientIPv6Prefix %d) error = %v, want error %v", tc.ipv4, tc.ipv6, err, !tc.ok)
		}
	}
}
