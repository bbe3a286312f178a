package tlsreload_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	"github.com/decodeplane/decodeplane/internal/tlsreload"
)

// tlsServer is a real gRPC server (the health service) on a TCP loopback
// port, with the reloader's credentials. It records the common name of the
// client certificate of the last call.
type tlsServer struct {
	addr string
	mu   sync.Mutex
	cn   string
}

func (s *tlsServer) clientCN() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cn
}

func serve(t *testing.T, creds credentials.TransportCredentials) *tlsServer {
	t.Helper()
	s := &tlsServer{}
	gs := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		cn := ""
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
				cn = ti.State.PeerCertificates[0].Subject.CommonName
			}
		}
		s.mu.Lock()
		s.cn = cn
		s.mu.Unlock()
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})
	return s
}

// call makes one health check on a new connection and returns the server's
// certificate (nil if the call failed).
func call(t *testing.T, addr string, creds credentials.TransportCredentials) (*x509.Certificate, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		t.Fatalf("the call succeeded without TLS (auth info %T)", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0], nil
}

func pool(cas ...*tlstest.CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

func clientTLS(roots *x509.CertPool, cert *tlstest.Leaf) credentials.TransportCredentials {
	c := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	if cert != nil {
		pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
		if err != nil {
			panic(err)
		}
		// Always present it (a Certificates list would be filtered by the
		// CAs the server names, hiding a stranger's certificate).
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return credentials.NewTLS(c)
}

func mustNew(t *testing.T, o tlsreload.Options) *tlsreload.Reloader {
	t.Helper()
	r, err := tlsreload.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func wantRefused(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: the call succeeded", what)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("%s: code %s, want Unavailable: %v", what, status.Code(err), err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: error %q does not mention %q", what, err, w)
		}
	}
}

func TestServerTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := tlstest.NewCA(t, "test CA"), tlstest.NewCA(t, "other CA")
	f := tlstest.WriteFiles(t, dir, "server", ca.Server(t, "server-1"), ca)
	r := mustNew(t, tlsreload.Options{Name: "test", Files: tlsreload.Files{Cert: f.Cert, Key: f.Key}})
	s := serve(t, r.ServerCredentials(true))

	_, err := call(t, s.addr, insecure.NewCredentials())
	wantRefused(t, "plaintext client", err)
	_, err = call(t, s.addr, clientTLS(pool(other), nil))
	wantRefused(t, "client trusting another CA", err, "certificate signed by unknown authority")
	got, err := call(t, s.addr, clientTLS(pool(ca), nil))
	if err != nil {
		t.Fatalf("valid client: %v", err)
	}
	if got.Subject.CommonName != "server-1" {
		t.Errorf("server certificate %q, want server-1", got.Subject.CommonName)
	}
}

func TestServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := tlstest.NewCA(t, "test CA"), tlstest.NewCA(t, "other CA")
	f := tlstest.WriteFiles(t, dir, "server", ca.Server(t, "server-1"), ca)
	good, stranger := ca.Client(t, "client-1"), other.Client(t, "stranger")
	for _, require := range []bool{true, false} {
		r := mustNew(t, tlsreload.Options{Name: "test", Files: tlsreload.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}})
		s := serve(t, r.ServerCredentials(require))
		_, err := call(t, s.addr, insecure.NewCredentials())
		wantRefused(t, "plaintext client", err)
		_, err = call(t, s.addr, clientTLS(pool(ca), &stranger))
		wantRefused(t, "client certificate from another CA", err)
		_, err = call(t, s.addr, clientTLS(pool(ca), nil))
		if require {
			wantRefused(t, "no client certificate", err)
		} else if err != nil {
			t.Errorf("require_client_cert false, no client certificate: %v", err)
		} else if cn := s.clientCN(); cn != "" {
			t.Errorf("client certificate %q seen without one", cn)
		}
		if _, err := call(t, s.addr, clientTLS(pool(ca), &good)); err != nil {
			t.Fatalf("require=%v: valid client: %v", require, err)
		}
		if cn := s.clientCN(); cn != "client-1" {
			t.Errorf("require=%v: the server saw client %q, want client-1", require, cn)
		}
	}
}

