package proxy

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// routeSpec is a row of the route table: requests sharing a name, so a bucket, settings
// and a metric label.
type routeSpec struct {
	// name is the route label, the ROUTE of MDPROXY_<ROUTE>_RATE and the logs' route.
	name string
	// method: GET routes take HEAD too.
	method string
	// patterns are chi patterns matched against the canonical path.
	patterns []string
}

// RouteOther names every request no route matches (forwarded, limited only by
// MDPROXY_OTHER_RATE), refusals included.
const RouteOther = "other"

// routeTable is Core's REST API as named by mdproxy (docs/core-api.md).
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

// RouteNames returns every route label value, RouteOther last, in a new slice.
func RouteNames() []string {
	names := make([]string, 0, len(routeTable)+1)
	for _, r := range routeTable {
		names = append(names, r.name)
	}
	return append(names, RouteOther)
}

// canonicalPath returns the path a request is routed by, so that no spelling escapes its
// route's bucket at Core: decoded, no empty segment or trailing slash, lower case (Core on
// Windows ignores case). ok is false for a path whose meaning depends on the server's
// decoding: %2F, %5C, a backslash, NUL, a semicolon, a dot segment (RFC 3986, section
// 5.2.4), "*", an opaque target or a scheme without authority. Core receives the client's
// spelling, which differs only in what routes to an equally limited route.
func canonicalPath(u *url.URL) (p string, ok bool) {
	if u.Opaque != "" || (u.Scheme != "" && u.Host == "") {
		// No origin-form path (RFC 9112, section 3.2).
		return "", false
	}
	if u.RawPath != "" && containsFold(u.RawPath, "%2f", "%5c") {
		return "", false
	}
	p = u.Path
	if p == "*" {
		// The asterisk form is OPTIONS's (RFC 9112, section 3.2.4), answered by net/http.
		return "", false
	}
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

func isDotSegment(s string) bool {
	seg, _, _ := strings.Cut(s, "/")
	return seg == "." || seg == ".."
}

// containsFold reports whether s holds any of the escapes, in any case, without allocating.
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
