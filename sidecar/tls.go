package sidecar

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdproxy/mdproxy/internal/envconf"
)

// certCheckInterval is how often, at most, a certificate's files are read again to
// see whether they were renewed: on the first handshake that needs the certificate
// once the interval is over, never in the background. Tests shorten it.
var certCheckInterval = 5 * time.Second

// tlsSettings is what validateTLS loaded from the TLS settings, for Run.
type tlsSettings struct {
	// server is the proxy listener's certificate; nil: plain HTTP.
	server *certReloader
	// upstream is the TLS configuration towards an https upstream; nil for http.
	upstream *tls.Config
	// client is the client certificate presented to Core; nil: none.
	client *certReloader
}

// validateTLS checks the TLS settings, MDPROXY_TLS_* to clients and
// MDPROXY_UPSTREAM_{CA,CERT,KEY}_FILE and MDPROXY_UPSTREAM_SERVER_NAME to Core, reads
// their files and keeps what it loaded in c.tlsLoaded. It returns one error a bad
// variable (each an *envconf.Error, wrapping the cause when a file could not be read
// or parsed), naming it and what it accepts; nil when all are good.
//
// A certificate and its key go together: one without the other is an error naming
// both. The options towards Core apply to an https upstream only; set with an http
// one they are an error, not a warning: an operator who sets a CA or a client
// certificate believes Core's connection is verified or authenticated, and it would
// be neither. When MDPROXY_UPSTREAM_URL itself is bad (c.upstream nil), the options
// are checked as for an https one.
func (c *Config) validateTLS(environ map[string]string) envconf.Errors {
	var errs envconf.Errors
	bad := func(name, want string, cause error) {
		errs.Add(pairErrorOf(environ, &pairError{name: name, want: want, cause: cause}))
	}
	c.tlsLoaded = tlsSettings{}

	// To clients.
	server, err := newCertReloader(c.TLSCertFile, c.TLSKeyFile, "TLS_CERT_FILE", "TLS_KEY_FILE")
	if err != nil {
		errs.Add(pairErrorOf(environ, err))
	}
	c.tlsLoaded.server = server

	// To Core.
	if c.upstream != nil && c.upstream.Scheme == "http" {
		for _, o := range []struct{ name, value string }{
			{"UPSTREAM_CA_FILE", c.UpstreamCAFile}, {"UPSTREAM_CERT_FILE", c.UpstreamCertFile},
			{"UPSTREAM_KEY_FILE", c.UpstreamKeyFile}, {"UPSTREAM_SERVER_NAME", c.UpstreamServerName},
		} {
			if o.value != "" {
				bad(o.name, "want it unset with an http:// MDPROXY_UPSTREAM_URL: it applies to an https:// one only", nil)
			}
		}
		return errs
	}
	up := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.UpstreamServerName}
	if c.UpstreamCAFile != "" {
		bundle, err := os.ReadFile(c.UpstreamCAFile)
		if err != nil {
			bad("UPSTREAM_CA_FILE", "want a readable PEM file of the CA certificates that Core's certificate is verified against", err)
		} else if up.RootCAs = x509.NewCertPool(); !up.RootCAs.AppendCertsFromPEM(bundle) {
			bad("UPSTREAM_CA_FILE", "want a PEM file of one or more CA certificates; it holds none", nil)
		}
	}
	client, err := newCertReloader(c.UpstreamCertFile, c.UpstreamKeyFile, "UPSTREAM_CERT_FILE", "UPSTREAM_KEY_FILE")
	if err != nil {
		errs.Add(pairErrorOf(environ, err))
	}
	if client != nil {
		up.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return client.certificate(), nil
		}
	}
	if n := c.UpstreamServerName; n != "" && !validServerName(n) {
		bad("UPSTREAM_SERVER_NAME", "want the host name (or IP address) that Core's certificate is issued for, without scheme or port, e.g. core.internal", nil)
	}
	if c.upstream != nil && c.upstream.Scheme == "https" {
		c.tlsLoaded.upstream = up
		c.tlsLoaded.client = client
	}
	return errs
}

// pairErrorOf returns err, a *pairError, as an *envconf.Error naming its variable and
// holding its value in environ, wrapping its cause.
func pairErrorOf(environ map[string]string, err error) error {
	var pe *pairError
	if !errors.As(err, &pe) {
		return err
	}
	e := envconf.Invalid(environ, EnvPrefix, pe.name, pe.want)
	if pe.cause != nil {
		return fmt.Errorf("%w: %w", e, pe.cause)
	}
	return e
}

// pairError is a bad certificate or key setting: the variable (without the prefix),
// what it accepts and the cause, if any.
type pairError struct {
	name, want string
	cause      error
}

func (e *pairError) Error() string {
	if e.cause != nil {
		return EnvPrefix + e.name + ": " + e.want + ": " + e.cause.Error()
	}
	return EnvPrefix + e.name + ": " + e.want
}

