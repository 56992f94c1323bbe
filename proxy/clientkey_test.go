package proxy

import (
	"net/http"
	"net/netip"
	"testing"
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

// TestClientKey checks the per-client key: apikey first, else the client address.
func TestClientKey(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	tests := []struct {
		peer, apikey, xff, want string
	}{
		{"1.2.3.4:5", "secret", "", "apikey:secret"},
		{"10.0.0.1:5", "secret", "9.9.9.9", "apikey:secret"},
		{"1.2.3.4:5", "", "", "addr:1.2.3.4"},
		{"1.2.3.4:6", "", "9.9.9.9", "addr:1.2.3.4"},
		{"10.0.0.1:5", "", "9.9.9.9", "addr:9.9.9.9"},
		{"[2001:db8::1]:5", "", "", "addr:2001:db8::1"},
	}
	for _, tt := range tests {
		r := &http.Request{RemoteAddr: tt.peer, Header: http.Header{}}
		if tt.apikey != "" {
			r.Header.Set("apikey", tt.apikey)
		}
		if tt.xff != "" {
			r.Header.Set("X-Forwarded-For", tt.xff)
		}
		if got := clientKey(r, trusted); got != tt.want {
			t.Errorf("clientKey(peer %s, apikey %q, XFF %q) = %q, want %q", tt.peer, tt.apikey, tt.xff, got, tt.want)
		}
	}
}
