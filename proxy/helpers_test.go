package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mdproxy/mdproxy/metrics"
)

// newTestProxy starts upstream on a loopback httptest.Server and, in front of it, the
// proxy built by New on a loopback httptest.Server. Options start with Upstream set to
// the upstream's URL, Metrics from metrics.New on a fresh prometheus.NewRegistry (the
// returned reg), and a Transport from NewTransport; opts, when not nil, may change any
// of them (Limits, LimitStatus, TrustedProxies, Transport...) before New is called.
//
// It returns the proxy's base URL ("http://127.0.0.1:port") and the registry. Both
// servers and the transport's idle connections are closed by t.Cleanup (the proxy
// first, then the upstream). It fails t if New returns an error.
func newTestProxy(t testing.TB, upstream http.Handler, opts func(*Options)) (proxyURL string, reg *prometheus.Registry) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatalf("parsing upstream URL %q: %v", up.URL, err)
	}
	reg = prometheus.NewRegistry()
	tr := NewTransport(TransportOptions{})
	t.Cleanup(tr.CloseIdleConnections)
	o := Options{Upstream: u, Metrics: metrics.New(reg), Transport: tr}
	if opts != nil {
		opts(&o)
	}
	p, err := New(o)
	if err != nil {
		t.Fatalf("New(%+v) = %v, want no error", o, err)
	}
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	return front.URL, reg
}

// metricValue returns the value of the counter or gauge name (e.g.
// "mdproxy_requests_total") whose labels include every pair of labels, summed over the
// series that match; 0 when none does. It reads reg.Gather and fails t on its error.
func metricValue(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v, want no error", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				sum += m.GetUntyped().GetValue()
			}
		}
	}
	return sum
}

// rawRequest sends head (a request line and headers, each line ending in "\r\n",
// without the blank line that ends them) as is on a new TCP connection to proxyURL's
// host, then the blank line, and returns the response, body read. Unlike http.Client it
// keeps the request target exactly as written ("//file/x", "/file\x"). It adds "Host"
// and "Connection: close" unless head has them. Not for HEAD: the body is read as a GET's.
func rawRequest(t testing.TB, proxyURL, head string) (*http.Response, string) {
	t.Helper()
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatalf("parsing %q: %v", proxyURL, err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatalf("dialing %s: %v", u.Host, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	lower := strings.ToLower(head)
	if !strings.Contains(lower, "\r\nhost:") {
		head += "Host: " + u.Host + "\r\n"
	}
	if !strings.Contains(lower, "\r\nconnection:") {
		head += "Connection: close\r\n"
	}
	if _, err := fmt.Fprintf(conn, "%s\r\n", head); err != nil {
		t.Fatalf("writing request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading response to %q: %v", head, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatalf("reading response body to %q: %v", head, err)
	}
	return resp, b.String()
}

// waitMetric waits until metricValue(t, reg, name, labels) equals want, for at most 5
// seconds, then fails t with the last value. A forwarded request is counted when its
// handler returns, which may be just after the client has read the whole answer (the
// reverse proxy flushes as it copies); tests that count forwarded requests wait here.
func waitMetric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := metricValue(t, reg, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s%s = %v after 5 s, want %v", name, formatLabels(labels), got, want)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// formatLabels writes labels as Prometheus does, {k="v",...}, sorted by name.
func formatLabels(labels map[string]string) string {
	pairs := make([]string, 0, len(labels))
	for k, v := range labels {
		pairs = append(pairs, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(pairs)
	return "{" + strings.Join(pairs, ",") + "}"
}
