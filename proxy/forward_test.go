package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// maxHeapGrowth is the most the heap may grow while a large body streams through the
// proxy: a few buffers per connection, far below the body.

const maxHeapGrowth = 32 << 20

// TestForwardLargeUpload sends 1 GiB to POST /file and checks that Core receives it
// with the client's Content-Length (never chunked), byte for byte, while the heap stays
// flat: the upload is streamed, not buffered (DESIGN.md, "POST /file is streamed").
func TestForwardLargeUpload(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB upload: skipped with -short")
	}
	const size = 1 << 30
	type seen struct {
		contentLength int64
		header        string
		te            []string
		sum           string
		n             int64
		err           error
	}
	got := make(chan seen, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{contentLength: r.ContentLength, header: r.Header.Get("Content-Length"), te: r.TransferEncoding}
		s.sum, s.n, s.err = sha256Hex(r.Body)
		got <- s
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data_id":"61dffeaa728844adbf49eb090e4ece0e"}`)
	})
	base, reg := newTestProxy(t, upstream, nil)
	client := newClient(t)

	clientHash := sha256.New()
	req, err := http.NewRequest(http.MethodPost, base+"/file", io.TeeReader(bodyStream(size), clientHash))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("filename", "big.bin")

	start := time.Now()
	stop := heapWatch()
	resp, err := client.Do(req)
	if err != nil {
		stop()
		t.Fatalf("POST /file (1 GiB): %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	growth := stop()
	t.Logf("1 GiB upload through the proxy: %v, heap growth %.1f MiB", time.Since(start).Round(time.Millisecond), float64(growth)/(1<<20))
	if err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != `{"data_id":"61dffeaa728844adbf49eb090e4ece0e"}` {
		t.Fatalf("POST /file = %d %q, want 200 and Core's data_id", resp.StatusCode, body)
	}

	var s seen
	select {
	case s = <-got:
	case <-time.After(longWait):
		t.Fatal("upstream never reported the upload")
	}
	if s.err != nil {
		t.Fatalf("upstream reading body: %v", s.err)
	}
	if s.contentLength != size || s.header != fmt.Sprint(size) || len(s.te) != 0 {
		t.Errorf("upstream saw ContentLength %d, Content-Length %q, TransferEncoding %q; want %d, %q, none",
			s.contentLength, s.header, s.te, size, fmt.Sprint(size))
	}
	if want := hexSum(clientHash); s.n != size || s.sum != want {
		t.Errorf("upstream received %d bytes, SHA-256 %s; want %d bytes, SHA-256 %s", s.n, s.sum, size, want)
	}
	if growth > maxHeapGrowth {
		t.Errorf("heap grew by %d MiB during a 1 GiB upload, want under %d MiB: the body is buffered", growth>>20, maxHeapGrowth>>20)
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "submit", "code": "200"}, 1)
	checkMetric(t, reg, "mdproxy_request_body_bytes_total", map[string]string{"route": "submit"}, size)
}

// TestForwardLargeDownload streams a 256 MiB sanitized file from Core and checks that
// it reaches the client intact, with Core's Content-Length, on a flat heap.
func TestForwardLargeDownload(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB download: skipped with -short")
	}
	const size = 256 << 20
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/file/converted/d41d8cd98f00b204" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", fmt.Sprint(size))
		_, _ = io.Copy(w, bodyStream(size))
	})
	base, reg := newTestProxy(t, upstream, nil)
	client := newClient(t)
	want, _, _ := sha256Hex(bodyStream(size))

	start := time.Now()
	stop := heapWatch()
	resp, err := client.Get(base + "/file/converted/d41d8cd98f00b204")
	if err != nil {
		stop()
		t.Fatalf("GET /file/converted/{id}: %v", err)
	}
	sum, n, err := sha256Hex(resp.Body)
	resp.Body.Close()
	growth := stop()
	t.Logf("256 MiB download through the proxy: %v, heap growth %.1f MiB", time.Since(start).Round(time.Millisecond), float64(growth)/(1<<20))
	if err != nil {
		t.Fatalf("reading download after %d bytes: %v", n, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /file/converted/{id} = %d, want 200", resp.StatusCode)
	}
	if resp.ContentLength != size || len(resp.TransferEncoding) != 0 {
		t.Errorf("client saw ContentLength %d, TransferEncoding %q; want %d, none", resp.ContentLength, resp.TransferEncoding, size)
	}
	if n != size || sum != want {
		t.Errorf("client received %d bytes, SHA-256 %s; want %d bytes, SHA-256 %s", n, sum, size, want)
	}
	if growth > maxHeapGrowth {
		t.Errorf("heap grew by %d MiB during a 256 MiB download, want under %d MiB: the body is buffered", growth>>20, maxHeapGrowth>>20)
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "sanitized_download", "code": "200"}, 1)
	checkMetric(t, reg, "mdproxy_response_body_bytes_total", map[string]string{"route": "sanitized_download"}, size)
}