// TestServerRotation replaces the files by a symlink swap (as Kubernetes
// secret volumes do): after the reload, new connections get the new
// certificate and the new client CA; a broken rotation keeps the last good
// pair.
func TestServerRotation(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := tlstest.NewCA(t, "CA 1"), tlstest.NewCA(t, "CA 2")
	gen1 := ca1.Server(t, "server-gen1")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen1.CertPEM, "tls.key": gen1.KeyPEM, "ca.crt": ca1.PEM})
	files := tlsreload.Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	var mu sync.Mutex
	var events []error
	r := mustNew(t, tlsreload.Options{Name: "test", Files: files, OnReload: func(err error) {
		mu.Lock()
		events = append(events, err)
		mu.Unlock()
	}})
	s := serve(t, r.ServerCredentials(true))
	c1, c2 := ca1.Client(t, "client-ca1"), ca2.Client(t, "client-ca2")
	both := pool(ca1, ca2)

	if got, err := call(t, s.addr, clientTLS(both, &c1)); err != nil || got.Subject.CommonName != "server-gen1" {
		t.Fatalf("before rotation: %v, %v", got, err)
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged files = %v, %v", changed, err)
	}

	// Rotate to CA 2 for both the server certificate and the clients.
	gen2 := ca2.Server(t, "server-gen2")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen2.CertPEM, "tls.key": gen2.KeyPEM, "ca.crt": ca2.PEM})
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload after rotation = %v, %v", changed, err)
	}
	got, err := call(t, s.addr, clientTLS(both, &c2))
	if err != nil || got.Subject.CommonName != "server-gen2" {
		t.Fatalf("after rotation: %v, %v", got, err)
	}
	_, err = call(t, s.addr, clientTLS(both, &c1))
	wantRefused(t, "client of the old CA after the CA rotated", err)

	// A broken rotation: a key that does not match the certificate.
	gen3 := ca2.Server(t, "server-gen3")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen3.CertPEM, "tls.key": gen2.KeyPEM, "ca.crt": ca2.PEM})
	changed, err := r.Reload()
	if changed || err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("Reload of a mismatched pair = %v, %v", changed, err)
	}
	if _, err := r.Reload(); err == nil {
		t.Fatal("the second Reload of the same bad files succeeded")
	}
	if n := r.Failures(); n != 1 {
		t.Errorf("Failures = %d after one bad content read twice, want 1", n)
	}
	if got, err := call(t, s.addr, clientTLS(both, &c2)); err != nil || got.Subject.CommonName != "server-gen2" {
		t.Fatalf("after a failed reload the last good pair must serve: %v, %v", got, err)
	}
	// Fixed: picked up.
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen3.CertPEM, "tls.key": gen3.KeyPEM, "ca.crt": ca2.PEM})
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload after the fix = %v, %v", changed, err)
	}
	if got, err := call(t, s.addr, clientTLS(both, &c2)); err != nil || got.Subject.CommonName != "server-gen3" {
		t.Fatalf("after the fix: %v, %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 || events[0] != nil || events[1] == nil || events[2] != nil {
		t.Errorf("OnReload saw %v, want [nil, error, nil]", events)
	}
	if r.Reloads() != 2 {
		t.Errorf("Reloads = %d, want 2", r.Reloads())
	}
}

// TestClientRotation: the client credentials read the current files at every
// handshake, so a new connection after a rotation presents the new client
// certificate and trusts the new CA.
func TestClientRotation(t *testing.T) {
	sdir, cdir := t.TempDir(), t.TempDir()
	ca1, ca2 := tlstest.NewCA(t, "CA 1"), tlstest.NewCA(t, "CA 2")
	// The server trusts clients of both CAs and presents a CA 2 certificate.
	sf := tlstest.WriteFiles(t, sdir, "server", ca2.Server(t, "server"), ca1)
	bothCAs := tlstest.Write(t, sdir, "server-ca.crt", append(append([]byte{}, ca1.PEM...), ca2.PEM...))
	srv := mustNew(t, tlsreload.Options{Name: "server", Files: tlsreload.Files{Cert: sf.Cert, Key: sf.Key, CA: bothCAs}})
	s := serve(t, srv.ServerCredentials(true))

	cf := tlstest.WriteFiles(t, cdir, "client", ca1.Client(t, "client-gen1"), ca1)
	cr := mustNew(t, tlsreload.Options{Name: "client", Files: tlsreload.Files{Cert: cf.Cert, Key: cf.Key, CA: cf.CA}})
	creds := cr.ClientCredentials("localhost")
	_, err := call(t, s.addr, creds)
	wantRefused(t, "client trusting only CA 1", err, "unknown authority")

	tlstest.WriteFiles(t, cdir, "client", ca2.Client(t, "client-gen2"), ca2)
	if changed, err := cr.Reload(); !changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	if _, err := call(t, s.addr, creds); err != nil {
		t.Fatalf("after the client rotation: %v", err)
	}
	if cn := s.clientCN(); cn != "client-gen2" {
		t.Errorf("the server saw client %q, want client-gen2", cn)
	}
}

