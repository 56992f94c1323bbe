package proxy

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// routeSpec is one row of the route table: the requests of Core's API that share a
// name, and so a token bucket, a set of environment variables and a metric label.
type routeSpec struct {
	// name is the route's stable snake_case name: the route label of every metric, the
	// ROUTE of MDPROXY_<ROUTE>_RATE and friends (upper-cased), and the route of logs.
	name string
	// method is the HTTP method the route answers. GET routes also take HEAD, which
	// Core answers with the same work minus the body.
	method string
	// patterns are chi patterns, matched against the canonical path (see canonicalPath).
	patterns []string
}

// RouteOther names every request that matches no route of the route table: it is
// forwarded, and limited only if MDPROXY_OTHER_RATE is set. Requests refused for their
// path (400) count under it too.
const RouteOther = "other"

// routeTable is Core's public REST API as mdproxy names it, after the endpoint table of
// docs/core-api.md and OPSWAT's OpenAPI description of Core v4.
var routeTable = []routeSpec{
	{name: "submit", method: http.MethodPost, patterns: []string{"/file"}},
	{name: "file_result", method: http.MethodGet, patterns: []string{"/file/{data_id}"}},
	{name: "cancel", method: http.MethodPost, patterns: []string{"/file/{data_id}/cancel"}},
	{name: "sanitized_download", method: http.MethodGet, patterns: []string{"/file/converted/{data_id}"}},
	{name: "webhook_status", method: http.MethodGet, patterns: []string{"/file/webhook/{data_id}"}},
	{name: "rules", method: http.MethodGet, patterns: []string{"/file/rules"}},
	{name: "batch_open", method: http.MethodPost, patterns: []string{"/file/batch"}},
	{name: "batch_status", method: http.MethodGet, patterns: []string{"/file/batch/{batch_id}"}},
	{name: "batch_close", method: http.MethodPost, patterns: []string{"/file/batch/{batch_id}/close"}},
	{name: "batch_certificate", method: http.MethodGet, patterns: []string{"/file/batch/{batch_id}/certificate"}},
	{name: "hash_lookup", method: http.MethodGet, patterns: []string{"/hash/{hash}"}},
	{name: "login", method: http.MethodPost, patterns: []string{"/login"}},
	{name: "logout", method: http.MethodPost, patterns: []string{"/logout"}},
	{name: "version", method: http.MethodGet, patterns: []string{"/version"}},
	{name: "stat", method: http.MethodGet, patterns: []string{"/stat/nodes", "/stat/engines"}},
	{name: "readyz", method: http.MethodGet, patterns: []string{"/readyz"}},
	{name: "admin", method: "*", patterns: []string{"/admin", "/admin/*"}},
}

// RouteNames returns the name of every route of the route table, then RouteOther: the
// complete, fixed set of route label values, in a new slice on each call.
func RouteNames() []string {
	names := make([]string, 0, len(routeTable)+1)
	for _, r := range routeTable {
		names = append(names, r.name)
	}
	return append(names, RouteOther)
}

// canonicalPath returns the path a request is routed by, so that no spelling of a path
// escapes the bucket of the route it reaches at Core: the decoded path with empty
// segments dropped, no trailing slash, in lower case (Core on Windows matches paths
// without regard to case). ok is false for a path whose meaning depends on the server
// that decodes it: an encoded slash or backslash (%2F, %5C), a backslash, a NUL, a
// semicolon (path parameters, which some servers strip: "/file;/x" read as "/file/x"),
// or a "." or ".." segment, as written or percent-encoded (%2E); the asterisk-form "*";
// and a target that is no path: an opaque one ("a:file/x") or a scheme without an
// authority ("http:/file/x"). The proxy refuses those with
// 400 rather than guess which route Core would see: a server that resolves dot segments
// (RFC 3986, section 5.2.4) routes "/file/x/.." as "/file", one that does not (the
// emulator's router) as a poll of the data_id "..". Clients resolve dot segments before
// they send a request, so none of Core's clients sends one.
//
// The canonical path is used for routing only; the path forwarded to Core keeps the
// client's spelling and encoding, which differs from the canonical path only in case,
// empty segments and a trailing slash: each of those can only send a request to a
// route at least as limited as the one Core gives it.
func canonicalPath(u *url.URL) (p string, ok bool) {
	if u.Opaque != "" || (u.Scheme != "" && u.Host == "") {
		// No origin-form path ("a:file/x", "http:/x"): RFC 9112, section 3.2, wants
		// "/" first, or an authority in the absolute form. Such a target would reach
		// Core as written ("GET file/x"), routed by no path at all.
		return "", false
	}
	if u.RawPath != "" && containsFold(u.RawPath, "%2f", "%5c") {
		return "", false
	}
	p = u.Path
	if p == "*" {
		// The asterisk-form target is OPTIONS's alone (RFC 9112, section 3.2.4), and
		// net/http answers OPTIONS * itself: another method's is refused, not sent to
		// Core as a path it did not give ("/%2A").
		return "", false
	}
	// One pass over the path tells whether it is refused, or must be cleaned or
	// lower-cased; a client's path nearly always is neither, and is returned as it is.
	clean, lower := len(p) > 0 && p[0] == '/', true
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\' || c == 0 || c == ';':
			return "", false
		case c == '/' && i > 0 && p[i-1] == '/':
			clean = false // "//"
		case c == '.' && (i == 0 || p[i-1] == '/') && isDotSegment(p[i:]):
			return "", false
		case 'A' <= c && c <= 'Z', c >= 0x80:
			lower = false
		}
	}
	if len(p) > 1 && p[len(p)-1] == '/' {
		clean = false
	}
	if !clean {
		if !strings.HasPrefix(p, "/") {
			p = "/" + p
		}
		p = path.Clean(p)
	}
	if !lower {
		p = strings.ToLower(p)
	}
	return p, true
}

// isDotSegment reports whether s, the rest of a path from the start of a segment,
// starts with a "." or ".." segment.
func isDotSegment(s string) bool {
	seg, _, _ := strings.Cut(s, "/")
	return seg == "." || seg == ".."
}

// containsFold reports whether s contains any of the lower-case escapes, in either
// case, without allocating (canonicalPath runs on every request).
func containsFold(s string, escapes ...string) bool {
	for i := 0; i+3 <= len(s); i++ {
		if s[i] != '%' {
			continue
		}
		for _, e := range escapes {
			if strings.EqualFold(s[i:i+3], e) {
				return true
			}
		}
	}
	return false
}
