package sidecar

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdproxy/mdproxy/internal/testkit/sidecartest"
)

func TestLoadConfigTLSValid(t *testing.T) {
	ca := sidecartest.NewCA(t, "test CA")
	server := ca.Issue(t, "mdproxy", "127.0.0.1")
	client := ca.Issue(t, "mdproxy-client")
	for _, tc := range []struct {
		name                 string
		env                  map[string]string
		server, upstream     bool // TLS to clients, to Core
		roots, cert, sniName bool // the upstream's CA, client certificate, server name
	}{
		{name: "defaults"},
		{name: "empty is unset", env: map[string]string{
			"MDPROXY_TLS_CERT_FILE": "", "MDPROXY_TLS_KEY_FILE": "", "MDPROXY_UPSTREAM_CA_FILE": "",
			"MDPROXY_UPSTREAM_CERT_FILE": "", "MDPROXY_UPSTREAM_KEY_FILE": "", "MDPROXY_UPSTREAM_SERVER_NAME": "",
		}},
		{name: "https upstream, system roots", env: map[string]string{"MDPROXY_UPSTREAM_URL": "https://core.example"}, upstream: true},
		{name: "TLS to clients", env: map[string]string{
			"MDPROXY_TLS_CERT_FILE": server.CertFile, "MDPROXY_TLS_KEY_FILE": server.KeyFile,
		}, server: true},
		{name: "everything", env: map[string]string{
			"MDPROXY_TLS_CERT_FILE": server.CertFile, "MDPROXY_TLS_KEY_FILE": server.KeyFile,
			"MDPROXY_UPSTREAM_URL": "https://127.0.0.1:8443", "MDPROXY_UPSTREAM_CA_FILE": ca.File,
			"MDPROXY_UPSTREAM_CERT_FILE": client.CertFile, "MDPROXY_UPSTREAM_KEY_FILE": client.KeyFile,
			"MDPROXY_UPSTREAM_SERVER_NAME": "core.internal",
		}, server: true, upstream: true, roots: true, cert: true, sniName: true},
		{name: "IP address as server name", env: map[string]string{
			"MDPROXY_UPSTREAM_URL": "https://core.example", "MDPROXY_UPSTREAM_SERVER_NAME": "::1",
		}, upstream: true, sniName: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(tc.env)
			if err != nil {
				t.Fatalf("LoadConfig(%v) error = %v, want nil", tc.env, err)
			}
			got := c.tlsLoaded
			if (got.server != nil) != tc.server {
				t.Errorf("LoadConfig(%v): TLS to clients %v, want %v", tc.env, got.server != nil, tc.server)
			}
			if got.server != nil {
				if s := got.server.certificate().Leaf.SerialNumber; s.Cmp(server.Cert.SerialNumber) != 0 {
					t.Errorf("LoadConfig(%v): certificate served has serial %v, want %v", tc.env, s, server.Cert.SerialNumber)
				}
			}
			up := got.upstream
			if (up != nil) != tc.upstream {
				t.Fatalf("LoadConfig(%v): TLS to Core %v, want %v", tc.env, up != nil, tc.upstream)
			}
			if up == nil {
				return
			}
			if up.MinVersion != tls.VersionTLS12 {
				t.Errorf("LoadConfig(%v): upstream MinVersion = %#x, want TLS 1.2", tc.env, up.MinVersion)
			}
			if (up.RootCAs != nil) != tc.roots || (up.GetClientCertificate != nil) != tc.cert || (up.ServerName != "") != tc.sniName {
				t.Errorf("LoadConfig(%v): upstream roots %v, client certificate %v, server name %q; want %v, %v, set %v",
					tc.env, up.RootCAs != nil, up.GetClientCertificate != nil, up.ServerName, tc.roots, tc.cert, tc.sniName)
			}
			if tc.cert {
				cert, err := up.GetClientCertificate(&tls.CertificateRequestInfo{})
				if err != nil || cert.Leaf.Subject.CommonName != "mdproxy-client" {
					t.Errorf("LoadConfig(%v): client certificate = %v, %v; want mdproxy-client's", tc.env, cert, err)
				}
			}
		})
	}
}

