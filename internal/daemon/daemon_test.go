package daemon_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

func testConfig() config.Config {
	cfg := config.DefaultConfig()
	cfg.Server.Listen = "127.0.0.1:0"
	cfg.Server.MetricsListen = "127.0.0.1:0"
	cfg.Server.ShutdownTimeout = 5 * time.Second
	cfg.Transfer.Sim = sim.SimConfig{}
	cfg.Timeouts.HeartbeatInterval = 10 * time.Minute
	return cfg
}

// TestBuildRefusesUnknownTransferPath: a transfer path this build lacks is
// a usage error (exit 2), and the listeners Build had opened are closed.
func TestBuildRefusesUnknownTransferPath(t *testing.T) {
	cfg := testConfig()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Transfer.Path = "rdma"
	_, err = daemon.Build(t.Context(), cfg, daemon.Options{Listener: lis})
	var ue *config.UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("Build = %v, want a *config.UsageError", err)
	}
	if _, err := lis.Accept(); err == nil {
		t.Error("the listener given to Build is still open after Build failed")
	}
}

// TestShutdownWithoutRun releases what Build acquired: the port can be
// bound again.
func TestShutdownWithoutRun(t *testing.T) {
	d, err := daemon.Build(t.Context(), testConfig(), daemon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := d.Addr().String()
	if err := d.Shutdown(t.Context()); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("after Shutdown, %s is still bound: %v", addr, err)
	}
	lis.Close()
	if err := d.Run(t.Context()); err == nil {
		t.Error("Run after Shutdown = nil, want an error")
	}
}

// TestRunServesThenShutdownEndsTheRoomsInFlight: the built daemon serves
// health SERVING and /metrics; Shutdown with an ended context fails the
// room still waiting with FAILURE_CODE_SHUTDOWN, ends its stream, and Run
// returns a *CutShortError counting it.
func TestRunServesThenShutdownEndsTheRoomsInFlight(t *testing.T) {
	d, err := daemon.Build(t.Context(), testConfig(), daemon.Options{Version: "v-test"})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- d.Run(context.Background()) }()
	<-d.Started()
	if d.MetricsURL() == "" {
		t.Error("MetricsURL is empty with server.metrics_listen set")
	}
	conn, err := grpc.NewClient(d.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v; want SERVING", hr, err)
	}
	st, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil || st.GetVersion() != "v-test" {
		t.Fatalf("GetStatus = %v, %v; want version v-test", st, err)
	}
	if st.GetIncarnation() == 0 || st.GetIncarnation() != d.Incarnation() {
		t.Errorf("GetStatus incarnation %x, daemon's %x: want the same non-zero value", st.GetIncarnation(), d.Incarnation())
	}
	// A room whose prefill never registers waits (waiting_prefill).
	rooms := pb.NewRoomsClient(conn)
	if _, err := rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r1", BootstrapAddr: "10.0.0.9:8998", Room: 1, PromptLen: 16, MaxNewTokens: 4}); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	watch, err := rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatalf("first watch event: %v", err)
	}
	now, stop := context.WithCancel(context.Background())
	stop()
	err = d.Shutdown(now)
	var cut *daemon.CutShortError
	if !errors.As(err, &cut) || cut.Rooms.Failed != 1 || cut.Deadline != nil {
		t.Fatalf("Shutdown = %v, want a *CutShortError with 1 room failed and no deadline", err)
	}
	if runErr := <-ran; runErr != err {
		t.Errorf("Run = %v, Shutdown = %v: want the same result", runErr, err)
	}
	var last *pb.RoomEvent
	for {
		ev, err := watch.Recv()
		if err != nil {
			break
		}
		last = ev
	}
	if last.GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN {
		t.Errorf("last watch event %v, want the room failed with FAILURE_CODE_SHUTDOWN", last)
	}
}

// TestIncarnationNewAtEveryBuild: every Build draws its own non-zero
// incarnation.
func TestIncarnationNewAtEveryBuild(t *testing.T) {
	seen := map[uint64]bool{}
	for range 3 {
		d, err := daemon.Build(t.Context(), testConfig(), daemon.Options{})
		if err != nil {
			t.Fatal(err)
		}
		inc := d.Incarnation()
		if err := d.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		if inc == 0 || seen[inc] || d.Server().Incarnation() != inc {
			t.Fatalf("incarnation %x (server %x) after %d builds that drew %v: want a new non-zero one handed to the server", inc, d.Server().Incarnation(), len(seen), seen)
		}
		seen[inc] = true
	}
}
