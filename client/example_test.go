package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	daemonpkg "github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// daemonConfig adjusts the in-process daemon of the examples and tests.
type daemonConfig struct {
	decode  func(*kvlayout.Config)
	manager func(*kvmanager.Config)
	server  func(*server.Config)
	unary   []grpc.UnaryServerInterceptor
	stream  []grpc.StreamServerInterceptor
	// tracer, when set, records the daemon's spans (gRPC and rooms).
	tracer trace.TracerProvider
}

// daemon is a decodeplane daemon built by the composition root
// (internal/daemon, through internal/testing/daemontest) with the simulated
// transfer engine, served on an in-memory listener.
type daemon struct {
	*daemontest.Daemon
	engine *sim.SimEngine
}

// startDaemon builds and serves a daemon. Dial it with dialer() at target
// "passthrough:///bufnet"; stop it with stop.
func startDaemon(dc daemonConfig) (*daemon, error) {
	td, err := daemontest.New(daemontest.Options{
		Config: func(c *config.Config) {
			if dc.decode != nil {
				dec := c.Decode()
				dc.decode(&dec)
				c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
			}
			if dc.manager != nil {
				k := c.Manager()
				dc.manager(&k)
				c.Timeouts, c.DPRank, c.Rooms = k.Timeouts, k.DPRank, k.Rooms
			}
			if dc.server != nil {
				dc.server(&c.Server)
			}
		},
		Daemon: daemonpkg.Options{Version: "example", UnaryInterceptors: dc.unary, StreamInterceptors: dc.stream, TracerProvider: dc.tracer},
	})
	if err != nil {
		return nil, err
	}
	return &daemon{Daemon: td, engine: td.SimEngine()}, nil
}

// dialer connects to the daemon's in-memory listener.
func (d *daemon) dialer() grpc.DialOption { return d.Dialer() }

// stop shuts the daemon down at once: rooms still handing off fail (a real
// daemon gives them server.shutdown_timeout to finish), their streams end,
// every ledger is full again, Serve returns.
func (d *daemon) stop() error { return d.Stop() }

// prefillRank describes prefill rank tpRank of a TP-tp prefill instance at
// addr, with the decode side's page size and dtype.
func prefillRank(addr string, tp, tpRank uint32) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{
		BootstrapAddr: addr,
		RankEndpoint:  fmt.Sprintf("10.0.0.1:%d", 17000+tpRank),
		Parallel:      &pb.ParallelInfo{AttnTpSize: tp, AttnTpRank: tpRank, PpSize: 1},
		PageSize:      64,
		KvCacheDtype:  "bf16",
		InstanceId:    "prefill-" + addr,
	}
}

func ExampleNew() {
	d, err := startDaemon(daemonConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.stop()

	// A real deployment dials "127.0.0.1:7600"; the example dials the
	// in-memory daemon.
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Admin().Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready:", st.GetReady(), st.GetReadiness())
	fmt.Println("pool:", st.GetLayout().GetKind(), "page size", st.GetLayout().GetPageSize())
	// Output:
	// ready: true serving
	// pool: gqa page size 64
}

func ExamplePrefill_SendRoom() {
	d, err := startDaemon(daemonConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.stop()
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// The prefill rank registers (and would run p.RunHeartbeat(ctx) in a
	// goroutine for as long as it serves).
	p := c.Prefill(prefillRank("10.0.0.1:8998", 1, 0))
	reg, err := p.Register(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("registered:", reg.GetRegisteredRanks(), "of", reg.GetExpectedRanks(), "ranks")

	// The decode engine opens room 42 for a 1000-token prompt.
	if _, err := c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{
		Rid: "req-42", BootstrapAddr: "10.0.0.1:8998", Room: 42, PromptLen: 1000, MaxNewTokens: 128,
	}); err != nil {
		log.Fatal(err)
	}

	// The prefill delivers the KV in chunks of 4 pages and returns once the
	// room succeeded.
	dest, err := p.SendRoom(ctx, 42, client.SendOptions{ChunkPages: 4})
	if err != nil {
		log.Fatal(err)
	}
	room, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 42})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("destination:", len(dest.GetPageIndices()), "pages of", dest.GetPageSize(), "tokens")
	fmt.Println("room:", room.GetPhase(), room.GetChunksDone(), "chunks")
	// Output:
	// registered: 1 of 1 ranks
	// destination: 16 pages of 64 tokens
	// room: ROOM_PHASE_SUCCEEDED 4 chunks
}

func ExampleEngine_OpenAndWait() {
	d, err := startDaemon(daemonConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.stop()
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	// A prefill rank, in another process in real life.
	p := c.Prefill(prefillRank("10.0.0.1:8998", 1, 0))
	if _, err := p.Register(ctx); err != nil {
		log.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		_, err := p.SendRoom(ctx, 7, client.SendOptions{})
		sent <- err
	}()

	// The decode engine opens the room and waits for its KV.
	engine := c.Engine()
	room, err := engine.OpenAndWait(ctx, &pb.OpenRoomRequest{
		Rid: "req-7", BootstrapAddr: "10.0.0.1:8998", Room: 7, PromptLen: 300, MaxNewTokens: 64,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("room", room.GetRoom(), room.GetPhase(), room.GetPoll())
	if err := <-sent; err != nil {
		log.Fatal(err)
	}

	// ... decode runs; then the engine hands the pages back.
	rel, err := engine.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 7})
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Admin().Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	shard := st.GetShards()[0]
	fmt.Println("released", rel.GetPagesReleased(), "pages; pool full again:", shard.GetPagesFree() == shard.GetPagesTotal())
	// Output:
	// room 7 ROOM_PHASE_SUCCEEDED KV_POLL_SUCCESS
	// released 5 pages; pool full again: true
}

func ExampleError() {
	d, err := startDaemon(daemonConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.stop()
	c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err = c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 999})
	switch {
	case errors.Is(err, client.ErrNotFound):
		fmt.Println("no such room; gRPC code", status.Code(err))
	case errors.Is(err, client.ErrUnavailable):
		fmt.Println("daemon unreachable or draining: try another")
	case err != nil:
		fmt.Println("other failure:", err)
	}

	_, err = c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{BootstrapAddr: "10.0.0.1:8998", Room: 1, PromptLen: 10, MaxNewTokens: 1})
	var e *client.Error
	if errors.As(err, &e) && errors.Is(err, client.ErrInvalidArgument) {
		fmt.Println(e.Op(), "rejected:", e.Message())
	}
	// Output:
	// no such room; gRPC code NotFound
	// OpenRoom rejected: rid: is required (the request id)
}
