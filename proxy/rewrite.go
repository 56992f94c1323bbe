package proxy

import (
	"net/http/httputil"
	"net/netip"
	"strings"
)

// rewrite returns the route's Rewrite (not Director: golang/go#53002): Core's URL with the
// client's path spelling, the forwarding fields, no upgrade, no field that overrides path or
// method, and for answers the bridge reads, askWholeAnswer and the callback URL.
func (rt *route) rewrite(opts Options) func(*httputil.ProxyRequest) {
	upstream, trusted := opts.Upstream, opts.TrustedProxies
	return func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream) // keeps the client's path spelling and encoding
		setForwarded(pr, trusted)
		// No protocol upgrade in Core's API: a tunnel would bypass the limit (a 101 then fails).
		if pr.Out.Header["Upgrade"] != nil {
			delete(pr.Out.Header, "Upgrade")
			delete(pr.Out.Header, "Connection")
		}
		// An HTTP/1.0 client cannot take 100 Continue (RFC 9110, section 15.2).
		if !pr.In.ProtoAtLeast(1, 1) {
			delete(pr.Out.Header, "Expect")
		}
		for _, k := range overrideFields {
			delete(pr.Out.Header, k)
		}
		b := rt.bridged
		if b == nil || !b.readsAnswer {
			return
		}
		if ex := exchangeOf(pr.In); !b.poll || (ex != nil && ex.shared) {
			askWholeAnswer(pr.Out.Header)
			if rt.submit && ex != nil {
				ex.sub = rt.bridgeSubmission(pr.Out, pr.In)
			}
		}
	}
}

// overrideFields replace a request's path (IIS's URL Rewrite) or method on some servers.
var overrideFields = [...]string{"X-Original-Url", "X-Rewrite-Url", "X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// forwardedFields are the forwarding fields beside X-Forwarded-For, -Host and -Proto
// (Traefik's forwardedheaders list, with X-Forwarded-Prefix, -Ssl and Forwarded, RFC 7239):
// passed as sent from a trusted peer, dropped from any other.
var forwardedFields = [...]string{
	"Forwarded",
	"X-Forwarded-Port",
	"X-Forwarded-Prefix",
	"X-Forwarded-Server",
	"X-Forwarded-Uri",
	"X-Forwarded-Method",
	"X-Forwarded-Ssl",
	"X-Forwarded-Tls-Client-Cert",
	"X-Forwarded-Tls-Client-Cert-Info",
	"X-Real-Ip",
}

// setForwarded sets the forwarding fields of the request to Core: from a trusted peer its
// X-Forwarded-For extended, its -Proto, -Host and forwardedFields kept; from any other the
// peer alone, mdproxy's own scheme and the Host sent (none without one), none of its
// forwardedFields.
func setForwarded(pr *httputil.ProxyRequest, trusted []netip.Prefix) {
	in, out := pr.In.Header, pr.Out.Header
	fromTrusted := isTrusted(parseAddr(pr.In.RemoteAddr), trusted)
	// kept is the trusted peer's field k, unless named in Connection (RFC 9110, 7.6.1).
	kept := func(k string) []string {
		for _, v := range in["Connection"] {
			for _, name := range strings.Split(v, ",") {
				if strings.EqualFold(strings.TrimSpace(name), k) {
					return nil
				}
			}
		}
		return in[k]
	}
	if fromTrusted {
		out["X-Forwarded-For"] = kept("X-Forwarded-For") // extended by SetXForwarded
	}
	pr.SetXForwarded()
	if pr.In.Host == "" {
		delete(out, "X-Forwarded-Host") // SetXForwarded would send it empty
	}
	if !fromTrusted {
		for _, k := range forwardedFields {
			delete(out, k)
		}
		return
	}
	for _, k := range [...]string{"X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded"} {
		if v := kept(k); len(v) > 0 {
			out[k] = v
		}
	}
}
