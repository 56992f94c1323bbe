package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mdproxy/mdproxy/limiter"
	"github.com/mdproxy/mdproxy/metrics"
)

// TestRouteTable checks that every pattern of every route of routeTable, with its method
// (GET routes also with HEAD, "*" routes with several methods), reaches the upstream
// and is counted under the route's name; and that unknown paths and unlisted methods
// are forwarded and counted under "other".
func TestRouteTable(t *testing.T) {
	up := &recordingUpstream{}
	base, reg := newTestProxy(t, up, nil)

	type call struct{ method, path, route string }
	var calls []call
	for _, rt := range routeTable {
		for _, pattern := range rt.patterns {
			path := samplePath(pattern)
			switch rt.method {
			case "*":
				for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead} {
					calls = append(calls, call{m, path, rt.name})
				}
				calls = append(calls, call{http.MethodGet, pattern, rt.name}) // "/admin" itself
			case http.MethodGet:
				calls = append(calls, call{http.MethodGet, path, rt.name}, call{http.MethodHead, path, rt.name})
			default:
				calls = append(calls, call{rt.method, path, rt.name})
			}
		}
	}
	calls = append(calls,
		call{http.MethodGet, "/", RouteOther},
		call{http.MethodGet, "/nope", RouteOther},
		call{http.MethodGet, "/file/abc/def/ghi", RouteOther},
		call{http.MethodGet, "/hash", RouteOther},
		call{http.MethodGet, "/stat/other", RouteOther},
		call{http.MethodDelete, "/file/abc123", RouteOther},
		call{http.MethodPut, "/version", RouteOther},
		call{http.MethodPost, "/hash/abc123", RouteOther},
		call{http.MethodGet, "/file/abc123/cancel", RouteOther},
		call{http.MethodPost, "/readyz", RouteOther},
		call{"PROPFIND", "/file/abc123", RouteOther},
	)

	for _, c := range calls {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			method := c.method
			label := metrics.Method(method)
			before := up.count()
			reqs := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": c.route, "method": label, "code": "200"})
			allowed := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": c.route, "decision": "allowed"})

			resp, _ := do(t, nil, method, base+c.path, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: status = %d, want 200", method, c.path, resp.StatusCode)
			}
			seen := up.requests()
			if len(seen) != before+1 {
				t.Fatalf("%s %s: upstream got %d requests, want 1", method, c.path, len(seen)-before)
			}
			if want := method + " " + c.path; seen[len(seen)-1] != want {
				t.Errorf("upstream got %q, want %q", seen[len(seen)-1], want)
			}
			waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": c.route, "method": label, "code": "200"}, reqs+1)
			waitMetric(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": c.route, "decision": "allowed"}, allowed+1)
		})
	}

	// Every route name was used, and no request was counted under another name.
	waitMetric(t, reg, "mdproxy_requests_total", nil, float64(len(calls)))
	waitMetric(t, reg, "mdproxy_limiter_decisions_total", nil, float64(len(calls)))
}

// TestRouteTableCoversNames checks RouteNames: every route of routeTable once, then other.
func TestRouteTableCoversNames(t *testing.T) {
	names := RouteNames()
	if len(names) != len(routeTable)+1 || names[len(names)-1] != RouteOther {
		t.Fatalf("RouteNames() = %v, want the %d names of routeTable then %q", names, len(routeTable), RouteOther)
	}
	seen := map[string]bool{}
	for i, rt := range routeTable {
		if names[i] != rt.name {
			t.Errorf("RouteNames()[%d] = %q, want %q", i, names[i], rt.name)
		}
		if seen[rt.name] {
			t.Errorf("route name %q appears twice in routeTable", rt.name)
		}
		seen[rt.name] = true
		if !regexp.MustCompile(`^[a-z][a-z0-9_]*$`).MatchString(rt.name) {
			t.Errorf("route name %q is not snake_case", rt.name)
		}
	}
}

