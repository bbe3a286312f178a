package agentclient_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/testing/tlstest"
	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/transfer/agentclient"
	"github.com/decodeplane/decodeplane/transfer/agentclient/agenttls"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
)

// testTimeout bounds every wait in these tests; nothing should come close.
const testTimeout = 10 * time.Second

func refused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted", what)
	} else if status.Code(err) != codes.Unavailable {
		t.Errorf("%s: %v, want Unavailable", what, err)
	}
}

// agentServer serves the agent service and health with mutual TLS on addr
// ("127.0.0.1:0" for a new port); stop ends it.
func agentServer(t *testing.T, addr string, files tlsreload.Files) (string, func()) {
	t.Helper()
	r, err := tlsreload.New(tlsreload.Options{Name: "agent", Files: files, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(r.ServerCredentials(true)))
	svc := agentservice.New(hostmem.NewAgent(hostmem.New(1<<20)), slog.New(slog.DiscardHandler))
	svc.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gs.Serve(lis)
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		hs.Shutdown()
		svc.Close()
		gs.Stop()
		<-done
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

// dialAgent runs a Client with tls until the test ends.
func dialAgent(t *testing.T, addr string, c agenttls.AgentTLSConfig) (*agentclient.Client, *agenttls.AgentTLS) {
	t.Helper()
	at, err := agenttls.NewAgentTLS(c, agenttls.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ac, err := agentclient.Dial(addr, agentclient.Options{Logger: slog.New(slog.DiscardHandler), Credentials: at.Credentials})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = ac.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		ac.Close()
	})
	return ac, at
}

func checkAgent(t *testing.T, ac *agentclient.Client) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	return ac.Check(ctx)
}

// TestAgentLinkMutualTLS: the daemon's agent client with
// transfer.delegate.tls reaches an agent serving mutual TLS only with the
// right CA and a client certificate; after the agent moves to a new CA, a
// rotation of the client's files is used by the reconnection.
func TestAgentLinkMutualTLS(t *testing.T) {
	adir, ddir := t.TempDir(), t.TempDir()
	ca1, ca2 := tlstest.NewCA(t, "CA 1"), tlstest.NewCA(t, "CA 2")
	af := tlstest.WriteFiles(t, adir, "agent", ca1.Server(t, "agent"), ca1)
	addr, stop := agentServer(t, "127.0.0.1:0", tlsreload.Files{Cert: af.Cert, Key: af.Key, CA: af.CA})
	df := tlstest.WriteFiles(t, ddir, "daemon", ca1.Client(t, "daemon"), ca1)

	t.Run("refused", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			cfg  agenttls.AgentTLSConfig
		}{
			{"no client certificate", agenttls.AgentTLSConfig{Enabled: true, CAFile: df.CA, ServerName: "localhost", ReloadInterval: tlsreload.DefaultInterval}},
			{"system roots only", agenttls.AgentTLSConfig{Enabled: true, CertFile: df.Cert, KeyFile: df.Key, ServerName: "localhost", ReloadInterval: tlsreload.DefaultInterval}},
			{"wrong server name", agenttls.AgentTLSConfig{Enabled: true, CAFile: df.CA, CertFile: df.Cert, KeyFile: df.Key, ServerName: "agent.elsewhere", ReloadInterval: tlsreload.DefaultInterval}},
		} {
			ac, _ := dialAgent(t, addr, tt.cfg)
			err := checkAgent(t, ac)
			if !errors.Is(err, delegate.ErrAgentUnreachable) {
				t.Errorf("%s: Check = %v, want unreachable", tt.name, err)
			}
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		refused(t, "plaintext to the agent", err)
	})

	ac, at := dialAgent(t, addr, agenttls.AgentTLSConfig{Enabled: true, CAFile: df.CA, CertFile: df.Cert, KeyFile: df.Key, ServerName: "localhost", ReloadInterval: tlsreload.DefaultInterval})
	if err := checkAgent(t, ac); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}

	// The agent moves to CA 2 (restart on the same address); the daemon's
	// files rotate to CA 2 too and the reconnection uses them.
	// Neither the old client certificate nor the old CA would do.
	stop()
	tlstest.WriteFiles(t, ddir, "daemon", ca2.Client(t, "daemon-2"), ca2)
	if changed, err := at.Reloader.Reload(); !changed || err != nil {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	af2 := tlstest.WriteFiles(t, adir, "agent2", ca2.Server(t, "agent-2"), ca2)
	agentServer(t, addr, tlsreload.Files{Cert: af2.Cert, Key: af2.Key, CA: af2.CA})
	// The client reconnects with gRPC's backoff: poll, bounded.
	deadline := time.Now().Add(testTimeout)
	for {
		err := checkAgent(t, ac)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after rotation: %v", err)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-t.Context().Done():
			return
		}
	}
}
