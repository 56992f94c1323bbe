package proxy

import (
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Route is one row of the route table: the requests of Core's API that share a name,
// and so a token bucket, a set of environment variables and a metric label.
type Route struct {
	// Name is the route's stable snake_case name: the route label of every metric, the
	// ROUTE of MDPROXY_<ROUTE>_RATE and friends (upper-cased), and the route of logs.
	Name string
	// Method is the HTTP method the route answers. GET routes also take HEAD, which
	// Core answers with the same work minus the body.
	Method string
	// Patterns are chi patterns, matched against the canonical path (see CanonicalPath).
	Patterns []string
	// Polled marks the routes that clients call in a loop; they get a limit by default.
	Polled bool
}

// RouteOther names every request that matches no route of Routes: it is forwarded, and
// limited only if MDPROXY_OTHER_RATE is set. Requests refused for their path (400) count
// under it too.
const RouteOther = "other"

// Routes is Core's public REST API as mdproxy names it, after the endpoint table of
// docs/core-api.md and OPSWAT's OpenAPI description of Core v4.
var Routes = []Route{
	{Name: "submit", Method: http.MethodPost, Patterns: []string{"/file"}},
	{Name: "file_result", Method: http.MethodGet, Patterns: []string{"/file/{data_id}"}, Polled: true},
	{Name: "cancel", Method: http.MethodPost, Patterns: []string{"/file/{data_id}/cancel"}},
	{Name: "sanitized_download", Method: http.MethodGet, Patterns: []string{"/file/converted/{data_id}"}},
	{Name: "webhook_status", Method: http.MethodGet, Patterns: []string{"/file/webhook/{data_id}"}},
	{Name: "rules", Method: http.MethodGet, Patterns: []string{"/file/rules"}},
	{Name: "batch_open", Method: http.MethodPost, Patterns: []string{"/file/batch"}},
	{Name: "batch_status", Method: http.MethodGet, Patterns: []string{"/file/batch/{batch_id}"}, Polled: true},
	{Name: "batch_close", Method: http.MethodPost, Patterns: []string{"/file/batch/{batch_id}/close"}},
	{Name: "batch_certificate", Method: http.MethodGet, Patterns: []string{"/file/batch/{batch_id}/certificate"}},
	{Name: "hash_lookup", Method: http.MethodGet, Patterns: []string{"/hash/{hash}"}, Polled: true},
	{Name: "login", Method: http.MethodPost, Patterns: []string{"/login"}},
	{Name: "logout", Method: http.MethodPost, Patterns: []string{"/logout"}},
	{Name: "version", Method: http.MethodGet, Patterns: []string{"/version"}},
	{Name: "stat", Method: http.MethodGet, Patterns: []string{"/stat/nodes", "/stat/engines"}},
	{Name: "readyz", Method: http.MethodGet, Patterns: []string{"/readyz"}},
	{Name: "admin", Method: "*", Patterns: []string{"/admin", "/admin/*"}},
}

// RouteNames returns the name of every route of Routes, then RouteOther: the complete,
// fixed set of route label values.
func RouteNames() []string {
	names := make([]string, 0, len(Routes)+1)
	for _, r := range Routes {
		names = append(names, r.Name)
	}
	return append(names, RouteOther)
}

// CanonicalPath returns the path a request is routed by, so that no spelling of a path
// escapes the bucket of the route it reaches at Core: the decoded path with empty, "."
// and ".." segments resolved, no trailing slash, in lower case (Core on Windows matches
// paths without regard to case). ok is false for a path whose meaning depends on the
// server that decodes it, an encoded slash or backslash (%2F, %5C), a backslash or a NUL:
// the proxy refuses those with 400 rather than guess which route Core would see.
//
// The canonical path is used for routing only; the path forwarded to Core keeps the
// client's spelling and encoding.
func CanonicalPath(u *url.URL) (p string, ok bool) {
	if (u.RawPath != "" && containsFold(u.RawPath, "%2f", "%5c")) ||
		strings.ContainsAny(u.Path, "\\\x00") {
		return "", false
	}
	return strings.ToLower(path.Clean("/" + u.Path)), true
}

// containsFold reports whether s contains any of the lower-case escapes, in either
// case, without allocating (CanonicalPath runs on every request).
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