// TestPathVariantsShareBucket checks that no spelling of /file/x escapes file_result's
// bucket: with burst 1 and a negligible rate, after one /file/x is allowed every variant
// is rejected with 503 and counted as a file_result rejection, and none reaches Core.
func TestPathVariantsShareBucket(t *testing.T) {
	up := &recordingUpstream{}
	set := limitSet(t, map[string]limiter.Limit{"file_result": {Rate: 0.001, Burst: 1}}, newFakeClock())
	base, reg := newTestProxy(t, up, func(o *Options) { o.Limits = set })

	if resp, _ := do(t, nil, http.MethodGet, base+"/file/x", nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /file/x: status = %d, want 200", resp.StatusCode)
	}
	for _, v := range pathVariants {
		resp, body := rawRequest(t, base, "GET "+v+" HTTP/1.1\r\n")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("GET %s after /file/x took the only token: status = %d, want 503 (body %q)", v, resp.StatusCode, body)
		}
		if !strings.Contains(body, "file_result") {
			t.Errorf("GET %s: body = %q, want it to name route file_result", v, body)
		}
	}
	if got := up.requests(); len(got) != 1 {
		t.Errorf("upstream got %v, want only the first GET /file/x", got)
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": "file_result", "decision": "rejected"}); int(got) != len(pathVariants) {
		t.Errorf("limiter_decisions_total{route=file_result,decision=rejected} = %v, want %d", got, len(pathVariants))
	}
	if got := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "503"}); int(got) != len(pathVariants) {
		t.Errorf("requests_total{route=file_result,code=503} = %v, want %d", got, len(pathVariants))
	}
	if got := metricValue(t, reg, "mdproxy_limiter_decisions_total", map[string]string{"route": RouteOther}); got != 0 {
		t.Errorf("limiter_decisions_total{route=other} = %v, want 0: a variant escaped file_result", got)
	}
}

// TestAmbiguousPathsRefused checks that paths whose route depends on how the server
// decodes them (encoded slash or backslash, a backslash, a NUL, a dot segment: a poll of
// the data_id "." at a server that does not resolve it, "/file" at one that does) are
// refused with 400 and a Core-style JSON body, counted under other, and never reach Core.
func TestAmbiguousPathsRefused(t *testing.T) {
	up := &recordingUpstream{}
	base, reg := newTestProxy(t, up, nil)
	paths := append([]string{
		"/file/x%2Fy", "/file/x%2fy", "/file/x%5Cy", "/file/x%5cy", `/file\x`,
		"/file/x%00y", "/%2Ffile/x", "/file%2Fx", "/admin%2F..%2Ffile/x", "*",
		"/file/x;v=1/", "/file;/x", "/file%3B/x", "/hash;x/abc",
		"a:file/abc", "a:../file/abc", "A:%2ffile/abc", "http:/file/abc",
	}, dotPaths...)
	for _, p := range paths {
		t.Run(p, func(t *testing.T) {
			resp, body := rawRequest(t, base, "GET "+p+" HTTP/1.1\r\n")
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("GET %s: status = %d, want 400 (body %q)", p, resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("GET %s: Content-Type = %q, want application/json", p, ct)
			}
			var e map[string]string
			if err := json.Unmarshal([]byte(body), &e); err != nil || e["err"] == "" || len(e) != 1 {
				t.Errorf("GET %s: body = %q, want {\"err\": \"...\"}", p, body)
			}
		})
	}
	if got := up.requests(); len(got) != 0 {
		t.Errorf("upstream got %v, want nothing", got)
	}
	if got := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": RouteOther, "method": "GET", "code": "400"}); int(got) != len(paths) {
		t.Errorf("requests_total{route=other,method=GET,code=400} = %v, want %d", got, len(paths))
	}
}

// TestPathForwardedAsSpelled checks that the path reaching Core keeps the client's
// spelling and encoding (and the query), though the route is chosen by the canonical
// path.
func TestPathForwardedAsSpelled(t *testing.T) {
	up := &recordingUpstream{}
	base, reg := newTestProxy(t, up, nil)
	targets := []string{
		"/file/%78", "//file/x", "/file//x", "/FILE/X", "/file/x/",
		"/file/x?verbose=1&a=%2F", "/hash/ABCDEF%30",
		"/file/%E2%82%AC", "/file/a%20b",
	}
	for _, target := range targets {
		resp, body := rawRequest(t, base, "GET "+target+" HTTP/1.1\r\n")
		if resp.StatusCode != http.StatusOK || body != "ok" {
			t.Errorf("GET %s: status %d body %q, want 200 ok", target, resp.StatusCode, body)
		}
	}
	got := up.requests()
	if len(got) != len(targets) {
		t.Fatalf("upstream got %d requests %v, want %d", len(got), got, len(targets))
	}
	for i, target := range targets {
		if want := "GET " + target; got[i] != want {
			t.Errorf("upstream got %q, want %q", got[i], want)
		}
	}
	// All but the hash look-up are file_result.
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "code": "200"}, float64(len(targets)-1))
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "hash_lookup", "code": "200"}, 1)
}

