package proxy

import (
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"testing"
)

// fuzzMethods are the methods FuzzCanonicalPath sends, picked by a byte of its input.
var fuzzMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
	http.MethodPatch, http.MethodOptions, "PROPFIND",
}

// FuzzCanonicalPath feeds request targets, read as net/http's server reads them, to
// canonicalPath and to the proxy's handler. It checks that ok is false exactly for an
// encoded slash or backslash in the raw path, or a backslash, NUL, "." or ".." segment
// in the decoded one; that a canonical path is absolute, clean, lower case and its own
// canonical path; that respellings Core resolves alike (case, extra slashes, a trailing
// slash) share the canonical path; and that the route the handler counts a target under is
// the route of its canonical path, while a refused target is answered 400 under
// "other" without reaching Core.
func FuzzCanonicalPath(f *testing.F) {
	seeds := []string{"/", "*", "/file", "/file/x", "/file/abc123/cancel", "/file/converted/x",
		"/file/webhook/x", "/file/rules", "/file/batch", "/file/batch/b1", "/file/batch/b1/close",
		"/file/batch/b1/certificate", "/hash/ABCDEF", "/login", "/logout", "/version",
		"/stat/nodes", "/stat/engines", "/readyz", "/admin", "/admin/sub/x",
		"/file/x?verbose=1&a=%2F", "http://core:8008/file/x", "/file/x#frag",
		"/file/%E2%82%AC", "/file/a%20b", "/hash/ABCDEF%30", "/file/%252F",
		"/file/%2e%2e/hash/x", "/%2E%2E/%2e%2e/admin", "/file/.%2e/version", "/file/x/..",
		"/file/%00", "/file/x%2Fy", "/file/x%2fy", "/file/x%5Cy", "/file/x%5cy", `/file\x`,
		"/%2Ffile/x", "/admin%2F..%2Ffile/x", "/file/\u212a", "/file/webhoo\u212a/x",
		"/FILE/BATCH/B/CLOSE", "/%C3%A9/../file/x", "/file/%ff", "/ADMIN/", "/admin/..",
		"///file///x///", "/file/x/./", "/./././file/x",
		"a:file/abc", "a:../file/abc", "A:%2ffile/abc", "a:file;/abc", "http:/file/abc", "a:/file/abc",
	}
	seeds = append(seeds, pathVariants...)
	for i, s := range seeds {
		f.Add(s, uint8(i))
	}

	h := newRouteProbe(f)
	f.Fuzz(func(t *testing.T, target string, m uint8) {
		method := fuzzMethods[int(m)%len(fuzzMethods)]
		r := readTarget(method, target)
		if r == nil {
			t.Skip("net/http's server refuses this request line")
		}
		got, ok := canonicalPath(r.URL)

		raw := rawPath(target, r.URL)
		wantOK := !strings.Contains(strings.ToLower(raw), "%2f") &&
			!strings.Contains(strings.ToLower(raw), "%5c") &&
			!strings.ContainsAny(r.URL.Path, "\\\x00;") &&
			!hasDotSegment(r.URL.Path) && r.URL.Path != "*" &&
			r.URL.Opaque == "" && (r.URL.Scheme == "" || r.URL.Host != "")
		if ok != wantOK {
			t.Fatalf("canonicalPath(%q) = %q, %v, want ok %v (raw path %q, decoded %q)", target, got, ok, wantOK, raw, r.URL.Path)
		}

		route, code, forwarded := h.serve(t, r)
		if !ok {
			if got != "" {
				t.Errorf("canonicalPath(%q) = %q, false, want \"\" with false", target, got)
			}
			if route != RouteOther || code != http.StatusBadRequest || forwarded {
				t.Errorf("%s %s: route %q, status %d, forwarded %v, want %q, 400, not forwarded", method, target, route, code, forwarded, RouteOther)
			}
			return
		}

		checkCanonical(t, target, got)
		// The one-pass fast path gives what cleaning and lower-casing every path gives.
		if want := strings.ToLower(path.Clean("/" + r.URL.Path)); got != want {
			t.Errorf("canonicalPath(%q) = %q, want %q (path.Clean, lower case)", target, got, want)
		}
		if again, ok := canonicalPath(&url.URL{Path: got}); again != got || !ok {
			t.Errorf("canonicalPath(%q) = %q, %v, want %q, true (fixed point; from target %q)", got, again, ok, got, target)
		}

		// The canonical path, sent as a target of its own, is routed as the target was.
		canon := (&url.URL{Path: got}).EscapedPath()
		cr := readTarget(method, canon)
		if cr == nil {
			t.Fatalf("canonical target %q of %q does not parse", canon, target)
		}
		if cp, ok := canonicalPath(cr.URL); cp != got || !ok {
			t.Errorf("canonicalPath(%q) = %q, %v, want %q, true (canonical target of %q)", canon, cp, ok, got, target)
		}
		if croute, _, _ := h.serve(t, cr); croute != route {
			t.Errorf("%s %s: route %q, want %q, the route of its canonical target %s", method, target, route, croute, canon)
		}

		// Spellings of the same path that Core resolves alike: same canonical path.
		if !strings.HasPrefix(target, "/") {
			return
		}
		p, q, hasQuery := strings.Cut(target, "?")
		if hasQuery {
			q = "?" + q
		}
		for _, v := range []string{"/" + p + q, p + "/" + q, "/" + p + "/" + q, upperASCII(p) + q} {
			vr := readTarget(method, v)
			if vr == nil {
				continue
			}
			if vp, vok := canonicalPath(vr.URL); vp != got || !vok {
				t.Errorf("canonicalPath(%q) = %q, %v, want %q, true as for %q", v, vp, vok, got, target)
			}
		}
		if v := upperASCII(p) + q; v != target {
			if vr := readTarget(method, v); vr != nil {
				if vroute, _, _ := h.serve(t, vr); vroute != route {
					t.Errorf("%s %s: route %q, want %q as for %s", method, v, vroute, route, target)
				}
			}
		}
	})
}