func TestLoadConfigTLSBad(t *testing.T) {
	ca := sidecartest.NewCA(t, "test CA")
	server := ca.Issue(t, "mdproxy", "127.0.0.1")
	other := ca.Issue(t, "other")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	const https = "https://127.0.0.1:8443"
	type badCase struct {
		env     map[string]string
		wantVar string
	}
	cases := []badCase{
		// Half a pair names the half missing (and the other).
		{map[string]string{"MDPROXY_TLS_CERT_FILE": server.CertFile}, "MDPROXY_TLS_KEY_FILE"},
		{map[string]string{"MDPROXY_TLS_KEY_FILE": server.KeyFile}, "MDPROXY_TLS_CERT_FILE"},
		{map[string]string{"MDPROXY_TLS_CERT_FILE": missing, "MDPROXY_TLS_KEY_FILE": server.KeyFile}, "MDPROXY_TLS_CERT_FILE"},
		{map[string]string{"MDPROXY_TLS_CERT_FILE": server.CertFile, "MDPROXY_TLS_KEY_FILE": missing}, "MDPROXY_TLS_KEY_FILE"},
		// A key where the certificate should be; a key that is not the certificate's.
		{map[string]string{"MDPROXY_TLS_CERT_FILE": server.KeyFile, "MDPROXY_TLS_KEY_FILE": server.KeyFile}, "MDPROXY_TLS_CERT_FILE"},
		{map[string]string{"MDPROXY_TLS_CERT_FILE": server.CertFile, "MDPROXY_TLS_KEY_FILE": other.KeyFile}, "MDPROXY_TLS_KEY_FILE"},
		{map[string]string{"MDPROXY_TLS_CERT_FILE": server.CertFile, "MDPROXY_TLS_KEY_FILE": server.CertFile}, "MDPROXY_TLS_KEY_FILE"},

		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_CA_FILE": missing}, "MDPROXY_UPSTREAM_CA_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_CA_FILE": server.KeyFile}, "MDPROXY_UPSTREAM_CA_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_CERT_FILE": other.CertFile}, "MDPROXY_UPSTREAM_KEY_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_KEY_FILE": other.KeyFile}, "MDPROXY_UPSTREAM_CERT_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_CERT_FILE": missing, "MDPROXY_UPSTREAM_KEY_FILE": other.KeyFile}, "MDPROXY_UPSTREAM_CERT_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_CERT_FILE": other.CertFile, "MDPROXY_UPSTREAM_KEY_FILE": server.KeyFile}, "MDPROXY_UPSTREAM_KEY_FILE"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_SERVER_NAME": "core.internal:8443"}, "MDPROXY_UPSTREAM_SERVER_NAME"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_SERVER_NAME": "https://core.internal"}, "MDPROXY_UPSTREAM_SERVER_NAME"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_SERVER_NAME": "core internal"}, "MDPROXY_UPSTREAM_SERVER_NAME"},
		{map[string]string{"MDPROXY_UPSTREAM_URL": https, "MDPROXY_UPSTREAM_SERVER_NAME": "..."}, "MDPROXY_UPSTREAM_SERVER_NAME"},
	}
	// The options towards Core with an http upstream (the default): an error, not a
	// warning, even when the file is good.
	for name, value := range map[string]string{
		"MDPROXY_UPSTREAM_CA_FILE": ca.File, "MDPROXY_UPSTREAM_CERT_FILE": other.CertFile,
		"MDPROXY_UPSTREAM_KEY_FILE": other.KeyFile, "MDPROXY_UPSTREAM_SERVER_NAME": "core.internal",
	} {
		cases = append(cases, badCase{map[string]string{name: value}, name})
	}
	for _, tc := range cases {
		value := tc.env[tc.wantVar]
		t.Run(fmt.Sprintf("%s=%q", tc.wantVar, filepath.Base(value)), func(t *testing.T) {
			_, err := LoadConfig(tc.env)
			if !errors.As(err, new(*ConfigError)) {
				t.Fatalf("LoadConfig(%v) error = %v (%T), want a *ConfigError (exit 2)", tc.env, err, err)
			}
			msg := err.Error()
			if !sidecartest.NamesVar(msg, tc.wantVar) || !strings.Contains(msg, strconv.Quote(value)) || !strings.Contains(msg, "want") {
				t.Errorf("LoadConfig(%v) error = %q, want it to name %s, quote %q and say what it accepts", tc.env, msg, tc.wantVar, value)
			}
		})
	}

	// Several bad settings are reported together.
	env := map[string]string{"MDPROXY_TLS_CERT_FILE": missing, "MDPROXY_TLS_KEY_FILE": server.KeyFile,
		"MDPROXY_UPSTREAM_SERVER_NAME": "core.internal"}
	_, err := LoadConfig(env)
	for _, name := range []string{"MDPROXY_TLS_CERT_FILE", "MDPROXY_UPSTREAM_SERVER_NAME"} {
		if err == nil || !sidecartest.NamesVar(err.Error(), name) {
			t.Errorf("LoadConfig(%v) error = %v, want it to name %s", env, err, name)
		}
	}
}