// TestCanonicalPath checks canonicalPath directly.
func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		raw    string
		want   string
		wantOK bool
	}{
		{"/file/x", "/file/x", true},
		{"//file/x", "/file/x", true},
		{"/FILE/X", "/file/x", true},
		{"/file/%78", "/file/x", true},
		{"/file/x/", "/file/x", true},
		{"/file/batch/../x", "", false},
		{"/../../file/x", "", false},
		{"/file/%2e", "", false},
		{"/file/x/.", "", false},
		{"/file/.x/..x", "/file/.x/..x", true},
		{"/file/x./x..", "/file/x./x..", true},
		{"", "/", true},
		{"/file/x%2Fy", "", false},
		{"/file/x%2fy", "", false},
		{"/file/x%5Cy", "", false},
		{"/file/x%00", "", false},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(http.MethodGet, "http://h"+tt.raw, nil)
		if err != nil {
			t.Fatalf("NewRequest(%q): %v", tt.raw, err)
		}
		got, ok := canonicalPath(req.URL)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("canonicalPath(%q) = %q, %v, want %q, %v", tt.raw, got, ok, tt.want, tt.wantOK)
		}
	}
}

// TestHeadForwardedAsHead checks that a HEAD on a GET route reaches Core as HEAD and is
// counted with method HEAD.
func TestHeadForwardedAsHead(t *testing.T) {
	var heads atomic.Int32
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			heads.Add(1)
		}
		w.Header().Set("Content-Length", "2")
		if r.Method != http.MethodHead {
			_, _ = io.WriteString(w, "ok")
		}
	})
	base, reg := newTestProxy(t, up, nil)
	resp, err := http.Head(base + "/file/abc")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != 2 {
		t.Errorf("HEAD /file/abc: status %d, Content-Length %d, want 200, 2", resp.StatusCode, resp.ContentLength)
	}
	if heads.Load() != 1 {
		t.Errorf("upstream got %d HEAD requests, want 1", heads.Load())
	}
	waitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "file_result", "method": "HEAD", "code": "200"}, 1)
}

// TestCanonicalPathOddStarts checks paths that net/http's server never hands over but a
// url.URL may hold: empty, relative, or starting with a dot; each is cleaned as if it
// began with "/", and none panics.
func TestCanonicalPathOddStarts(t *testing.T) {
	for in, want := range map[string]string{
		"":          "/",
		".x/A":      "/.x/a",
		"file/X":    "/file/x",
		"/File//x/": "/file/x",
		"/é/X":      "/é/x",
	} {
		got, ok := canonicalPath(&url.URL{Path: in})
		if !ok || got != want {
			t.Errorf("canonicalPath(%q) = %q, %v, want %q, true", in, got, ok, want)
		}
	}
	for _, in := range []string{".", "..", "./x", "../file/x", "/file/./X", "/a/b/../c", "*"} {
		if got, ok := canonicalPath(&url.URL{Path: in}); ok || got != "" {
			t.Errorf("canonicalPath(%q) = %q, %v, want \"\", false (a dot segment)", in, got, ok)
		}
	}
}

// TestConnectAndPrefaceRefused: CONNECT (authority-form, no path to route) and the
// HTTP/2 preface's PRI are answered 501 in Core's error format, counted under other,
// and never reach Core.
func TestConnectAndPrefaceRefused(t *testing.T) {
	up := &recordingUpstream{}
	base, reg := newTestProxy(t, up, nil)
	u, _ := url.Parse(base)
	for _, line := range []string{"CONNECT " + u.Host + " HTTP/1.1\r\n", "PRI * HTTP/1.1\r\n", "PRI * HTTP/2.0\r\n"} {
		resp, body := rawRequest(t, base, line)
		var e map[string]string
		if resp.StatusCode != http.StatusNotImplemented || json.Unmarshal([]byte(body), &e) != nil || e["err"] == "" {
			t.Errorf("%q: %d %q, want 501 with Core's {\"err\": ...}", line, resp.StatusCode, body)
		}
	}
	if got := up.requests(); len(got) != 0 {
		t.Errorf("upstream got %v, want nothing", got)
	}
	if got := metricValue(t, reg, "mdproxy_requests_total", map[string]string{"route": RouteOther, "code": "501"}); got != 3 {
		t.Errorf("requests_total{route=other,code=501} = %v, want 3", got)
	}
}
