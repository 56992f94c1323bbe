package sidecartest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made up for one test: nothing of it is committed, its
// files live in the test's temporary directory.
type CA struct {
	Cert *x509.Certificate
	// File is the path of the CA's certificate in PEM, as MDPROXY_UPSTREAM_CA_FILE or a
	// client's roots read it.
	File string
	key  *ecdsa.PrivateKey
	dir  string
	n    int64 // serial numbers issued so far
}

// NewCA returns a new CA (ECDSA P-256, valid for a day) with its certificate written
// to a temporary directory.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("creating CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, dir: t.TempDir(), n: 1}
	ca.File = filepath.Join(ca.dir, "ca.pem")
	WriteFile(t, ca.File, pemBlock("CERTIFICATE", der))
	return ca
}

// Pool returns a pool holding only the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is a certificate issued by a CA, with its key, in memory and in PEM.
type Leaf struct {
	Cert              *x509.Certificate
	TLS               tls.Certificate
	CertPEM, KeyPEM   []byte
	CertFile, KeyFile string // written by Issue; rewritten by WriteTo
}

// Issue returns a certificate of the CA for commonName, valid for a day, for both
// server and client authentication, with hosts (IP addresses or DNS names) as its
// subject alternative names; its certificate and key are written in PEM to two files
// of the CA's directory.
func (ca *CA) Issue(t testing.TB, commonName string, hosts ...string) *Leaf {
	t.Helper()
	return ca.IssueValid(t, commonName, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour), hosts...)
}

// IssueValid is Issue with the validity period from notBefore to notAfter.
func (ca *CA) IssueValid(t testing.TB, commonName string, notBefore, notAfter time.Time, hosts ...string) *Leaf {
	t.Helper()
	key := newKey(t)
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("issuing %s: %v", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	l := &Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(ca.dir, commonName+"-"+cert.SerialNumber.String())
	l.WriteTo(t, base+".crt", base+".key")
	return l
}

// WriteTo writes the leaf's certificate and key to certFile and keyFile (replacing
// them, each in one rename, as a renewal does) and makes them the leaf's files.
func (l *Leaf) WriteTo(t testing.TB, certFile, keyFile string) {
	t.Helper()
	WriteFile(t, certFile, l.CertPEM)
	WriteFile(t, keyFile, l.KeyPEM)
	l.CertFile, l.KeyFile = certFile, keyFile
}

// WriteFile replaces the file at path with data in one rename, so that a reader never
// sees it half written.
func WriteFile(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// NewTLSClient returns a client of its own that trusts roots only, offers HTTP/2 and
// HTTP/1.1 (ALPN), opens a new connection for each request (so that each sees the
// certificate served at that moment), and never goes through an HTTP proxy of the
// environment; cleanup closes its connections.
func NewTLSClient(t testing.TB, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:    &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2:  true,
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