func (e *pairError) Unwrap() error { return e.cause }

// validServerName reports whether n is an IP address or a DNS name (letters, digits,
// '-', '_' and '.'), with no scheme, path or port.
func validServerName(n string) bool {
	if net.ParseIP(n) != nil {
		return true
	}
	for _, r := range n {
		if !(r == '-' || r == '_' || r == '.' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return false
		}
	}
	return strings.Trim(n, ".") != ""
}

// certReloader holds a certificate and its key read from two PEM files, and reads
// both again: at most once every interval, on the first call of certificate after it,
// never in the background (no goroutine to stop). A renewal is taken once it has
// settled, read alike at two checks in a row: files written in place, or one after the
// other, are not taken half-written (a chain cut after its leaf loads, and would be
// served without its intermediates). A settled renewal that does not load (unreadable,
// not PEM, a key that is not the certificate's) keeps the certificate held and is
// logged once. Kubernetes swaps a mounted Secret's files at once. It is safe for
// concurrent use once log is set.
type certReloader struct {
	certFile, keyFile string
	certVar, keyVar   string // the variables, without the prefix, for errors and logs
	interval          time.Duration
	now               func() time.Time
	// log receives a line per renewal loaded or rejected. Set before the first
	// handshake; nil discards.
	log *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	next atomic.Int64 // unix nanoseconds before which the files are not read again

	mu                sync.Mutex  // one check at a time; guards the fields below
	certPEM, keyPEM   []byte      // what cert was loaded from
	seen              certReading // the last check's reading, when it was not cert's
	failCert, failKey []byte      // the last renewal rejected, not logged again
	failErr           string
}

// newCertReloader loads the pair certFile and keyFile, named by the variables certVar
// and keyVar (without the prefix). It returns nil and no error when both are empty,
// and a *pairError naming the variable at fault when one is empty, a file cannot be
// read, or they do not load as a certificate and its key.
func newCertReloader(certFile, keyFile, certVar, keyVar string) (*certReloader, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case keyFile == "":
		return nil, &pairError{name: keyVar, want: "want the PEM private key of " + EnvPrefix + certVar + "'s certificate (set both or neither)"}
	case certFile == "":
		return nil, &pairError{name: certVar, want: "want the PEM certificate of " + EnvPrefix + keyVar + "'s key (set both or neither)"}
	}
	r := &certReloader{certFile: certFile, keyFile: keyFile, certVar: certVar, keyVar: keyVar,
		interval: certCheckInterval, now: time.Now}
	certPEM, keyPEM, err := r.read()
	if err != nil {
		return nil, err
	}
	cert, err := r.parse(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	r.certPEM, r.keyPEM = certPEM, keyPEM
	r.cert.Store(cert)
	r.next.Store(r.now().Add(r.interval).UnixNano())
	return r, nil
}

// read reads both files. Its error is a *pairError naming the variable of the file
// that could not be read.
func (r *certReloader) read() (certPEM, keyPEM []byte, err error) {
	if certPEM, err = os.ReadFile(r.certFile); err != nil {
		return nil, nil, &pairError{name: r.certVar, want: "want a readable PEM certificate file", cause: err}
	}
	if keyPEM, err = os.ReadFile(r.keyFile); err != nil {
		return nil, nil, &pairError{name: r.keyVar, want: "want a readable PEM private key file", cause: err}
	}
	return certPEM, keyPEM, nil
}

// parse returns the certificate of certPEM with its key keyPEM. Its error is a
// *pairError naming the variable at fault: the certificate's when its first block is
// not a certificate, else the key's (not a key, or not the certificate's).
func (r *certReloader) parse(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err == nil {
		return &c, nil
	}
	const wantCert = "want a PEM certificate (chain), leaf first"
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, &pairError{name: r.certVar, want: wantCert, cause: err}
	}
	if _, perr := x509.ParseCertificate(block.Bytes); perr != nil {
		return nil, &pairError{name: r.certVar, want: wantCert, cause: perr}
	}
	return nil, &pairError{name: r.keyVar, want: "want the PEM private key of " + EnvPrefix + r.certVar + "'s certificate", cause: err}
}

// due reports whether the files are to be checked at now: the check interval is over,
// or the clock stepped back since the last check (next is more than an interval
// ahead), which must not stop the checks until the clock catches up.
func (r *certReloader) due(now time.Time) bool {
	n, next := now.UnixNano(), r.next.Load()
	return n >= next || n < next-int64(r.interval)
}

// certificate returns the certificate to present, first loading a renewal when the
// check interval is over and the files changed.
func (r *certReloader) certificate() *tls.Certificate {
	if now := r.now(); r.due(now) && r.mu.TryLock() {
		// Another handshake checking meanwhile serves the certificate held.
		if r.due(now) {
			r.reload()
			r.next.Store(r.now().Add(r.interval).UnixNano())
		}
		r.mu.Unlock()
	}
	return r.cert.Load()
}

