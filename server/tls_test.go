package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// startTLS serves the real server (New, Admin and health) with cfg.TLS on a
// TCP loopback port and returns its address and TLS.
func startTLS(t *testing.T, cfg Config) (string, *ServerTLS) {
	t.Helper()
	st, err := NewServerTLS(cfg.TLS, TLSOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Deps{Logger: slog.New(slog.DiscardHandler), Version: "v-tls", Layout: kvlayout.DefaultConfig().Layout(),
		TransferPath: "sim", ExtraServerOptions: []grpc.ServerOption{st.Option}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := s.Shutdown(ctx, nil); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String(), st
}

// getStatus calls Admin.GetStatus on a new connection; it returns the common
// name of the server's certificate.
func getStatus(t *testing.T, addr string, creds credentials.TransportCredentials) (string, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	var p peer.Peer
	resp, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{}, grpc.Peer(&p))
	if err != nil {
		return "", err
	}
	if resp.GetVersion() != "v-tls" {
		t.Errorf("GetStatus version %q", resp.GetVersion())
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		t.Fatalf("answered without TLS (%T)", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0].Subject.CommonName, nil
}

func tlsClient(ca *tlstest.CA, leaf *tlstest.Leaf) credentials.TransportCredentials {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	if leaf != nil {
		pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
		if err != nil {
			panic(err)
		}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return credentials.NewTLS(c)
}

func refused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted", what)
	} else if status.Code(err) != codes.Unavailable {
		t.Errorf("%s: %v, want Unavailable", what, err)
	}
}

// TestServerTLSListener: the daemon's server with server.tls (mutual TLS)
// over a real TCP socket refuses plaintext, a client that does not trust its
// CA, a client without a certificate and one from another CA; it serves a
// valid client, and after the files rotate new connections get the new
// certificate.
func TestServerTLSListener(t *testing.T) {
	dir := t.TempDir()
	ca, other := tlstest.NewCA(t, "decodeplane CA"), tlstest.NewCA(t, "other CA")
	f := tlstest.WriteFiles(t, dir, "daemon", ca.Server(t, "daemon-gen1"), ca)
	cfg := DefaultConfig()
	cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.ClientCAFile = f.Cert, f.Key, f.CA
	addr, st := startTLS(t, cfg)
	good, stranger := ca.Client(t, "prefill-1"), other.Client(t, "stranger")

	_, err := getStatus(t, addr, insecure.NewCredentials())
	refused(t, "plaintext", err)
	_, err = getStatus(t, addr, tlsClient(other, &good))
	refused(t, "a client trusting another CA", err)
	_, err = getStatus(t, addr, tlsClient(ca, nil))
	refused(t, "no client certificate", err)
	_, err = getStatus(t, addr, tlsClient(ca, &stranger))
	refused(t, "a client certificate of another CA", err)
	cn, err := getStatus(t, addr, tlsClient(ca, &good))
	if err != nil || cn != "daemon-gen1" {
		t.Fatalf("valid client: %q, %v", cn, err)
	}

	tlstest.WriteFiles(t, dir, "daemon", ca.Server(t, "daemon-gen2"), ca)
	if changed, err := st.Reloader.Reload(); !changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	if cn, err := getStatus(t, addr, tlsClient(ca, &good)); err != nil || cn != "daemon-gen2" {
		t.Fatalf("after rotation: %q, %v", cn, err)
	}
}

func TestServerTLSOptionalClientCert(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "decodeplane CA")
	f := tlstest.WriteFiles(t, dir, "daemon", ca.Server(t, "daemon"), ca)
	cfg := DefaultConfig()
	cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.ClientCAFile, cfg.TLS.RequireClientCert = f.Cert, f.Key, f.CA, false
	addr, _ := startTLS(t, cfg)
	if _, err := getStatus(t, addr, tlsClient(ca, nil)); err != nil {
		t.Errorf("require_client_cert false, no certificate: %v", err)
	}
	stranger := tlstest.NewCA(t, "other").Client(t, "stranger")
	_, err := getStatus(t, addr, tlsClient(ca, &stranger))
	refused(t, "a certificate of another CA, even when optional", err)
}

func TestTLSConfigValidate(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	f := tlstest.WriteFiles(t, dir, "x", ca.Server(t, "x"), ca)
	garbage := tlstest.Write(t, dir, "garbage", []byte("garbage"))
	keys := func(err error) []string {
		var out []string
		for _, e := range flattenErr(err) {
			var ce *kvlayout.ConfigError
			if !errors.As(e, &ce) {
				t.Fatalf("%v is not a ConfigError", e)
			}
			if ce.Problem == "" || ce.Fix == "" {
				t.Errorf("%s: problem %q fix %q", ce.Key, ce.Problem, ce.Fix)
			}
			out = append(out, ce.Key)
		}
		return out
	}
	tests := []struct {
		name string
		mod  func(*Config)
		want []string
	}{
		{"defaults", func(*Config) {}, nil},
		{"tls", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile = f.Cert, f.Key }, nil},
		{"mtls", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientCAFile = f.Cert, f.Key, f.CA }, nil},
		{"key without cert", func(c *Config) { c.TLS.KeyFile = f.Key }, []string{"server.tls.cert_file"}},
		{"cert without key", func(c *Config) { c.TLS.CertFile = f.Cert }, []string{"server.tls.key_file"}},
		{"client CA without cert", func(c *Config) { c.TLS.ClientCAFile = f.CA }, []string{"server.tls.client_ca_file"}},
		{"every file bad", func(c *Config) { c.TLS.CertFile, c.TLS.KeyFile, c.TLS.ClientCAFile = garbage, garbage, garbage },
			[]string{"server.tls.cert_file", "server.tls.key_file", "server.tls.client_ca_file"}},
		{"reload interval", func(c *Config) { c.TLS.ReloadInterval = 0 }, []string{"server.tls.reload_interval"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			if got := keys(c.Validate()); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("problems %q, want %q", got, tt.want)
			}
		})
	}
}

func flattenErr(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErr(e)...)
		}
		return out
	}
	return []error{err}
}