// hasDotSegment reports whether the decoded path p has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// checkCanonical fails t unless c, the canonical path of target, starts with "/", has
// no empty, "." or ".." segment, no trailing slash (but for "/"), and is lower case.
func checkCanonical(t *testing.T, target, c string) {
	t.Helper()
	if !strings.HasPrefix(c, "/") {
		t.Errorf("canonicalPath(%q) = %q, want a leading /", target, c)
	}
	if c != "/" && strings.HasSuffix(c, "/") {
		t.Errorf("canonicalPath(%q) = %q, want no trailing /", target, c)
	}
	if strings.Contains(c, "//") {
		t.Errorf("canonicalPath(%q) = %q, want no //", target, c)
	}
	for _, seg := range strings.Split(c, "/") {
		if seg == "." || seg == ".." {
			t.Errorf("canonicalPath(%q) = %q, want no %q segment", target, c, seg)
		}
	}
	if l := strings.ToLower(c); l != c {
		t.Errorf("canonicalPath(%q) = %q, want lower case %q", target, c, l)
	}
}

// rawPath returns the path of target as the client wrote it, before decoding: for an
// origin-form target ("/a%2Fb?q") its part before "?"; otherwise the escaped path that
// url.ParseRequestURI kept (RawPath, set when the spelling is not the default one).
func rawPath(target string, u *url.URL) string {
	if strings.HasPrefix(target, "/") {
		p, _, _ := strings.Cut(target, "?")
		return p
	}
	if u.RawPath != "" {
		return u.RawPath
	}
	return u.EscapedPath()
}

