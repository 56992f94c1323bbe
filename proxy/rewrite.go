package proxy

import (
	"net/http/httputil"
	"net/netip"
	"strings"
)

// rewrite returns the route's Rewrite of the requests it forwards to Core (Rewrite, not
// Director: hop-by-hop headers named in Connection are removed after the rewrite, not
// before it, golang/go#53002): Core's URL with the client's path spelling and
// encoding, the forwarding fields (setForwarded), no protocol upgrade, no Expect from
// an HTTP/1.0 client, no field that overrides the path or method, and for the answers
// the bridge reads, a question for Core's whole answer (askWholeAnswer) and a
// submission's callback URL (bridgeSubmission).
func (rt *route) rewrite(opts Options) func(*httputil.ProxyRequest) {
	upstream, trusted := opts.Upstream, opts.TrustedProxies
	return func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream) // keeps the client's path spelling and encoding
		// A trusted load balancer's view of the client is kept; an untrusted peer's
		// claims are dropped, so Core sees no forged address or scheme.
		setForwarded(pr, trusted)
		// Core's API has no protocol upgrade: a tunnel would carry requests past the
		// limiter and the metrics. The request goes on as a plain one, and a 101 from
		// Core fails as a protocol the client did not ask for (502).
		if pr.Out.Header["Upgrade"] != nil {
			delete(pr.Out.Header, "Upgrade")
			delete(pr.Out.Header, "Connection")
		}
		// An HTTP/1.0 client cannot take 100 Continue (RFC 9110, section 15.2): Core
		// must not wait to send one before reading the body.
		if !pr.In.ProtoAtLeast(1, 1) {
			delete(pr.Out.Header, "Expect")
		}
		// The route and the limit were decided on the request line: header fields
		// with which some servers take another path or method do not reach Core.
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

// overrideFields are the request header fields (canonical keys) with which some servers
// and frameworks replace a request's path (IIS's URL Rewrite) or method (method
// override), which mdproxy does not forward.
var overrideFields = [...]string{"X-Original-Url", "X-Rewrite-Url", "X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// forwardedFields are the request header fields (canonical keys), other than
// X-Forwarded-For, -Host and -Proto, in which a proxy tells the server behind it what
// it saw of the client: its address (X-Real-IP), the port, path prefix, URI and method
// it asked for, the proxy's name, its TLS and client certificate, and the standard
// Forwarded field (RFC 7239) that says all of it at once. The list is Traefik's
// (its forwardedheaders middleware) with X-Forwarded-Prefix, X-Forwarded-Ssl and
// Forwarded. A trusted peer's are passed to Core as sent; an untrusted peer's are not
// passed at all, since it could claim anything in them.
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

// setForwarded sets the forwarding fields of pr.Out, the request to Core, from
// pr.In, the client's: when the peer is in trusted (a load balancer in front), its
// X-Forwarded-For chain is kept and extended with the peer, its X-Forwarded-Proto and
// X-Forwarded-Host are kept as sent (those it did not send are set from mdproxy's own
// view, as for an untrusted peer), and its forwardedFields are kept as sent. When the
// peer is not trusted, X-Forwarded-For is the peer alone, X-Forwarded-Proto the
// scheme the client used with mdproxy (http, or https with MDPROXY_TLS_CERT_FILE),
// X-Forwarded-Host the Host it sent (none without a Host, as an HTTP/1.0 request may
// come), and none of its forwardedFields reach Core. httputil.ReverseProxy has removed
// Forwarded, X-Forwarded-For, -Host and -Proto from pr.Out before Rewrite.
func setForwarded(pr *httputil.ProxyRequest, trusted []netip.Prefix) {
	in, out := pr.In.Header, pr.Out.Header
	fromTrusted := isTrusted(parseAddr(pr.In.RemoteAddr), trusted)
	// kept returns the trusted peer's field k, unless it named k in Connection: then
	// it was meant for mdproxy alone (RFC 9110, section 7.6.1).
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