// serial returns the serial number of the leaf of c.
func serial(c *tls.Certificate) *big.Int { return c.Leaf.SerialNumber }

func TestCertReloader(t *testing.T) {
	ca := sidecartest.NewCA(t, "test CA")
	first := ca.Issue(t, "first", "127.0.0.1")
	r, err := newCertReloader(first.CertFile, first.KeyFile, "TLS_CERT_FILE", "TLS_KEY_FILE")
	if err != nil {
		t.Fatalf("newCertReloader(good pair) error = %v, want nil", err)
	}
	const interval = 5 * time.Second
	now := time.Now() // the test certificates are valid from an hour ago for a day
	r.now = func() time.Time { return now }
	r.interval = interval
	r.next.Store(now.Add(interval).UnixNano())
	var logs sidecartest.LogBuffer
	r.log = slog.New(slog.NewJSONHandler(&logs, nil))

	want := func(step string, c *sidecartest.Leaf) {
		t.Helper()
		if got := serial(r.certificate()); got.Cmp(c.Cert.SerialNumber) != 0 {
			t.Errorf("%s: certificate() serial %v, want %v (%s)", step, got, c.Cert.SerialNumber, c.Cert.Subject.CommonName)
		}
	}
	want("start", first)

	second := ca.Issue(t, "second", "127.0.0.1")
	second.WriteTo(t, first.CertFile, first.KeyFile)
	now = now.Add(interval - time.Millisecond)
	want("renewed, before the interval is over", first)
	now = now.Add(time.Millisecond)
	want("renewed, at the first check", first)
	now = now.Add(interval)
	want("renewed, at the second check that read it alike", second)
	if !strings.Contains(logs.String(), `"msg":"certificate renewal loaded"`) {
		t.Errorf("logs after a renewal = %q, want a %q line", logs.String(), "certificate renewal loaded")
	}

	// A chain written in place in parts, its leaf (whose key is in place) first: the
	// leaf alone is never served, nor logged; the whole chain is, once it settled.
	chained := ca.Issue(t, "chained", "127.0.0.1")
	caPEM, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	sidecartest.WriteFile(t, first.KeyFile, chained.KeyPEM)
	sidecartest.WriteFile(t, first.CertFile, chained.CertPEM) // the intermediates yet to come
	now = now.Add(interval)
	want("the leaf of a chain, at the first check", second)
	sidecartest.WriteFile(t, first.CertFile, append(append([]byte{}, chained.CertPEM...), caPEM...))
	now = now.Add(interval)
	want("the whole chain, at its first check", second)
	now = now.Add(interval)
	want("the whole chain, once settled", chained)
	if n := len(r.certificate().Certificate); n != 2 {
		t.Errorf("the whole chain, once settled: %d certificates served, want 2 (the leaf and its CA)", n)
	}
	if strings.Contains(logs.String(), "certificate renewal rejected") {
		t.Errorf("logs = %s, want no renewal rejected for files written in parts", logs.String())
	}
	second = chained // the certificate held from here on

	// Bad renewals keep the certificate, each logged once.
	other := ca.Issue(t, "other")
	for _, bad := range []struct {
		name, wantVar   string
		certPEM, keyPEM []byte
	}{
		{"key not PEM", "MDPROXY_TLS_KEY_FILE", second.CertPEM, []byte("not a key")},
		{"key of another certificate", "MDPROXY_TLS_KEY_FILE", second.CertPEM, other.KeyPEM},
		{"certificate not PEM", "MDPROXY_TLS_CERT_FILE", []byte("garbage"), second.KeyPEM},
	} {
		sidecartest.WriteFile(t, first.CertFile, bad.certPEM)
		sidecartest.WriteFile(t, first.KeyFile, bad.keyPEM)
		before := strings.Count(logs.String(), "certificate renewal rejected")
		for range 3 { // seen, settled and rejected, rejected again
			now = now.Add(interval)
			want(bad.name, second)
		}
		lines := sidecartest.CheckJSONLogs(t, logs.String())
		if n := strings.Count(logs.String(), "certificate renewal rejected") - before; n != 1 {
			t.Errorf("%s: %d lines %q, want 1 (logged once)", bad.name, n, "certificate renewal rejected")
		} else if l := lines[len(lines)-1]; l["variable"] != bad.wantVar || l["level"] != "WARN" {
			t.Errorf("%s: log line %v, want level WARN, variable %s", bad.name, l, bad.wantVar)
		}
	}

	// A renewal outside its validity period, while the one held is within it: kept,
	// logged once naming the certificate's variable.
	for _, c := range []*sidecartest.Leaf{
		ca.IssueValid(t, "expired", now.Add(-48*time.Hour), now.Add(-24*time.Hour), "127.0.0.1"),
		ca.IssueValid(t, "not yet", now.Add(time.Hour), now.Add(48*time.Hour), "127.0.0.1"),
	} {
		c.WriteTo(t, first.CertFile, first.KeyFile)
		before := strings.Count(logs.String(), "certificate renewal rejected")
		for range 3 {
			now = now.Add(interval)
			want(c.Cert.Subject.CommonName+" renewal", second)
		}
		if n := strings.Count(logs.String(), "certificate renewal rejected") - before; n != 1 || !strings.Contains(logs.String(), "within its validity period") {
			t.Errorf("%s renewal: %d %q lines, want 1 saying why", c.Cert.Subject.CommonName, n, "certificate renewal rejected")
		}
	}

	// A renewal that loads again after bad ones.
	third := ca.Issue(t, "third", "127.0.0.1")
	third.WriteTo(t, first.CertFile, first.KeyFile)
	now = now.Add(interval)
	want("good renewal after bad ones, at its first check", second)
	now = now.Add(interval)
	want("good renewal after bad ones, settled", third)
	if strings.Contains(logs.String(), "outside its validity period") {
		t.Errorf("logs = %s, want no warning of a certificate in use out of date", logs.String())
	}

	// Once the one held expires, a warning; an expired renewal then loads (no worse),
	// with the warning again.
	now = third.Cert.NotAfter.Add(time.Minute)
	r.warnOutOfDate(r.log)
	expired := ca.IssueValid(t, "expired too", now.Add(-48*time.Hour), now.Add(-time.Hour), "127.0.0.1")
	expired.WriteTo(t, first.CertFile, first.KeyFile)
	now = now.Add(interval)
	want("expired renewal of an expired certificate, at its first check", third)
	now = now.Add(interval)
	want("expired renewal of an expired certificate, settled", expired)
	if n := strings.Count(logs.String(), "the certificate in use is outside its validity period"); n != 2 {
		t.Errorf("%d warnings of a certificate in use out of date, want 2: %s", n, logs.String())
	}

	// The clock stepped back an hour: the checks go on, rather than wait until the clock
	// is back where it was; stepped forward, they go on too.
	fourth := ca.Issue(t, "fourth", "127.0.0.1")
	fourth.WriteTo(t, first.CertFile, first.KeyFile)
	now = now.Add(-time.Hour)
	want("renewal after the clock stepped back an hour, at its first check", expired)
	now = now.Add(interval)
	want("renewal after the clock stepped back an hour, settled", fourth)
	fifth := ca.Issue(t, "fifth", "127.0.0.1")
	fifth.WriteTo(t, first.CertFile, first.KeyFile)
	now = now.Add(interval - time.Millisecond)
	want("renewed, before the interval after the last check is over", fourth)
	now = now.Add(time.Hour)
	want("renewal after the clock stepped forward an hour, at its first check", fourth)
	now = now.Add(interval)
	want("renewal after the clock stepped forward an hour, settled", fifth)
}