// upperASCII returns s with its ASCII letters in upper case, other bytes untouched.
func upperASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// fuzzTrusted are the trusted proxy sets FuzzClientAddr picks from by a byte of its
// input.
var fuzzTrusted = [][]netip.Prefix{
	nil,
	{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
	{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
}

// FuzzClientAddr feeds peer addresses, X-Forwarded-For and X-Real-IP values to
// clientAddr and clientKey. It checks that an untrusted peer's headers never change the
// answer; that a trusted peer's answer is the peer or an address of its headers, never
// one left of an entry that is not a trusted address (entries a client could forge),
// and X-Real-IP's only without X-Forwarded-For; and that the key is the apikey or
// "addr:" and an address, with no text of a header that is not an address.
func FuzzClientAddr(f *testing.F) {
	seeds := []struct {
		remote, xff, realIP, apikey string
		flags, trusted              uint8
	}{
		{"203.0.113.7:5555", "", "", "", 0, 0},
		{"203.0.113.7:5555", "1.2.3.4", "5.6.7.8", "", 3, 0},
		{"127.0.0.1:5555", "1.2.3.4", "", "", 1, 1},
		{"127.0.0.1:5555", "1.2.3.4, 127.0.0.2", "", "", 1, 1},
		{"127.0.0.1:5555", "9.9.9.9, 1.2.3.4, 127.0.0.2", "", "", 1, 1},
		{"127.0.0.1:5555", "", "1.2.3.4", "", 2, 1},
		{"127.0.0.1:5555", "", "1.2.3.4", "", 3, 1},
		{"127.0.0.1:5555", "garbage, 1.2.3.4", "", "", 1, 1},
		{"127.0.0.1:5555", "1.2.3.4, garbage", "", "", 1, 1},
		{"127.0.0.1:5555", "127.0.0.3\n127.0.0.2", "", "", 1, 1},
		{"[::1]:5555", "[2001:db8::1]:80, ::ffff:10.1.2.3", "", "", 1, 2},
		{"10.0.0.1:1", "10.0.0.2,10.0.0.3", "", "", 1, 2},
		{"10.0.0.1:1", "  1.2.3.4:99 ,", "", "", 1, 2},
		{"[::ffff:127.0.0.1]:80", "1.2.3.4", "", "", 1, 1},
		{"1.2.3.4:5", "5.6.7.8", "9.9.9.9", "", 3, 3},
		{"127.0.0.1:5555", "1.2.3.4", "", "key123", 1, 1},
		{"not an address", "1.2.3.4", "", "", 1, 3},
		{"[fe80::1%eth0]:80", "1.2.3.4", "", "", 1, 3},
		{"127.0.0.1:5555", "", "", "", 1, 1},
		{"127.0.0.1:5555", "a=b\x1b[31m", "", "", 1, 3},
	}
	for _, s := range seeds {
		f.Add(s.remote, s.xff, s.realIP, s.apikey, s.flags, s.trusted)
	}
	f.Fuzz(func(t *testing.T, remote, xff, realIP, apikey string, flags, trustedIdx uint8) {
		trusted := fuzzTrusted[int(trustedIdx)%len(fuzzTrusted)]
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		if flags&1 != 0 {
			r.Header["X-Forwarded-For"] = strings.Split(xff, "\n") // several header lines
		}
		if flags&2 != 0 {
			r.Header["X-Real-Ip"] = []string{realIP}
		}
		got := clientAddr(r, trusted)

		peer := parseHop(remote)
		if bare := clientAddr(&http.Request{RemoteAddr: remote, Header: http.Header{}}, trusted); bare != peer {
			t.Fatalf("clientAddr(RemoteAddr %q, no headers) = %v, want the peer %v", remote, bare, peer)
		}
		if got.IsValid() != peer.IsValid() {
			t.Errorf("clientAddr(%q, XFF %q, X-Real-IP %q) = %v, want a valid address exactly when the peer %v is one", remote, r.Header["X-Forwarded-For"], realIP, got, peer)
		}
		peerTrusted := peer.IsValid() && containedIn(peer, trusted)
		if !peerTrusted && got != peer {
			t.Errorf("clientAddr(%q, XFF %q, X-Real-IP %q) = %v from an untrusted peer, want the peer %v", remote, r.Header["X-Forwarded-For"], realIP, got, peer)
		}
		if peerTrusted && got != peer {
			var hops []string
			for _, v := range r.Header.Values("X-Forwarded-For") {
				hops = append(hops, strings.Split(v, ",")...)
			}
			switch {
			case len(hops) == 0:
				if got != parseHop(r.Header.Get("X-Real-IP")) {
					t.Errorf("clientAddr(%q, X-Real-IP %q) = %v, want the peer or X-Real-IP's address", remote, realIP, got)
				}
			case !forgeryFree(got, hops, trusted):
				t.Errorf("clientAddr(%q, XFF %q) = %v, want the peer or an entry with only trusted addresses right of it (trusted %v)", remote, hops, got, trusted)
			}
		}

		keys := clientKeys{trusted: trusted, ipv4: 32, ipv6: 128} // every address its own key
		key := keys.key(r)
		if apikey != "" {
			withKey := &http.Request{RemoteAddr: remote, Header: r.Header.Clone()}
			withKey.Header.Set("apikey", apikey)
			if k, want := keys.key(withKey), "apikey:"+withKey.Header.Get("apikey"); k != want {
				t.Errorf("clientKey(apikey %q) = %q, want %q", apikey, k, want)
			}
		}
		if want := "addr:" + got.String(); key != want {
			t.Fatalf("clientKey(%q, XFF %q, X-Real-IP %q) = %q, want %q", remote, r.Header["X-Forwarded-For"], realIP, key, want)
		}
		if got != peer {
			// From a header: an address and nothing else, no zone ("fe80::1%text").
			a, err := netip.ParseAddr(strings.TrimPrefix(key, "addr:"))
			if err != nil || a != got || a.Zone() != "" {
				t.Errorf("clientKey(%q, XFF %q, X-Real-IP %q) = %q, want \"addr:\" and an address without zone", remote, r.Header["X-Forwarded-For"], realIP, key)
			}
		}
	})
}

// parseHop is the address of a peer or header entry: "ip", "ip:port" or "[ipv6]:port"
// after trimming spaces, IPv4-in-IPv6 unmapped; the zero Addr when s is none.
func parseHop(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap()
	}
	return netip.Addr{}
}

func containedIn(a netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forgeryFree reports whether a is the address of an entry of hops with only trusted
// addresses right of it: the entries a trusted proxy wrote, which the client cannot
// forge.
func forgeryFree(a netip.Addr, hops []string, trusted []netip.Prefix) bool {
	for i := len(hops) - 1; i >= 0; i-- {
		h := parseHop(hops[i])
		if h == a {
			return true
		}
		if !h.IsValid() || !containedIn(h, trusted) {
			return false
		}
	}
	return false
}
