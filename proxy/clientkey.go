package proxy

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientKeys makes the keys of per-client shares.
type clientKeys struct {
	trusted []netip.Prefix
	// ipv4 and ipv6 are the group prefix lengths in bits, defaults applied.
	ipv4, ipv6 int
}

// key returns r's per-client key: "apikey:" and its apikey, else "addr:" and its client
// address's group. Given to the limiter only, never logged nor a label.
func (k clientKeys) key(r *http.Request) string {
	if a := apikeyOf(r); a != "" {
		return "apikey:" + a
	}
	return "addr:" + k.group(clientAddr(r, k.trusted))
}

// group returns a's prefix of the configured length, or a itself at full length. A host
// given an IPv6 /64 takes any address in it (RFC 8981; RFC 4291, section 2.5.1).
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

// clientAddr returns r's client: the TCP peer unless trusted; then the rightmost
// X-Forwarded-For entry not trusted (left of it could be forged), the leftmost when all
// are, the last trusted one before an entry that does not parse; X-Real-IP only without
// X-Forwarded-For. The zero Addr when RemoteAddr does not parse.
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

// parseHeaderAddr is parseAddr for a header, refusing an IPv6 zone (any text).
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

// apikeyOf returns r's apikey header (Core's API key or session), read without
// canonicalizing.
func apikeyOf(r *http.Request) string {
	if v := r.Header["Apikey"]; len(v) > 0 {
		return v[0]
	}
	return ""
}