// tlsUpstream is a stand-in for Core behind HTTPS, with a certificate for core.internal
// only, which requires a client certificate of its CA. It records the client
// certificate's common name and the server name (SNI) of each connection.
type tlsUpstream struct {
	*httptest.Server
	mu        sync.Mutex
	clientCNs []string
	snis      []string
}

func newTLSUpstream(t *testing.T, ca *sidecartest.CA) *tlsUpstream {
	t.Helper()
	u := &tlsUpstream{}
	cert := ca.Issue(t, "core", "core.internal")
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.clientCNs = append(u.clientCNs, r.TLS.PeerCertificates[0].Subject.CommonName)
		u.mu.Unlock()
		_, _ = io.WriteString(w, "upstream "+r.URL.Path+"\n")
	}))
	u.TLS = &tls.Config{
		Certificates: []tls.Certificate{cert.TLS},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			u.mu.Lock()
			u.snis = append(u.snis, hello.ServerName)
			u.mu.Unlock()
			return nil, nil
		},
	}
	u.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshakes are expected
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func TestRunTLSToUpstream(t *testing.T) {
	t.Parallel()
	ca := sidecartest.NewCA(t, "test CA")
	otherCA := sidecartest.NewCA(t, "other CA")
	client := ca.Issue(t, "mdproxy-client")
	up := newTLSUpstream(t, ca)
	good := map[string]string{
		"MDPROXY_UPSTREAM_CA_FILE":     ca.File,
		"MDPROXY_UPSTREAM_CERT_FILE":   client.CertFile,
		"MDPROXY_UPSTREAM_KEY_FILE":    client.KeyFile,
		"MDPROXY_UPSTREAM_SERVER_NAME": "core.internal",
	}
	with := func(k, v string) map[string]string {
		env := map[string]string{}
		for key, val := range good {
			env[key] = val
		}
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
		return env
	}
	noClientCert := with("MDPROXY_UPSTREAM_CERT_FILE", "")
	delete(noClientCert, "MDPROXY_UPSTREAM_KEY_FILE")

	for _, tc := range []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"private CA, client certificate, server name", good, true},
		{"no client certificate", noClientCert, false},
		{"wrong CA", with("MDPROXY_UPSTREAM_CA_FILE", otherCA.File), false},
		{"system roots", with("MDPROXY_UPSTREAM_CA_FILE", ""), false},
		{"wrong server name", with("MDPROXY_UPSTREAM_SERVER_NAME", "other.internal"), false},
		{"no server name: the URL's 127.0.0.1 is not in Core's certificate", with("MDPROXY_UPSTREAM_SERVER_NAME", ""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := startRun(t, up.URL, tc.env)
			c := sidecartest.NewClient(t)
			code, body := sidecartest.Get(t, c, in.proxyURL+"/file/x")
			_, page := sidecartest.Get(t, c, in.adminURL+"/metrics")
			var upstreamErrors float64
			for _, kind := range []string{"refused", "reset", "timeout", "canceled", "other"} {
				v, _ := sidecartest.ParseMetrics(t, page).Value(`mdproxy_upstream_errors_total{kind="` + kind + `",route="file_result"}`)
				upstreamErrors += v
			}
			if err := in.stop(t); err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
			lines := sidecartest.CheckJSONLogs(t, in.logs.String())
			if tc.ok {
				if code != http.StatusOK || body != "upstream /file/x\n" {
					t.Errorf("GET proxy /file/x = %d %q, want 200 from Core over mutual TLS", code, sidecartest.Short(body))
				}
				up.mu.Lock()
				cns, snis := append([]string{}, up.clientCNs...), append([]string{}, up.snis...)
				up.mu.Unlock()
				if len(cns) == 0 || cns[len(cns)-1] != "mdproxy-client" {
					t.Errorf("Core saw client certificates %q, want mdproxy-client's", cns)
				}
				if len(snis) == 0 || snis[len(snis)-1] != "core.internal" {
					t.Errorf("Core saw server names %q, want core.internal", snis)
				}
				if upstreamErrors != 0 {
					t.Errorf("mdproxy_upstream_errors_total{route=file_result} = %v, want 0", upstreamErrors)
				}
				return
			}
			if code != http.StatusBadGateway || !strings.Contains(body, `{"err":"Core could not be reached: TLS handshake failed`) {
				t.Errorf("GET proxy /file/x = %d %q, want 502 with Core's error format saying the TLS handshake failed", code, sidecartest.Short(body))
			}
			if upstreamErrors != 1 {
				t.Errorf("mdproxy_upstream_errors_total{route=file_result} summed over kinds = %v, want 1", upstreamErrors)
			}
			if l := findLog(lines, "upstream error"); l == nil || !strings.Contains(fmt.Sprint(l["err"]), "tls") && !strings.Contains(fmt.Sprint(l["err"]), "certificate") {
				t.Errorf("logs = %s, want an %q line saying what TLS refused", in.logs, "upstream error")
			}
		})
	}
}

