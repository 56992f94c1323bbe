package proxy

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientKeys makes the keys of per-client shares (see key), from the trusted proxies
// and the prefix lengths by which client addresses are grouped.
type clientKeys struct {
	trusted []netip.Prefix
	// ipv4 and ipv6 are the prefix lengths, in bits, of the groups of IPv4 addresses
	// (1 to 32) and IPv6 ones (1 to 128): Options.ClientIPv4Prefix and
	// ClientIPv6Prefix with their defaults applied.
	ipv4, ipv6 int
}

// key returns the key of r's per-client share: "apikey:" and the apikey header when r
// has one (Core's session and API keys), else "addr:" and the group of clientAddr's
// address (see group). The key is handed to the limiter only; it is never logged nor
// a metric label.
func (k clientKeys) key(r *http.Request) string {
	if a := apikeyOf(r); a != "" {
		return "apikey:" + a
	}
	return "addr:" + k.group(clientAddr(r, k.trusted))
}

// group returns the group of the client address a: the address itself when its prefix
// length is the address's full length ("192.0.2.7", "2001:db8::1"; a peer's zone
// kept, "fe80::1%eth0"), else its prefix ("2001:db8:1:2::/64", "192.0.2.0/24"). A host given an IPv6 /64
// takes any address in it at will (RFC 8981's temporary addresses; RFC 4291, section
// 2.5.1: interface identifiers are 64 bits), so that one client counts as one only
// grouped so. An IPv4-mapped IPv6 address was made IPv4 by parseAddr already. The zero
// Addr gives "invalid IP", as its String.
func (k clientKeys) group(a netip.Addr) string {
	bits := k.ipv6
	if a.Is4() {
		bits = k.ipv4
	}
	if !a.IsValid() || bits >= a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits) // bits is within 0 and a's length: no error
	return p.String()
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