// TestForwardChunkedUploadRefused checks that POST /file without Content-Length gets
// Core's 411 from the proxy itself, before a byte of its body goes anywhere: Core does
// not accept chunked uploads (core-api/README.md).
func TestForwardChunkedUploadRefused(t *testing.T) {
	var calls atomic.Int32
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"data_id":"x"}`)
	})
	base, reg := newTestProxy(t, upstream, nil)
	client := newClient(t)

	t.Run("chunked", func(t *testing.T) {
		var read atomic.Int64
		body := unknownLength{io.TeeReader(bodyStream(4096), countWriter{&read})}
		req, err := http.NewRequest(http.MethodPost, base+"/file", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = -1
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST /file chunked: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusLengthRequired {
			t.Fatalf("POST /file chunked = %d %q, want 411", resp.StatusCode, b)
		}
		if msg := coreError(t, resp, b); !strings.Contains(msg, "Chunked uploads are not accepted") {
			t.Errorf("POST /file chunked: %q, want it to say chunked uploads are not accepted", msg)
		}
	})

	// The raw variants write the request head only: the body never follows, since the
	// client waits for 100 Continue, which must not come.
	for _, tc := range []struct{ name, head string }{
		{"chunked with Expect 100-continue", "POST /file HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n"},
		{"no length header with Expect 100-continue", "POST /file HTTP/1.1\r\nExpect: 100-continue\r\n"},
		{"no length header", "POST /file HTTP/1.1\r\nContent-Type: application/octet-stream\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawRequest(t, base, tc.head)
			if resp.StatusCode != http.StatusLengthRequired {
				t.Fatalf("%q = %d %q, want 411 (and no 100 Continue before it)", tc.head, resp.StatusCode, body)
			}
			coreError(t, resp, []byte(body))
		})
	}

	if n := calls.Load(); n != 0 {
		t.Errorf("upstream called %d times, want 0: a refused upload must not be forwarded", n)
	}
	mustWaitMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": "submit", "code": "411"}, 4)
	checkMetric(t, reg, "mdproxy_request_body_bytes_total", map[string]string{"route": "submit"}, 0)
}

// TestForwardHeaders checks that hop-by-hop headers stop at the proxy both ways
// (RFC 9110, section 7.6.1: the fixed list and any header the Connection header names),
// that Core's own request headers pass unchanged, and that X-Forwarded-For names the
// client the proxy saw, whatever the client claimed.
func TestForwardHeaders(t *testing.T) {
	endToEnd := map[string]string{
		"apikey":      "0a1b2c3d4e5f",
		"filename":    "report 2024 (final).pdf",
		"filepath":    "C:/shares/in/report.pdf",
		"rule":        "multiscan,sanitize",
		"workflow":    "File process",
		"callbackurl": "http://10.0.0.7:8080/hook?id=1&x=y",
		"metadata":    `{"source": "mail-gw", "tags": ["a", "b"]}`,
		"archivepwd":  "p%40ss%20word",
		"batch":       "b0c1d2",
		"user_agent":  "icap/4.0",
		"X-Custom":    "kept",
	}
	hopByHop := []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Upgrade", "Proxy-Authorization", "X-Foo", "X-Bar"}

	got := make(chan http.Header, 1)
	gotBody := make(chan string, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		b, _ := io.ReadAll(r.Body)
		gotBody <- string(b)
		h := w.Header()
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "must not reach the client")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("X-End", "reaches the client")
		_, _ = io.WriteString(w, `{"data_id":"h"}`)
	})
	base, _ := newTestProxy(t, upstream, nil)
	client := newClient(t)

	const payload = "file content"
	req, err := http.NewRequest(http.MethodPost, base+"/file", strings.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range endToEnd {
		req.Header[k] = []string{v} // as sent by clients: lower case, not canonicalized
	}
	req.Header.Set("Connection", "X-Foo, X-Bar")
	req.Header.Set("X-Foo", "secret")
	req.Header.Set("X-Bar", "secret too")
	req.Header.Set("Keep-Alive", "timeout=5, max=100")
	req.Header.Set("Proxy-Connection", "keep-alive")
	req.Header.Set("TE", "gzip")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Proxy-Authorization", "Basic dXNlcjpwYXNz")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST /file: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /file = %d %q, want 200", resp.StatusCode, b)
	}

	h := <-got
	for _, k := range hopByHop {
		if v, ok := h[http.CanonicalHeaderKey(k)]; ok {
			t.Errorf("upstream received hop-by-hop header %s: %q", k, v)
		}
	}
	for k, v := range endToEnd {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("upstream header %s = %q, want [%q]", k, got, v)
		}
	}
	if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("upstream X-Forwarded-For = %q, want [\"127.0.0.1\"] (the peer; the client's own value dropped)", got)
	}
	if got := h.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("upstream X-Forwarded-Proto = %q, want http", got)
	}
	if got, want := h.Get("X-Forwarded-Host"), strings.TrimPrefix(base, "http://"); got != want {
		t.Errorf("upstream X-Forwarded-Host = %q, want %q", got, want)
	}
	if got := h.Get("Content-Length"); got != fmt.Sprint(len(payload)) {
		t.Errorf("upstream Content-Length = %q, want %d", got, len(payload))
	}
	if body := <-gotBody; body != payload {
		t.Errorf("upstream body = %q, want %q", body, payload)
	}

	for _, k := range []string{"X-Hop", "Keep-Alive"} {
		if v, ok := resp.Header[k]; ok {
			t.Errorf("client received hop-by-hop response header %s: %q", k, v)
		}
	}
	if v := resp.Header.Get("Connection"); strings.Contains(strings.ToLower(v), "x-hop") {
		t.Errorf("client received Connection: %q, want Core's hop-by-hop list dropped", v)
	}
	if got := resp.Header.Get("X-End"); got != "reaches the client" {
		t.Errorf("client X-End = %q, want Core's value", got)
	}
}

// TestForwardQueryString checks that the query string reaches Core as the client wrote
// it: order, repeats, empty values and escapes untouched.
func TestForwardQueryString(t *testing.T) {
	got := make(chan string, 1)
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.URL.RawQuery
		_, _ = io.WriteString(w, "{}")
	})
	base, _ := newTestProxy(t, upstream, nil)
	client := newClient(t)

	for _, tc := range []struct{ method, path, query string }{
		{http.MethodGet, "/file/abc123", "a=1&b=2"},
		{http.MethodGet, "/file/batch/b1", "first=50&size=50"},
		{http.MethodGet, "/file/abc123", "z=1&a=2&z=3&empty=&flag"},
		{http.MethodGet, "/hash/d41d8cd98f00b204e9800998ecf8427e", "x=%2F%20y&plus=a+b&utf=%E2%9C%93&Upper=%2f"},
		{http.MethodPost, "/file", "callback=http%3A%2F%2Fh%2Fp%3Fq%3D1"},
		{http.MethodGet, "/version", ""},
	} {
		t.Run(tc.path+"?"+tc.query, func(t *testing.T) {
			target := base + tc.path
			if tc.query != "" {
				target += "?" + tc.query
			}
			var body io.Reader
			if tc.method == http.MethodPost {
				body = bytes.NewReader([]byte("data"))
			}
			req, err := http.NewRequest(tc.method, target, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, target, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s = %d, want 200", tc.method, target, resp.StatusCode)
			}
			select {
			case q := <-got:
				if q != tc.query {
					t.Errorf("upstream query = %q, want %q", q, tc.query)
				}
			case <-time.After(longWait):
				t.Fatal("upstream not reached")
			}
		})
	}
}

// TestForwardTrustedChain checks that a trusted peer's X-Forwarded-For chain reaches
// Core extended with the peer, while an untrusted peer's chain is replaced by the peer;
// and an untrusted peer's X-Real-IP does not reach Core, a trusted one's does.
func TestForwardTrustedChain(t *testing.T) {
	for _, tc := range []struct {
		name       string
		trusted    []netip.Prefix
		want       string
		wantRealIP string
	}{
		{"untrusted peer", nil, "127.0.0.1", ""},
		{"trusted peer", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, "203.0.113.9, 127.0.0.1", "198.51.100.7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan [2]string, 1)
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- [2]string{strings.Join(r.Header.Values("X-Forwarded-For"), ","), strings.Join(r.Header.Values("X-Real-IP"), ",")}
			})
			front, _ := newTestProxy(t, up, func(o *Options) { o.TrustedProxies = tc.trusted })
			req, _ := http.NewRequest(http.MethodGet, front+"/version", nil)
			req.Header.Set("X-Forwarded-For", "203.0.113.9")
			req.Header.Set("X-Real-IP", "198.51.100.7")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET /version: %v", err)
			}
			resp.Body.Close()
			g := <-got
			if g[0] != tc.want {
				t.Errorf("upstream X-Forwarded-For = %q, want %q", g[0], tc.want)
			}
			if g[1] != tc.wantRealIP {
				t.Errorf("upstream X-Real-IP = %q, want %q", g[1], tc.wantRealIP)
			}
		})
	}
}

// TestChunkedRequestClosesConnection: a request framed by Transfer-Encoding (which may
// have carried a Content-Length that a proxy in front framed it by) is answered and its
// connection closed (RFC 9112, section 6.1): a request pipelined after it is never
// served, forwarded or not, limited or refused.
func TestChunkedRequestClosesConnection(t *testing.T) {
	up := &recordingUpstream{}
	// Core reads the body (answering an Expect: 100-continue with 100) and, for one
	// path, sends 103 Early Hints first: ReverseProxy relays each 1xx and then clears
	// the header map, Connection: close included.
	core := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, "/file/early") {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		}
		up.ServeHTTP(w, r)
	})
	front, _ := newTestProxy(t, core, nil)
	u, _ := url.Parse(front)
	for _, first := range []string{
		"POST /file/batch HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"GET /version HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET /file/. HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /file/early/cancel HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST /login HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		// HTTP/1.0: net/http drops its Transfer-Encoding and frames it by the length.
		"POST /file/x/cancel HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\n4a\r\n",
		"GET /version HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		// What follows a CONNECT may be tunnel bytes to a proxy in front.
		"CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\n\r\n",
	} {
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(conn, first+"GET /version?second HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		var resp *http.Response
		for resp == nil || resp.StatusCode < 200 {
			if resp, err = http.ReadResponse(br, nil); err != nil {
				t.Fatalf("%q: reading the first answer: %v", first, err)
			}
			if resp.StatusCode < 200 && resp.Close {
				t.Errorf("%q: interim answer %d with Connection: close", first, resp.StatusCode)
			}
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !resp.Close {
			t.Errorf("%q: answer %d without Connection: close", first, resp.StatusCode)
		}
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
			t.Errorf("%q: after the first answer got %q, %v; want the connection closed", first, rest, err)
		}
		conn.Close()
	}
	for _, r := range up.requests() {
		if strings.Contains(r, "second") {
			t.Errorf("the request pipelined after a chunked or HTTP/1.0 one reached Core: %q", r)
		}
	}
}

// TestAmbiguousRequestsRefused: what one server reads otherwise than another never
// reaches Core past the limit: a method of Core's API in another case gets 501, a
// request with two apikey headers 400 (the share and the bridge read one, Core might
// read the other), each in Core's error format and counted under route other; the
// header fields with which some servers take another path or method are not
// forwarded, nor an empty X-Forwarded-Host for an HTTP/1.0 request without Host.
func TestAmbiguousRequestsRefused(t *testing.T) {
	var mu sync.Mutex
	var seen []*http.Request
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	front, reg := newTestProxy(t, up, nil)
	for _, tc := range []struct {
		head string
		code int
	}{
		{"get /file/x HTTP/1.1\r\n", http.StatusNotImplemented},
		{"Get /hash/abc HTTP/1.1\r\n", http.StatusNotImplemented},
		{"pOST /file HTTP/1.1\r\nContent-Length: 0\r\n", http.StatusNotImplemented},
		{"GET /file/x HTTP/1.1\r\napikey: k1\r\napikey: k2\r\n", http.StatusBadRequest},
	} {
		resp, body := rawRequest(t, front, tc.head)
		if resp.StatusCode != tc.code || !strings.HasPrefix(body, `{"err":`) {
			t.Errorf("%q = %d %q, want %d in Core's error format", tc.head, resp.StatusCode, body, tc.code)
		}
	}
	checkMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": RouteOther, "code": "501"}, 3)
	checkMetric(t, reg, "mdproxy_requests_total", map[string]string{"route": RouteOther, "code": "400"}, 1)

	rawRequest(t, front, "GET /version HTTP/1.1\r\nX-Original-URL: /file/x\r\nX-Rewrite-URL: /file/x\r\n"+
		"X-HTTP-Method-Override: DELETE\r\nX-HTTP-Method: DELETE\r\nX-Method-Override: DELETE\r\napikey: k1\r\n")
	u, _ := url.Parse(front)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /version HTTP/1.0\r\n\r\n") // no Host
	_, _ = io.ReadAll(conn)
	conn.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("Core got %d requests, want the 2 plain ones", len(seen))
	}
	for _, k := range overrideFields {
		if v := seen[0].Header[k]; v != nil {
			t.Errorf("Core got %s: %q, want it not forwarded", k, v)
		}
	}
	if got := seen[0].Header.Get("apikey"); got != "k1" {
		t.Errorf("Core got apikey %q, want k1", got)
	}
	if v, ok := seen[1].Header["X-Forwarded-Host"]; ok {
		t.Errorf("Core got X-Forwarded-Host %q for a request without Host, want none", v)
	}
}

// TestStalledUploadIsClients: a client that stops sending its upload gets 408 and is
// counted a client body timeout, never 502 with Core blamed, even when Core's wait for
// headers (the upstream timeout) is as long as the body idle timeout: Core waits on the
// client, whose bound decides.
func TestStalledUploadIsClients(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a timeout of 1 s, four times at once")
	}
	const timeout = time.Second
	var got atomic.Int64
	core := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got.Add(n)
		_, _ = io.WriteString(w, `{"data_id":"x"}`)
	})
	front, reg := newTestProxy(t, core, func(o *Options) {
		o.BodyIdleTimeout = timeout
		o.Transport = upstreamTransport(t, TransportOptions{ResponseHeaderTimeout: timeout, BodyIdleTimeout: timeout})
	})
	u, _ := url.Parse(front)
	const n = 4
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			_, _ = io.WriteString(conn, "POST /file HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Errorf("upload %d: %v, want 408", i, err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Errorf("upload %d stalled by its client = %d %s, want 408", i, resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	checkMetric(t, reg, "mdproxy_body_timeouts_total", map[string]string{"route": "submit", "peer": "client"}, n)
	if v := metricValue(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "submit", "kind": "reset"}); v != 0 {
		t.Errorf("upstream_errors_total{kind=reset} = %v, want 0: Core did nothing wrong", v)
	}
}

// TestInvalidStatusFromCore: Core's answer with a status outside 100 to 599 (RFC 9110,
// section 15) is not relayed, bridged or not: the client gets 502 in Core's format,
// never a 200 of the proxy's (099 read as a 1xx) nor the status itself, and the code
// label of the metrics stays a status.
func TestInvalidStatusFromCore(t *testing.T) {
	u := rawCore(t, func(c net.Conn, req *http.Request) {
		code := req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:]
		fmt.Fprintf(c, "HTTP/1.1 %s Odd\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", code)
	})
	for _, bridged := range []bool{false, true} {
		front, reg := newTestProxy(t, http.NotFoundHandler(), func(o *Options) {
			o.Upstream = u
			if bridged {
				o.Bridge = newTestBridge(t)
			}
		})
		for _, code := range []string{"099", "000", "600", "999"} {
			for _, path := range []string{"/file/" + code, "/version/" + code, "/file/webhook/" + code} {
				resp, body := do(t, newClient(t), http.MethodGet, front+path, nil)
				if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "invalid status") {
					t.Errorf("bridge %v: GET %s, Core answering status %s = %d %q, want 502 saying the status is invalid", bridged, path, code, resp.StatusCode, body)
				}
			}
		}
		for _, c := range []string{"99", "0", "600", "999", "200"} {
			if n := metricValue(t, reg, "mdproxy_upstream_responses_total", map[string]string{"code": c}); n != 0 {
				t.Errorf("bridge %v: upstream_responses_total{code=%s} = %v, want no such series", bridged, c, n)
			}
		}
	}
}

// TestInterimAnswersCapped: Core's 1xx answers reach the client at most maxInterim
// times for one request, then Core's final answer: net/http does not cap them once
// ReverseProxy hooks them.
func TestInterimAnswersCapped(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for range 200 {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		}
		_, _ = io.WriteString(w, "final")
	})
	front, _ := newTestProxy(t, up, nil)
	u, _ := url.Parse(front)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	interim := 0
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("after %d 1xx answers: %v", interim, err)
		}
		if resp.StatusCode < 200 {
			interim++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "final" {
			t.Errorf("final answer = %d %q, want Core's 200 final", resp.StatusCode, body)
		}
		break
	}
	if interim < 1 || interim > maxInterim {
		t.Errorf("1xx answers relayed = %d of Core's 200, want 1 to %d", interim, maxInterim)
	}
}

// TestCoreAnswerWaitIsUpstreamTimeout: with an upstream timeout (ResponseHeaderTimeout)
// longer than the body idle timeout, Core's answer may take up to the upstream timeout
// to arrive whole, however its headers come: at once after a pause, after a 103, or a
// status line in two parts. Until mdproxy knew the headers were in, each read of Core's
// connection waited the body idle timeout only: the second read of an answer (after a
// 1xx or a partial line) was cut (504 "made no progress", or 502 "other" for a status
// line cut in two), and so was a first read that began after the request's write.
// A body that stalls once the headers are in is still cut after the body idle timeout,
// not the upstream timeout (issue 9's case 4).
func TestCoreAnswerWaitIsUpstreamTimeout(t *testing.T) {
	const idle, wait, late = 300 * time.Millisecond, 20 * time.Second, time.Second
	const final = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"data_id\":\"x1\"}"
	core := rawCore(t, func(c net.Conn, req *http.Request) {
		switch id := req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:]; id {
		case "late":
			time.Sleep(late)
			_, _ = io.WriteString(c, final)
		case "hints":
			_, _ = io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")
			time.Sleep(late)
			_, _ = io.WriteString(c, final)
		case "split":
			_, _ = io.WriteString(c, final[:10])
			time.Sleep(late)
			_, _ = io.WriteString(c, final[10:])
		case "stall":
			_, _ = io.WriteString(c, final[:len(final)-8])
			_, _ = c.Read(make([]byte, 1)) // until the proxy gives up and closes
		}
	})
	for _, bridged := range []bool{false, true} {
		t.Run(map[bool]string{false: "relayed", true: "bridged"}[bridged], func(t *testing.T) {
			front, reg := newTestProxy(t, http.NotFoundHandler(), func(o *Options) {
				o.Upstream = core
				o.Transport = upstreamTransport(t, TransportOptions{ResponseHeaderTimeout: wait, BodyIdleTimeout: idle})
				o.UpstreamTimeout, o.BodyIdleTimeout = wait, idle
				if bridged {
					o.Bridge = newTestBridge(t)
				}
			})
			for _, id := range []string{"late", "hints", "split"} {
				resp, body := do(t, newClient(t), http.MethodGet, front+"/file/"+id, nil)
				if resp.StatusCode != http.StatusOK || body != `{"data_id":"x1"}` {
					t.Errorf("GET /file/%s, Core's answer whole after %v = %d %q, want Core's 200", id, late, resp.StatusCode, body)
				}
			}
			// The stalled body: cut after the body idle timeout, long before the
			// upstream timeout (the client gives up at half of it).
			c := &http.Client{Timeout: wait / 2}
			resp, err := c.Get(front + "/file/stall")
			if err == nil {
				body, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				if rerr == nil && resp.StatusCode != http.StatusGatewayTimeout {
					t.Errorf("GET a body Core stalled = %d %q, want it cut or 504", resp.StatusCode, body)
				}
				if errors.Is(rerr, context.DeadlineExceeded) || (rerr != nil && strings.Contains(rerr.Error(), "Client.Timeout")) {
					t.Errorf("GET a body Core stalled: %v; want the proxy to cut it after the body idle timeout", rerr)
				}
			} else if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
				t.Errorf("GET a body Core stalled: %v; want the proxy to cut it after the body idle timeout", err)
			}
			mustWaitMetric(t, reg, "mdproxy_body_timeouts_total", map[string]string{"route": "file_result", "peer": "core"}, 1)
			checkMetric(t, reg, "mdproxy_upstream_errors_total", map[string]string{"route": "file_result"}, 1)
		})
	}
}
