// Package tlstest generates certificate authorities and certificates for
// tests, with crypto/x509, so that no key material is checked in.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a self-signed certificate authority.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// NewCA generates a CA valid from an hour ago for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Leaf is an issued certificate and its key, PEM-encoded.
type Leaf struct {
	Cert            *x509.Certificate
	CertPEM, KeyPEM []byte
}

// Spec describes a certificate to issue.
type Spec struct {
	// CommonName is the subject's CN.
	CommonName string
	// DNSNames and IPs are the subject alternative names; a server
	// certificate with neither is issued for localhost and 127.0.0.1.
	DNSNames []string
	IPs      []net.IP
	// Client issues a client certificate (else a server certificate).
	Client bool
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// Issue signs a certificate for spec.
func (ca *CA) Issue(t testing.TB, spec Spec) Leaf {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	if spec.NotBefore.IsZero() {
		spec.NotBefore = now.Add(-time.Hour)
	}
	if spec.NotAfter.IsZero() {
		spec.NotAfter = now.Add(24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: spec.CommonName},
		NotBefore: spec.NotBefore, NotAfter: spec.NotAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, DNSNames: spec.DNSNames, IPAddresses: spec.IPs,
	}
	if spec.Client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		if len(spec.DNSNames) == 0 && len(spec.IPs) == 0 {
			tmpl.DNSNames, tmpl.IPAddresses = []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Leaf{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}
}

// Server issues a server certificate for localhost and 127.0.0.1.
func (ca *CA) Server(t testing.TB, name string) Leaf {
	return ca.Issue(t, Spec{CommonName: name})
}

// Client issues a client certificate.
func (ca *CA) Client(t testing.TB, name string) Leaf {
	return ca.Issue(t, Spec{CommonName: name, Client: true})
}

// Write writes data to dir/name (mode 0600) and returns the path.
func Write(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Files are a certificate, its key and a CA bundle on disk.
type Files struct {
	Cert, Key, CA string
}

// WriteFiles writes leaf and ca as prefix.crt, prefix.key and prefix-ca.crt
// in dir, replacing what is there.
func WriteFiles(t testing.TB, dir, prefix string, leaf Leaf, ca *CA) Files {
	t.Helper()
	return Files{
		Cert: Write(t, dir, prefix+".crt", leaf.CertPEM),
		Key:  Write(t, dir, prefix+".key", leaf.KeyPEM),
		CA:   Write(t, dir, prefix+"-ca.crt", ca.PEM),
	}
}

// Rotate replaces the files the way Kubernetes' secret volumes (and so
// cert-manager) do: the new files go to a fresh directory and a symlink
// swap publishes them at once (dir/..data points at the generation; the
// first call also creates dir/name as a symlink to ..data/name).
func Rotate(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	gen, err := os.MkdirTemp(dir, "..gen-")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		Write(t, gen, name, data)
	}
	tmp := filepath.Join(dir, "..data_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(gen), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}
