package sidecar

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// TestListenersCloseAmbiguousFraming: the bridge's callback listener and the admin
// listener end a connection after a request framed by Transfer-Encoding (it may have
// come with a Content-Length a proxy in front framed it by) or sent in HTTP/1.0, whose
// Transfer-Encoding net/http drops: the request pipelined after it is never served
// (RFC 9112, section 6.1), as on the proxy's listener.
func TestListenersCloseAmbiguousFraming(t *testing.T) {
	core := httptest.NewServer(http.NotFoundHandler())
	defer core.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bridgeAddr := l.Addr().String()
	l.Close()
	in := startRun(t, core.URL, map[string]string{"MDPROXY_BRIDGE_LISTEN_ADDR": bridgeAddr})
	admin, _ := url.Parse(in.adminURL)
	for _, addr := range []string{bridgeAddr, admin.Host} {
		for _, first := range []string{
			"POST /callback/abc HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			"GET /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			"POST /callback/abc HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\n4a\r\n",
		} {
			conn, err := net.DialTimeout("tcp", addr, safety)
			if err != nil {
				t.Fatal(err)
			}
			_ = conn.SetDeadline(time.Now().Add(safety))
			_, _ = io.WriteString(conn, first+"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s %q: reading the answer: %v", addr, first, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !resp.Close {
				t.Errorf("%s %q: answer %d without Connection: close", addr, first, resp.StatusCode)
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Errorf("%s %q: after the answer got %q, %v; want the connection closed", addr, first, rest, err)
			}
			conn.Close()
		}
	}
}

// TestAdminMethods: the admin listener's pages answer GET and HEAD (RFC 9110, section
// 9.1: HEAD wherever GET), and any other method 405 with one Allow field naming both
// (section 15.5.6), /metrics included.
func TestAdminMethods(t *testing.T) {
	core := httptest.NewServer(http.NotFoundHandler())
	defer core.Close()
	in := startRun(t, core.URL, nil)
	c := &http.Client{Timeout: safety}
	for _, page := range []string{"/metrics", "/healthz", "/readyz", "/config"} {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete, http.MethodPut} {
			req, _ := http.NewRequest(m, in.adminURL+page, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch m {
			case http.MethodGet, http.MethodHead:
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s %s = %d, want 200", m, page, resp.StatusCode)
				}
			default:
				if allow := resp.Header.Values("Allow"); resp.StatusCode != http.StatusMethodNotAllowed || len(allow) != 1 || allow[0] != "GET, HEAD" {
					t.Errorf("%s %s = %d (Allow %q), want 405 with Allow: GET, HEAD", m, page, resp.StatusCode, allow)
				}
			}
		}
	}
}
