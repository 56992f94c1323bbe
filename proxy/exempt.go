package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ExemptDigestPrefix starts an apikey entry of a route's exemptions: the key's SHA-256
// digest in hex follows, never the key itself.
const ExemptDigestPrefix = "sha256:"

// Exemptions are the clients a route's limit never refuses (MDPROXY_<ROUTE>_EXEMPT):
// client addresses, after the trusted proxies' forwarded headers are read as for the
// per-client share, and apikeys. The zero value exempts no one. Safe for concurrent
// use (read-only).
type Exemptions struct {
	prefixes []netip.Prefix
	digests  map[[sha256.Size]byte]bool
}

// ParseExempt reads s, a comma-separated list of client address prefixes (CIDR, e.g.
// 10.0.0.0/8 or 2001:db8::/32; a bare address is its own /32 or /128) and apikey digests
// (ExemptDigestPrefix and the 64 hex digits of the apikey's SHA-256). Blanks around
// entries are ignored; "" exempts no one. Its error names the first entry it cannot
// read, without quoting it: an entry that is not a prefix may be a raw apikey.
func ParseExempt(s string) (Exemptions, error) {
	var e Exemptions
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
			continue
		case strings.HasPrefix(strings.ToLower(entry), ExemptDigestPrefix):
			var d [sha256.Size]byte
			hexDigits := entry[len(ExemptDigestPrefix):]
			if len(hexDigits) != hex.EncodedLen(sha256.Size) {
				return Exemptions{}, fmt.Errorf("entry %d: %s is not followed by 64 hex digits", i+1, ExemptDigestPrefix)
			}
			if _, err := hex.Decode(d[:], []byte(hexDigits)); err != nil {
				return Exemptions{}, fmt.Errorf("entry %d: %s is not followed by 64 hex digits", i+1, ExemptDigestPrefix)
			}
			if e.digests == nil {
				e.digests = map[[sha256.Size]byte]bool{}
			}
			e.digests[d] = true
		default:
			p, err := netip.ParsePrefix(entry)
			if err != nil {
				a, aerr := netip.ParseAddr(entry)
				if aerr != nil || a.Zone() != "" {
					return Exemptions{}, fmt.Errorf("entry %d is neither an address prefix nor %s and a digest", i+1, ExemptDigestPrefix)
				}
				p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			}
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
			}
			e.prefixes = append(e.prefixes, p.Masked())
		}
	}
	return e, nil
}

// Empty reports whether e exempts no one.
func (e Exemptions) Empty() bool { return len(e.prefixes) == 0 && len(e.digests) == 0 }

// allows reports whether r comes from an exempt client: its address (clientAddr with
// trusted) in a prefix, or the SHA-256 of its apikey among the digests. A digest is
// looked up in a map: the time a look-up takes tells nothing of a key that SHA-256's
// preimage resistance does not already hide.
func (e Exemptions) allows(r *http.Request, trusted []netip.Prefix) bool {
	if len(e.digests) > 0 {
		if key := apikeyOf(r); key != "" && e.digests[sha256.Sum256([]byte(key))] {
			return true
		}
	}
	if len(e.prefixes) > 0 {
		a := clientAddr(r, trusted)
		for _, p := range e.prefixes {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}
