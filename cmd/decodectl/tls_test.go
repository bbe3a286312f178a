package main

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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testPKI is a self-signed CA and the server and client certificates it
// signed, as PEM files in a temporary directory.
type testPKI struct {
	caFile               string
	serverCert           tls.Certificate
	clientCert, clientKy string
	pool                 *x509.CertPool
}

// newTestPKI generates the CA, a server certificate for 127.0.0.1 and
// decodeplane.test, and a client certificate.
func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	writePEM := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "decodectl test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{caFile: writePEM("ca.pem", "CERTIFICATE", caDER), pool: x509.NewCertPool()}
	p.pool.AddCert(ca)

	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) (certDER, keyDER []byte) {
		k := key()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der, kder
	}
	sDER, sKey := issue(2, "decodeplane", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")}, []string{"decodeplane.test"})
	p.serverCert, err = tls.LoadX509KeyPair(writePEM("server.pem", "CERTIFICATE", sDER), writePEM("server-key.pem", "EC PRIVATE KEY", sKey))
	if err != nil {
		t.Fatal(err)
	}
	cDER, cKey := issue(3, "operator", x509.ExtKeyUsageClientAuth, nil, nil)
	p.clientCert = writePEM("client.pem", "CERTIFICATE", cDER)
	p.clientKy = writePEM("client-key.pem", "EC PRIVATE KEY", cKey)
	return p
}

// serverOption serves TLS with the server certificate; with mutual it
// requires a client certificate signed by the CA.
func (p *testPKI) serverOption(mutual bool) grpc.ServerOption {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.serverCert}, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = p.pool
	}
	return grpc.Creds(credentials.NewTLS(cfg))
}

func TestTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	d := startDaemon(t, daemonConfig{serverOptions: []grpc.ServerOption{pki.serverOption(false)}})
	for _, tt := range []struct {
		name    string
		environ []string
		args    []string
		ok      bool
	}{
		{"CA flag", nil, []string{"--tls-ca", pki.caFile}, true},
		{"CA env", []string{"DECODEPLANE_TLS_CA=" + pki.caFile}, nil, true},
		{"server name", nil, []string{"--tls-ca", pki.caFile, "--tls-server-name", "decodeplane.test"}, true},
		{"server name env", []string{"DECODEPLANE_TLS_CA=" + pki.caFile, "DECODEPLANE_TLS_SERVER_NAME=decodeplane.test"}, []string{"--tls"}, true},
		{"wrong server name", nil, []string{"--tls-ca", pki.caFile, "--tls-server-name", "other.test"}, false},
		{"plaintext", nil, nil, false},
		{"system roots", nil, []string{"--tls"}, false},
		// An explicit --tls=false wins over the environment's TLS settings.
		{"plaintext over env", []string{"DECODEPLANE_TLS_CA=" + pki.caFile}, []string{"--tls=false"}, false},
	} {
		args := append([]string{"status", "--addr", d.addr, "--timeout", "5s"}, tt.args...)
		r := decodectl(tt.environ, args...)
		switch {
		case tt.ok && (r.code != exitOK || !strings.Contains(r.stdout, "Ready:          yes (serving)")):
			t.Errorf("%s: %v", tt.name, r)
		case !tt.ok && (r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: status: Unavailable: ")):
			t.Errorf("%s: %v; want exit 1 with Unavailable", tt.name, r)
		}
	}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	d := startDaemon(t, daemonConfig{serverOptions: []grpc.ServerOption{pki.serverOption(true)}})
	for _, tt := range []struct {
		name    string
		environ []string
		args    []string
		ok      bool
	}{
		{"client certificate", nil, []string{"--tls-ca", pki.caFile, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKy}, true},
		{"client certificate env", []string{"DECODEPLANE_TLS_CA=" + pki.caFile, "DECODEPLANE_TLS_CERT=" + pki.clientCert, "DECODEPLANE_TLS_KEY=" + pki.clientKy}, nil, true},
		{"no client certificate", nil, []string{"--tls-ca", pki.caFile}, false},
	} {
		args := append([]string{"rooms", "--addr", d.addr, "--timeout", "5s"}, tt.args...)
		r := decodectl(tt.environ, args...)
		switch {
		case tt.ok && (r.code != exitOK || r.stdout != "No rooms.\n"):
			t.Errorf("%s: %v", tt.name, r)
		case !tt.ok && (r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: rooms: Unavailable: ")):
			t.Errorf("%s: %v; want exit 1 with Unavailable", tt.name, r)
		}
	}
	// A key that does not match the certificate is the operator's mistake.
	r := decodectl(nil, "status", "--addr", d.addr, "--tls-ca", pki.caFile, "--tls-cert", pki.clientCert, "--tls-key", pki.caFile)
	if r.code != exitUsage || !strings.Contains(r.stderr, "decodectl: --tls-cert/--tls-key: ") {
		t.Errorf("mismatched key: %v", r)
	}
}
