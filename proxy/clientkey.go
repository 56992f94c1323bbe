package proxy

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientKey returns the key of r's per-client share: "apikey:" and the apikey header
// when r has one (Core's session and API keys), else "addr:" and clientAddr. The key is
// handed to the limiter only; it is never logged nor a metric label.
func clientKey(r *http.Request, trusted []netip.Prefix) string {
	if k := apikeyOf(r); k != "" {
		return "apikey:" + k
	}
	return "addr:" + clientAddr(r, trusted).String()
}

// clientAddr returns the address of r's client: the TCP peer, unless the peer is in
// trusted; then the rightmost X-Forwarded-For entry that is not in trusted (entries
// right of it were added by trusted proxies, entries left of it could be forged). If
// every entry is trusted, the leftmost is the client; if an entry does not parse (or
// carries an IPv6 zone), the last trusted address before it is. X-Real-IP is read only when a trusted peer sent no
// X-Forwarded-For. A header sent by an untrusted peer never changes the answer.
//
// It returns the zero netip.Addr when r.RemoteAddr does not parse (never for requests
// from net/http's server).
func clientAddr(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := parseAddr(r.RemoteAddr)
	if !isTrusted(peer, trusted) {
		return peer
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	if len(hops) == 0 {
		if a := parseHeaderAddr(r.Header.Get("X-Real-IP")); a.IsValid() {
			return a
		}
		return peer
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHeaderAddr(hops[i])
		if !a.IsValid() {
			return client
		}
		client = a
		if !isTrusted(a, trusted) {
			return a
		}
	}
	return client
}

// parseHeaderAddr is parseAddr for an address a client or proxy wrote in a header. An
// IPv6 zone ("fe80::1%eth0") names an interface of the host that wrote it, meaningless
// here, and may hold any text: such an entry is read as one that does not parse, so
// that no header text but an address ever reaches a client key.
func parseHeaderAddr(s string) netip.Addr {
	a := parseAddr(s)
	if a.Zone() != "" {
		return netip.Addr{}
	}
	return a
}

// parseAddr reads "ip", "ip:port" or "[ipv6]:port", unmapping IPv4-in-IPv6.
func parseAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// apikeyOf returns r's apikey header, Core's API key or session id, "" when absent. It
// reads the header by its canonical name: Header.Get would canonicalize "apikey" anew,
// and allocate, on every request.
func apikeyOf(r *http.Request) string {
	if v := r.Header["Apikey"]; len(v) > 0 {
		return v[0]
	}
	return ""
}