// TestRunPolls drives the poll loop on synctest's fake clock: a change is
// picked up within one interval, not before.
func TestRunPolls(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	gen1, gen2 := ca.Server(t, "gen1"), ca.Server(t, "gen2")
	realNow := time.Now() // the bubble's clock starts in 2000, before the certificates
	synctest.Test(t, func(t *testing.T) {
		f := tlstest.WriteFiles(t, dir, "server", gen1, ca)
		r := mustNew(t, tlsreload.Options{Name: "test", Interval: time.Minute, Files: tlsreload.Files{Cert: f.Cert, Key: f.Key},
			Now: func() time.Time { return realNow }})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		tlstest.WriteFiles(t, dir, "server", gen2, ca)
		time.Sleep(time.Minute - time.Second)
		synctest.Wait()
		if cn := r.Certificate().Leaf.Subject.CommonName; cn != "gen1" {
			t.Errorf("before the interval: %s", cn)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if cn := r.Certificate().Leaf.Subject.CommonName; cn != "gen2" {
			t.Errorf("after the interval: %s, want gen2", cn)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v", err)
		}
	})
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	good := ca.Server(t, "good")
	other := ca.Server(t, "other")
	expired := ca.Issue(t, tlstest.Spec{CommonName: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	w := func(name string, data []byte) string { return tlstest.Write(t, dir, name, data) }
	cert, key, caFile := w("good.crt", good.CertPEM), w("good.key", good.KeyPEM), w("ca.crt", ca.PEM)
	if ps := tlsreload.Check(tlsreload.Files{Cert: cert, Key: key, CA: caFile}, time.Now()); len(ps) != 0 {
		t.Fatalf("good files: %v", ps)
	}
	garbage := w("garbage", []byte("not pem at all"))
	badDER := w("bad.crt", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	tests := []struct {
		name  string
		files tlsreload.Files
		now   time.Time
		want  []string // "file:words", one per problem
	}{
		{"missing files", tlsreload.Files{Cert: filepath.Join(dir, "nope.crt"), Key: filepath.Join(dir, "nope.key"), CA: filepath.Join(dir, "nope-ca.crt")}, time.Now(),
			[]string{"cert:cannot read it: no such file", "key:cannot read it: no such file", "ca:cannot read it: no such file"}},
		{"not PEM", tlsreload.Files{Cert: garbage, Key: garbage, CA: garbage}, time.Now(),
			[]string{"cert:no PEM certificate", "key:no PEM private key", "ca:no PEM certificate"}},
		{"bad DER", tlsreload.Files{Cert: badDER, Key: key, CA: badDER}, time.Now(),
			[]string{"cert:does not parse", "ca:does not parse"}},
		{"swapped", tlsreload.Files{Cert: key, Key: cert}, time.Now(),
			[]string{"cert:holds a private key", "key:no PEM private key"}},
		{"key of another certificate", tlsreload.Files{Cert: cert, Key: w("other.key", other.KeyPEM)}, time.Now(),
			[]string{"key:does not match the certificate"}},
		{"expired", tlsreload.Files{Cert: w("old.crt", expired.CertPEM), Key: w("old.key", expired.KeyPEM)}, time.Now(),
			[]string{`cert:certificate "old" expired at`}},
		{"CA and certificate not yet valid", tlsreload.Files{Cert: cert, Key: key, CA: caFile}, time.Now().Add(-2 * time.Hour),
			[]string{`cert:certificate "good" is not valid before`, `ca:certificate "CA" is not valid before`}},
		{"unreadable directory as a file", tlsreload.Files{CA: dir}, time.Now(), []string{"ca:cannot read it"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := tlsreload.Check(tt.files, tt.now)
			if len(ps) != len(tt.want) {
				t.Fatalf("%d problems %v, want %d: %q", len(ps), ps, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				file, words, _ := strings.Cut(w, ":")
				if ps[i].File != file || !strings.Contains(ps[i].Message, words) {
					t.Errorf("problem %d = %s %q, want %s %q", i, ps[i].File, ps[i].Message, file, words)
				}
				if ps[i].Path == "" {
					t.Errorf("problem %d names no path", i)
				}
			}
		})
	}
	if _, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: garbage, Key: key}}); err == nil {
		t.Error("New accepted a broken pair")
	}
}