// TestRunTLSToClients is not parallel: it shortens certCheckInterval, which every
// LoadConfig reads, so that a renewal shows at the next connection.
func TestRunTLSToClients(t *testing.T) {
	saved := certCheckInterval
	certCheckInterval = 0
	t.Cleanup(func() { certCheckInterval = saved })

	ca := sidecartest.NewCA(t, "test CA")
	first := ca.Issue(t, "mdproxy", "127.0.0.1")
	up := sidecartest.NewUpstream(t)
	in := startRun(t, up.URL, map[string]string{
		"MDPROXY_TLS_CERT_FILE": first.CertFile, "MDPROXY_TLS_KEY_FILE": first.KeyFile,
	})
	url := "https://" + in.proxyAddr + "/file/x"
	c := sidecartest.NewTLSClient(t, ca.Pool())

	// served returns the serial number of the certificate a new connection is served.
	served := func(step string) *big.Int {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("%s: GET %s: %v", step, url, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != "upstream /file/x\n" {
			t.Errorf("%s: GET %s = %d %q, %v; want 200 from the upstream", step, url, resp.StatusCode, sidecartest.Short(string(body)), err)
		}
		if resp.Proto != "HTTP/1.1" || resp.TLS.Version < tls.VersionTLS12 || resp.TLS.NegotiatedProtocol != "http/1.1" {
			t.Errorf("%s: GET %s over %s, TLS %#x, ALPN %q; want HTTP/1.1 over TLS 1.2 or later", step, url, resp.Proto, resp.TLS.Version, resp.TLS.NegotiatedProtocol)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber
	}
	if got := served("start"); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Errorf("start: certificate served has serial %v, want %v", got, first.Cert.SerialNumber)
	}

	// Plain HTTP on the TLS port is answered 400 by net/http, never forwarded.
	before := len(up.Requests())
	if code, _ := sidecartest.Get(t, sidecartest.NewClient(t), "http://"+in.proxyAddr+"/file/y"); code != http.StatusBadRequest {
		t.Errorf("plain HTTP GET to the TLS port = %d, want 400", code)
	}
	// TLS 1.1 and a client that does not trust the CA are refused.
	old := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}}
	defer old.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: old}).Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("GET %s over TLS 1.1 = %d, want a handshake error", url, resp.StatusCode)
	}
	if resp, err := sidecartest.NewTLSClient(t, sidecartest.NewCA(t, "other CA").Pool()).Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("GET %s trusting another CA = %d, want a verification error", url, resp.StatusCode)
	}
	if after := up.Requests(); len(after) != before {
		t.Errorf("upstream saw %q, want nothing new after %d requests", after, before)
	}

	// A renewal (both files rewritten) is served from the second connection on: the
	// first finds it, the second finds it alike (settled).
	second := ca.Issue(t, "mdproxy", "127.0.0.1")
	second.WriteTo(t, first.CertFile, first.KeyFile)
	if got := served("renewed, first check"); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Errorf("after a renewal, first check: certificate served has serial %v, want the one before %v", got, first.Cert.SerialNumber)
	}
	if got := served("renewed"); got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Errorf("after a renewal: certificate served has serial %v, want the renewed %v", got, second.Cert.SerialNumber)
	}
	// A bad renewal keeps it, and says why.
	sidecartest.WriteFile(t, first.KeyFile, []byte("not a key"))
	for _, step := range []string{"bad renewal, first check", "bad renewal"} {
		if got := served(step); got.Cmp(second.Cert.SerialNumber) != 0 {
			t.Errorf("after a %s: certificate served has serial %v, want the one before %v", step, got, second.Cert.SerialNumber)
		}
	}

	if err := in.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	lines := sidecartest.CheckJSONLogs(t, in.logs.String())
	if l := findLog(lines, "certificate renewal loaded"); l == nil || l["variable"] != "MDPROXY_TLS_CERT_FILE" {
		t.Errorf("logs = %s, want a %q line naming MDPROXY_TLS_CERT_FILE", in.logs, "certificate renewal loaded")
	}
	if l := findLog(lines, "certificate renewal rejected, the certificate served is kept"); l == nil || l["variable"] != "MDPROXY_TLS_KEY_FILE" {
		t.Errorf("logs = %s, want a renewal rejected line naming MDPROXY_TLS_KEY_FILE", in.logs)
	}
}

