package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestValidateTLSFiles: validate reads the files and reports every problem,
// each naming the key, the file and the fix; exit 2.
func TestValidateTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	good := tlstest.WriteFiles(t, dir, "good", ca.Server(t, "daemon"), ca)
	other := ca.Server(t, "other")
	expired := ca.Issue(t, tlstest.Spec{CommonName: "old", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	old := tlstest.WriteFiles(t, dir, "old", expired, ca)
	mismatched := tlstest.Write(t, dir, "other.key", other.KeyPEM)
	notPEM := tlstest.Write(t, dir, "notpem", []byte("hello"))

	code, _, stderr := runCmd([]string{"validate", "--tls-cert", good.Cert, "--tls-key", mismatched, "--tls-client-ca", notPEM,
		"--transfer-path", "delegate", "--agent", "127.0.0.1:7700",
		"--set", "transfer.delegate.tls.enabled=true", "--set", "transfer.delegate.tls.ca_file=" + filepath.Join(dir, "missing.crt"),
		"--set", "transfer.delegate.tls.cert_file=" + old.Cert, "--set", "transfer.delegate.tls.key_file=" + old.Key}, nil)
	if code != exitUsage {
		t.Fatalf("exit %d, want %d:\n%s", code, exitUsage, stderr)
	}
	for _, want := range []string{
		"the configuration has 4 problems",
		"server.tls.key_file = \"" + mismatched + "\"   (from flag --tls-key)\n     the private key does not match the certificate in " + good.Cert,
		"server.tls.client_ca_file = \"" + notPEM + "\"   (from flag --tls-client-ca)\n     no PEM certificate in it",
		"transfer.delegate.tls.cert_file = \"" + old.Cert + "\"",
		`certificate "old" expired at`,
		"fix: renew the certificate",
		"transfer.delegate.tls.ca_file = \"" + filepath.Join(dir, "missing.crt") + "\"",
		"cannot read it: no such file or directory.",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("output does not contain %q:\n%s", want, stderr)
		}
	}

	code, stdout, stderr := runCmd([]string{"validate", "--tls-cert", good.Cert, "--tls-key", good.Key, "--tls-client-ca", good.CA}, nil)
	if code != exitOK || !strings.Contains(stdout, "configuration is valid") {
		t.Errorf("good files: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestTokenWithoutTLSWarns: a token on a plaintext listener is clear text on
// the wire, and validate says so (as it does for a missing token).
func TestTokenWithoutTLSWarns(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "CA")
	f := tlstest.WriteFiles(t, dir, "d", ca.Server(t, "daemon"), ca)
	const clearText = "warning: server.tls: the bootstrap token is sent in clear text"
	const noToken = "warning: server.auth_token: no bootstrap token"
	for _, tt := range []struct {
		name       string
		args, env  []string
		want, none []string
	}{
		{"no token", nil, nil, []string{noToken}, []string{clearText}},
		{"token without TLS", nil, []string{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=t"}, []string{clearText + ": server.tls is off, so whoever can see the traffic to 127.0.0.1:7600"}, []string{noToken}},
		{"token with TLS", []string{"--tls-cert", f.Cert, "--tls-key", f.Key}, []string{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=t"}, nil, []string{clearText, noToken}},
	} {
		code, _, stderr := runCmd(append([]string{"validate"}, tt.args...), tt.env)
		if code != exitOK {
			t.Fatalf("%s: exit %d:\n%s", tt.name, code, stderr)
		}
		for _, w := range tt.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: no %q in:\n%s", tt.name, w, stderr)
			}
		}
		for _, w := range tt.none {
			if strings.Contains(stderr, w) {
				t.Errorf("%s: %q in:\n%s", tt.name, w, stderr)
			}
		}
	}
}

// mtlsCreds trusts ca and presents leaf (nil: no client certificate).
func mtlsCreds(ca *tlstest.CA, leaf *tlstest.Leaf) credentials.TransportCredentials {
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

// statusOver calls Admin.GetStatus on a new connection and returns the
// server certificate's common name.
func statusOver(t *testing.T, addr string, creds credentials.TransportCredentials) (string, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		t.Fatalf("answered without TLS (%T)", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0].Subject.CommonName, nil
}

// scrape returns the value of a metric series ("" if absent).
func scrape(t *testing.T, url, series string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return ""
	}
	return string(m[1])
}

// TestE2EServeMutualTLSRotation runs the binary with server.tls (mutual
// TLS, a short reload interval): plaintext, no client certificate and the
// wrong CA are refused; a valid client is served; a rotation of the files is
// picked up by new connections without a restart, a broken one is refused
// and counted while the last good certificate keeps serving.
func TestE2EServeMutualTLSRotation(t *testing.T) {
	dir := t.TempDir()
	ca, other := tlstest.NewCA(t, "decodeplane CA"), tlstest.NewCA(t, "other CA")
	gen1 := ca.Server(t, "daemon-gen1")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen1.CertPEM, "tls.key": gen1.KeyPEM, "ca.crt": ca.PEM})
	addr, maddr := freeAddr(t), freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--metrics-listen", maddr,
		"--tls-cert", filepath.Join(dir, "tls.crt"), "--tls-key", filepath.Join(dir, "tls.key"), "--tls-client-ca", filepath.Join(dir, "ca.crt"),
		"--set", "server.tls.reload_interval=100ms"}, e2eEnviron("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=s3cret"))
	client := ca.Client(t, "operator")
	good := mtlsCreds(ca, &client)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(good))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ready := make(chan error, 1)
	go func() {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("no health over mutual TLS: %v\n%s", err, p.Out.String())
		}
	case <-p.Exited():
		t.Fatalf("the daemon exited (%v):\n%s", p.Err(), p.Out.String())
	}
	out := p.Out.String()
	if !strings.Contains(out, "gRPC listener with mutual TLS") || strings.Contains(out, "sent in clear text") {
		t.Errorf("startup log:\n%s", out)
	}

	for _, tt := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext", insecure.NewCredentials()},
		{"no client certificate", mtlsCreds(ca, nil)},
		{"trusting another CA", mtlsCreds(other, &client)},
	} {
		if _, err := statusOver(t, addr, tt.creds); err == nil {
			t.Errorf("%s: served", tt.name)
		}
	}
	if cn, err := statusOver(t, addr, good); err != nil || cn != "daemon-gen1" {
		t.Fatalf("valid client: %q, %v", cn, err)
	}

	// waitFor polls new connections until the daemon presents cn (the reload
	// runs every 100ms; the deadline bounds it).
	waitFor := func(cn string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := statusOver(t, addr, good)
			if err == nil && got == cn {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon still presents %q (%v), want %q:\n%s", got, err, cn, p.Out.String())
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-p.Exited():
				t.Fatalf("the daemon exited:\n%s", p.Out.String())
			}
		}
	}
	metrics := "http://" + maddr + "/metrics"
	gen2 := ca.Server(t, "daemon-gen2")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen2.CertPEM, "tls.key": gen2.KeyPEM, "ca.crt": ca.PEM})
	waitFor("daemon-gen2")
	if v := scrape(t, metrics, `decodeplane_tls_reloads_total{result="ok",section="server.tls"}`); v != "1" {
		t.Errorf("ok reloads = %q, want 1", v)
	}
	v := scrape(t, metrics, `decodeplane_tls_certificate_not_after_seconds{section="server.tls"}`)
	if end, err := strconv.ParseFloat(v, 64); err != nil || int64(end) != gen2.Cert.NotAfter.Unix() {
		t.Errorf("certificate end = %q, want %d (daemon-gen2's)", v, gen2.Cert.NotAfter.Unix())
	}

	// A broken rotation: gen3's certificate with gen2's key.
	gen3 := ca.Server(t, "daemon-gen3")
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen3.CertPEM, "tls.key": gen2.KeyPEM, "ca.crt": ca.PEM})
	deadline := time.Now().Add(20 * time.Second)
	for scrape(t, metrics, `decodeplane_tls_reloads_total{result="error",section="server.tls"}`) != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("the broken rotation was not counted:\n%s", p.Out.String())
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-p.Exited():
			t.Fatalf("the daemon exited:\n%s", p.Out.String())
		}
	}
	if cn, err := statusOver(t, addr, good); err != nil || cn != "daemon-gen2" {
		t.Errorf("after a broken rotation: %q, %v; want the last good daemon-gen2", cn, err)
	}
	if !strings.Contains(p.Out.String(), "does not match the certificate") {
		t.Errorf("the refused reload is not logged with its reason:\n%s", p.Out.String())
	}
	tlstest.Rotate(t, dir, map[string][]byte{"tls.crt": gen3.CertPEM, "tls.key": gen3.KeyPEM, "ca.crt": ca.PEM})
	waitFor("daemon-gen3")
}

// TestE2EServeWarnsTokenInClearText: serve logs the warning at startup.
func TestE2EServeWarnsTokenInClearText(t *testing.T) {
	addr := freeAddr(t)
	p := startDaemon(t, []string{"serve", "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=s3cret"))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("health: %v\n%s", err, p.Out.String())
	}
	out := p.Out.String()
	if !strings.Contains(out, "level=WARN msg=\"configuration warning\" key=server.tls") || !strings.Contains(out, "sent in clear text") {
		t.Errorf("no clear-text warning at startup:\n%s", out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("the token leaked into the log:\n%s", out)
	}
}