// certReading is one reading of both files: their content, or the error of reading
// them.
type certReading struct {
	certPEM, keyPEM []byte
	err             string
}

func (a certReading) same(b certReading) bool {
	return bytes.Equal(a.certPEM, b.certPEM) && bytes.Equal(a.keyPEM, b.keyPEM) && a.err == b.err
}

// reload loads the files when their content is neither what the certificate held
// came from nor the last renewal rejected, and the last check read them alike (they
// settled). r.mu is held.
func (r *certReloader) reload() {
	certPEM, keyPEM, err := r.read()
	now := certReading{certPEM: certPEM, keyPEM: keyPEM}
	if err != nil {
		now.err = err.Error()
	}
	if err == nil && bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM) {
		r.seen = certReading{}
		return
	}
	if !now.same(r.seen) {
		r.seen = now // taken at the next check if it reads alike then
		return
	}
	var cert *tls.Certificate
	if err == nil {
		cert, err = r.parse(certPEM, keyPEM)
	}
	at := r.now()
	if err == nil && outOfDate(cert, at) != "" && outOfDate(r.cert.Load(), at) == "" {
		// A step back: clients would refuse it where they take the one held.
		err = &pairError{name: r.certVar, want: "want a certificate within its validity period: it is " + outOfDate(cert, at)}
	}
	log := r.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err != nil {
		// Logged once a content and error: a check every few seconds must not repeat it.
		if bytes.Equal(certPEM, r.failCert) && bytes.Equal(keyPEM, r.failKey) && err.Error() == r.failErr {
			return
		}
		r.failCert, r.failKey, r.failErr = certPEM, keyPEM, err.Error()
		variable := ""
		var pe *pairError
		if errors.As(err, &pe) {
			variable = EnvPrefix + pe.name
		}
		log.Warn("certificate renewal rejected, the certificate served is kept", "variable", variable,
			"err", err.Error(), "not_after", r.cert.Load().Leaf.NotAfter)
		return
	}
	r.certPEM, r.keyPEM, r.seen = certPEM, keyPEM, certReading{}
	r.failCert, r.failKey, r.failErr = nil, nil, ""
	r.cert.Store(cert)
	log.Info("certificate renewal loaded", "variable", EnvPrefix+r.certVar, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter)
	r.warnOutOfDate(log)
}

// outOfDate says how c is outside its validity period at now ("expired since ...",
// "not valid before ..."), or "" when it is within it.
func outOfDate(c *tls.Certificate, now time.Time) string {
	switch {
	case now.After(c.Leaf.NotAfter):
		return "expired since " + c.Leaf.NotAfter.UTC().Format(time.RFC3339)
	case now.Before(c.Leaf.NotBefore):
		return "not valid before " + c.Leaf.NotBefore.UTC().Format(time.RFC3339)
	}
	return ""
}

// warnOutOfDate logs a warning when the certificate held is outside its validity
// period: at start, and when a renewal loads one because the one held was out of date
// too. Peers that verify it refuse it.
func (r *certReloader) warnOutOfDate(log *slog.Logger) {
	c := r.cert.Load()
	if why := outOfDate(c, r.now()); why != "" {
		log.Warn("the certificate in use is outside its validity period: peers that verify it refuse it",
			"variable", EnvPrefix+r.certVar, "subject", c.Leaf.Subject.String(), "why", why)
	}
}

// serverTLS returns the TLS configuration of the proxy listener, which serves the
// reloaded certificate r: TLS 1.2 or later, HTTP/1.1 only (the proxy's handling of
// bodies, 1xx answers and aborted answers is that of HTTP/1.1; HTTP/2 to clients is not
// offered).
func serverTLS(r *certReloader) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return r.certificate(), nil
		},
	}
}

// listenTLS makes srv serve TLS on l when the settings give the proxy listener a
// certificate, and returns the listener to serve: l wrapped in TLS, or l itself. The
// certificate's renewals are logged to log.
func (c *Config) listenTLS(l net.Listener, srv *http.Server, log *slog.Logger) net.Listener {
	r := c.tlsLoaded.server
	if r == nil {
		return l
	}
	r.log = log
	r.warnOutOfDate(log)
	srv.TLSConfig = serverTLS(r)
	// No HTTP/2: see serverTLS.
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	return tls.NewListener(l, srv.TLSConfig)
}

// upstreamTLS returns the TLS configuration towards Core (nil for an http upstream),
// its client certificate's renewals logged to log.
func (c *Config) upstreamTLS(log *slog.Logger) *tls.Config {
	if c.tlsLoaded.client != nil {
		c.tlsLoaded.client.log = log
		c.tlsLoaded.client.warnOutOfDate(log)
	}
	return c.tlsLoaded.upstream
}