// TestRunTLSHandshakeLogNoAddress: a TLS client that resets its connection in the
// middle of its ClientHello is logged as a failed handshake whose reason names neither
// end of the connection (net/http's error for it reads "read tcp proxy->client: ...").
func TestRunTLSHandshakeLogNoAddress(t *testing.T) {
	ca := sidecartest.NewCA(t, "test CA")
	cert := ca.Issue(t, "mdproxy", "127.0.0.1")
	in := startRun(t, sidecartest.NewUpstream(t).URL, map[string]string{
		"MDPROXY_TLS_CERT_FILE": cert.CertFile, "MDPROXY_TLS_KEY_FILE": cert.KeyFile,
	})
	conn, err := net.Dial("tcp", in.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	client := conn.LocalAddr().String()
	// A handshake record announcing 512 bytes, of which a few come, then a reset:
	// whether the server has read those bytes yet or not, its read for the rest of
	// the handshake ends with the reset.
	if _, err := conn.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}); err != nil {
		t.Fatal(err)
	}
	_ = conn.(*net.TCPConn).SetLinger(0)
	conn.Close() // a reset
	deadline := time.Now().Add(safety)
	for !strings.Contains(in.logs.String(), "TLS handshake failed") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := in.stop(t); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	lines := sidecartest.CheckJSONLogs(t, in.logs.String())
	l := findLog(lines, "TLS handshake failed")
	if l == nil {
		t.Fatalf("logs = %s, want a %q line", in.logs, "TLS handshake failed")
	}
	if reason, _ := l["reason"].(string); !strings.Contains(reason, "reset") {
		t.Errorf("handshake line = %v, want its reason to say the connection was reset", l)
	}
	if strings.Contains(in.logs.String(), client) || strings.Contains(in.logs.String(), "->") {
		t.Errorf("logs = %s, want no line naming the client's address %s", in.logs, client)
	}
}
