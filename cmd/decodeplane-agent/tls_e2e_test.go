package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// tlsCreds trusts ca and presents leaf (nil: no client certificate).
func tlsCreds(ca *tlstest.CA, leaf *tlstest.Leaf) credentials.TransportCredentials {
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

func dialCreds(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// presented makes one health check on a new connection and returns the
// common name of the certificate the server presented.
func presented(t *testing.T, addr string, creds credentials.TransportCredentials) (string, error) {
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
		return "", err
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		t.Fatalf("answered without TLS (%T)", p.AuthInfo)
	}
	return ti.State.PeerCertificates[0].Subject.CommonName, nil
}

// decodectlBinary builds decodectl next to the other binaries.
func decodectlBinary(t *testing.T) string {
	t.Helper()
	return e2e.Binary(t, "github.com/decodeplane/decodeplane/cmd/decodectl")
}

// TestE2EMutualTLS runs the daemon and the reference agent with mutual TLS
// on both links: the daemon's listener (server.tls) and its link to the
// agent (transfer.delegate.tls against the agent's --tls-*). Each side has
// its own CA. A room's KV goes through the agent byte for byte; plaintext
// and certificate-less clients are refused by both; decodectl --tls-*
// reaches the daemon; the agent rotates its certificate without a restart
// and the daemon keeps working with it.
func TestE2EMutualTLS(t *testing.T) {
	dbin, abin := binaries(t)
	dir := t.TempDir()
	agentCA, daemonCA := tlstest.NewCA(t, "agent link CA"), tlstest.NewCA(t, "daemon CA")
	agentDir := filepath.Join(dir, "agent")
	if err := os.Mkdir(agentDir, 0o700); err != nil {
		t.Fatal(err)
	}
	agentGen1 := agentCA.Server(t, "agent-gen1")
	tlstest.Rotate(t, agentDir, map[string][]byte{"tls.crt": agentGen1.CertPEM, "tls.key": agentGen1.KeyPEM, "ca.crt": agentCA.PEM})
	daemonLink := tlstest.WriteFiles(t, dir, "daemon-agent-client", agentCA.Client(t, "decodeplane"), agentCA)
	daemonServer := tlstest.WriteFiles(t, dir, "daemon-server", daemonCA.Server(t, "decodeplane-daemon"), daemonCA)
	prefillClient := agentCA.Client(t, "prefill") // the test, playing prefill, at the agent
	operator := daemonCA.Client(t, "operator")    // the test and decodectl at the daemon
	operatorFiles := tlstest.WriteFiles(t, dir, "operator", operator, daemonCA)

	c := &cluster{t: t, m: gqa, dtp: 1, agentAt: freeAddr(t), agentBin: abin}
	c.agent = start(t, "agent", abin, "--listen", c.agentAt, "--log-level", "debug",
		"--tls-cert", filepath.Join(agentDir, "tls.crt"), "--tls-key", filepath.Join(agentDir, "tls.key"),
		"--tls-client-ca", filepath.Join(agentDir, "ca.crt"), "--tls-reload-interval", "100ms")
	c.aconn = dialCreds(t, c.agentAt, tlsCreds(agentCA, &prefillClient))
	waitHealth(t, c.aconn, c.agent, healthpb.HealthCheckResponse_SERVING)

	daddr := freeAddr(t)
	c.daemon = start(t, "daemon", dbin, "serve", "--listen", daddr, "--set", "server.metrics_listen=", "--transfer-path", "delegate", "--agent", c.agentAt,
		"--log-level", "debug",
		"--tls-cert", daemonServer.Cert, "--tls-key", daemonServer.Key, "--tls-client-ca", daemonServer.CA,
		"--set", "transfer.delegate.tls.enabled=true", "--set", "transfer.delegate.tls.ca_file="+daemonLink.CA,
		"--set", "transfer.delegate.tls.cert_file="+daemonLink.Cert, "--set", "transfer.delegate.tls.key_file="+daemonLink.Key,
		"--set", "transfer.delegate.tls.server_name=localhost",
		"--set", "transfer.delegate.health_interval=200ms", "--set", "transfer.delegate.batch_timeout=20s",
		"--set", "timeouts.heartbeat_interval=10m", "--set", "transfer.backend=mooncake",
		"--set", fmt.Sprintf("kv_pool.num_layers=%d", c.m.layers), "--set", "kv_pool.dtype=bf16",
		"--set", fmt.Sprintf("kv_pool.page_size=%d", c.m.pageSize), "--set", "kv_pool.total_tokens=8192",
		"--set", "kv_pool.request_slots=16", "--set", "parallel.attn_tp=1",
		"--set", "kv_pool.kind=gqa", "--set", fmt.Sprintf("kv_pool.kv_heads=%d", c.m.heads), "--set", fmt.Sprintf("kv_pool.head_dim=%d", c.m.headDim))
	c.dconn = dialCreds(t, daddr, tlsCreds(daemonCA, &operator))
	// SERVING only once the agent is reachable: the link is up over mTLS.
	waitHealth(t, c.dconn, c.daemon, healthpb.HealthCheckResponse_SERVING)
	c.boot, c.rooms, c.staging, c.admin = pb.NewBootstrapClient(c.dconn), pb.NewRoomsClient(c.dconn), pb.NewStagingClient(c.dconn), pb.NewAdminClient(c.dconn)
	c.xfer = transferv1.NewTransferAgentClient(c.aconn)
	for _, w := range []string{"gRPC listener with mutual TLS", "transfer agent link with TLS"} {
		if !strings.Contains(c.daemon.Out.String(), w) {
			t.Errorf("daemon log lacks %q", w)
		}
	}
	if !strings.Contains(c.agent.Out.String(), "tls=\"mutual TLS (client certificate required: true)\"") {
		t.Errorf("agent log does not report mutual TLS:\n%s", c.agent.Out.String())
	}

	room := func(id uint64) {
		t.Helper()
		p := c.newPrefill(fmt.Sprintf("10.7.0.%d:8998", id%200), 1)
		dests := c.open(p, id, 60)
		ids := []int32{5, 6}
		c.transferRoom(p, id, dests, 2, ids)
		c.waitSucceeded(id)
		if err := c.verify(id, dests[0], ids); err != nil {
			t.Fatal(err)
		}
		c.release(id)
	}
	room(701)

	for _, tt := range []struct {
		name, addr string
		creds      credentials.TransportCredentials
	}{
		{"plaintext to the daemon", daddr, insecure.NewCredentials()},
		{"no client certificate to the daemon", daddr, tlsCreds(daemonCA, nil)},
		{"the agent link's certificate to the daemon", daddr, tlsCreds(daemonCA, &prefillClient)},
		{"plaintext to the agent", c.agentAt, insecure.NewCredentials()},
		{"no client certificate to the agent", c.agentAt, tlsCreds(agentCA, nil)},
		{"the daemon CA's certificate to the agent", c.agentAt, tlsCreds(agentCA, &operator)},
	} {
		if _, err := presented(t, tt.addr, tt.creds); err == nil {
			t.Errorf("%s: served", tt.name)
		}
	}

	// decodectl with its TLS flags, against the TLS daemon.
	ctl := decodectlBinary(t)
	run := func(args ...string) (int, string) {
		cmd := exec.Command(ctl, append([]string{"status", "--addr", daddr, "--timeout", "10s"}, args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run("--tls-ca", operatorFiles.CA, "--tls-cert", operatorFiles.Cert, "--tls-key", operatorFiles.Key); code != 0 || !strings.Contains(out, "Ready:          yes") {
		t.Errorf("decodectl with mutual TLS: exit %d\n%s", code, out)
	}
	if code, out := run("--tls-ca", operatorFiles.CA); code != 1 || !strings.Contains(out, "Unavailable") {
		t.Errorf("decodectl without a client certificate: exit %d, want 1 Unavailable\n%s", code, out)
	}
	if code, out := run(); code != 1 || !strings.Contains(out, "Unavailable") {
		t.Errorf("decodectl in plaintext: exit %d, want 1 Unavailable\n%s", code, out)
	}

	// The agent's certificate rotates (symlink swap); new connections see
	// the new one within the reload interval (polled, bounded).
	agentGen2 := agentCA.Server(t, "agent-gen2")
	tlstest.Rotate(t, agentDir, map[string][]byte{"tls.crt": agentGen2.CertPEM, "tls.key": agentGen2.KeyPEM, "ca.crt": agentCA.PEM})
	deadline := time.Now().Add(20 * time.Second)
	for {
		cn, err := presented(t, c.agentAt, tlsCreds(agentCA, &prefillClient))
		if err == nil && cn == "agent-gen2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent still presents %q (%v):\n%s", cn, err, c.agent.Out.String())
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-c.agent.Exited():
			t.Fatalf("the agent exited:\n%s", c.agent.Out.String())
		}
	}
	if !strings.Contains(c.agent.Out.String(), `TLS files reloaded`) {
		t.Errorf("the agent did not log the reload")
	}
	// The daemon's link still moves KV: its open connection was
	// authenticated at the handshake and stays (a reconnection verifying a
	// rotated certificate is server's TestAgentLinkMutualTLS).
	room(702)
}
