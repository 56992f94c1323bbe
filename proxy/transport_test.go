package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"testing"
)

// TestTransportTLS: towards an https Core, the transport verifies Core with
// TLSClientConfig, and TLS runs over the *coreConn of DialContext, so that the body
// idle bound and the early answer to an upload hold under TLS too.
func TestTransportTLS(t *testing.T) {
	t.Parallel()
	core := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "core "+r.URL.Path)
	}))
	core.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake is expected
	core.StartTLS()
	defer core.Close()
	roots := x509.NewCertPool()
	roots.AddCert(core.Certificate())

	get := func(cfg *tls.Config) (*http.Response, net.Conn, error) {
		tr := NewTransport(TransportOptions{TLSClientConfig: cfg})
		defer tr.CloseIdleConnections()
		return roundTripConn(t, tr, core.URL+"/file/x")
	}

	resp, conn, err := get(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("GET %s/file/x with Core's CA: %v", core.URL, err)
	}
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.Proto != "HTTP/1.1" {
		t.Errorf("GET %s/file/x with Core's CA = %d over %s, TLS %v; want 200 over HTTP/1.1 and TLS", core.URL, resp.StatusCode, resp.Proto, resp.TLS != nil)
	}
	if _, ok := conn.(*tls.Conn); !ok || coreConnOf(conn) == nil {
		t.Errorf("connection to Core = %T, coreConnOf = %v; want a *tls.Conn over a *coreConn", conn, coreConnOf(conn))
	}

	// Without Core's CA: the system's roots do not know httptest's certificate.
	if _, _, err := get(nil); err == nil {
		t.Errorf("GET %s/file/x without Core's CA: no error, want a certificate verification error", core.URL)
	}
}

// roundTripConn GETs u through tr and returns the answer, its body read and closed,
// and the connection it came on.
func roundTripConn(t testing.TB, tr http.RoundTripper, u string) (*http.Response, net.Conn, error) {
	t.Helper()
	var conn net.Conn
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { conn = info.Conn },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	return resp, conn, err
}
