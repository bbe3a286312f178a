package server_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// stgServer is the whole daemon (internal/testing/daemontest) over bufconn (simulated,
// instant transfers): a GQA pool (4 layers, 8 KV heads of 16 × bf16, pages of
// 16 tokens), decode TP decodeTP, a 1 MiB staging ring.
type stgServer struct {
	srv  *server.Server
	conn *grpc.ClientConn
	boot pb.BootstrapClient
	room pb.RoomsClient
	stg  pb.StagingClient
}

func stgDecodeConfig(decodeTP int) kvlayout.Config {
	dec := kvlayout.DefaultConfig()
	dec.Pool.Kind = kvlayout.KindGQA
	dec.Pool.NumLayers, dec.Pool.KVHeads, dec.Pool.HeadDim, dec.Pool.DType = 4, 8, 16, "bf16"
	dec.Pool.PageSize, dec.Pool.TotalTokens, dec.Pool.TotalPages, dec.Pool.RequestSlots = 16, 0, 512, 8
	dec.Parallel.AttnTP = decodeTP
	dec.Staging = kvlayout.StagingConfig{Enabled: true, PoolSizeMB: 1}
	return dec
}

func newStgServer(tb testing.TB, dec kvlayout.Config, token string) *stgServer {
	tb.Helper()
	if err := dec.Validate(); err != nil {
		tb.Fatal(err)
	}
	d := daemontest.Start(tb, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
		c.Server.AuthToken = token
	}})
	conn := d.Conn(tb)
	return &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn), stg: pb.NewStagingClient(conn)}
}

func (s *stgServer) register(tb testing.TB, ctx context.Context, addr string, tp int) {
	tb.Helper()
	for r := range tp {
		if _, err := s.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: fmt.Sprintf("10.0.0.%d:9000", r+1),
			Parallel: &pb.ParallelInfo{AttnTpSize: uint32(tp), AttnTpRank: uint32(r), AttnCpSize: 1, AttnDpSize: 1, PpSize: 1},
			PageSize: 16, KvCacheDtype: "bf16"}); err != nil {
			tb.Fatalf("RegisterPrefill: %v", err)
		}
	}
}

// open opens a room and claims it from every rank, waiting until it is
// claimed.
func (s *stgServer) open(tb testing.TB, ctx context.Context, addr string, tp int, room uint64, prompt int) {
	tb.Helper()
	if _, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: addr, Room: room, PromptLen: uint32(prompt), MaxNewTokens: 4}); err != nil {
		tb.Fatalf("OpenRoom: %v", err)
	}
	for r := range tp {
		cctx, cancel := context.WithCancel(ctx)
		stream, err := s.room.AwaitDestination(cctx, &pb.AwaitDestinationRequest{Room: room, Rank: &pb.PrefillRank{BootstrapAddr: addr, TpRank: uint32(r)}})
		if err != nil {
			tb.Fatal(err)
		}
		if ev, err := stream.Recv(); err != nil || ev.GetDestination() == nil {
			tb.Fatalf("AwaitDestination = %v, %v", ev, err)
		}
		cancel()
	}
	w, err := s.room.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
	if err != nil {
		tb.Fatal(err)
	}
	for {
		ev, err := w.Recv()
		if err != nil {
			tb.Fatalf("room %d never claimed: %v", room, err)
		}
		if ph := ev.GetRoom().GetPhase(); ph == pb.RoomPhase_ROOM_PHASE_CLAIMED || ph == pb.RoomPhase_ROOM_PHASE_TRANSFERRING {
			return
		}
	}
}

func prank(addr string, tp int) *pb.PrefillRank {
	return &pb.PrefillRank{BootstrapAddr: addr, TpRank: uint32(tp)}
}

func TestStagingService(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s := newStgServer(t, stgDecodeConfig(2), "")
	s.register(t, ctx, "p4:1", 4)
	s.open(t, ctx, "p4:1", 4, 5, 1280)

	plan, err := s.stg.SetupStaging(ctx, &pb.SetupStagingRequest{Rank: prank("p4:1", 1)})
	if err != nil || !plan.GetStagingRequired() || len(plan.GetHeadSlices()) != 4 || plan.GetTargets()[0].GetWriter().GetWriterIndex() != 1 {
		t.Fatalf("SetupStaging = %v, %v", plan, err)
	}

	tests := []struct {
		name     string
		call     func() error
		code     codes.Code
		contains string
	}{
		{"num_pages 0 is refused by validation", func() error {
			_, err := s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 5, Rank: prank("p4:1", 0), NumPages: 0})
			return err
		}, codes.InvalidArgument, "num_pages"},
		{"aux on a chunk that is not the last", func() error {
			_, err := s.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: 5, Rank: prank("p4:1", 0), NumPages: 1, Aux: &pb.Aux{RoomMarker: 5}})
			return err
		}, codes.InvalidArgument, "aux"},
		{"ChunkReady without a region", func() error {
			_, err := s.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: 5, Rank: prank("p4:1", 0), ChunkIndex: 9, NumPages: 1})
			return err
		}, codes.FailedPrecondition, "AllocateStaging first"},
		{"unknown room", func() error {
			_, err := s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 77, Rank: prank("p4:1", 0), NumPages: 1})
			return err
		}, codes.NotFound, "room not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.contains) {
				t.Errorf("error = %v, want %s containing %q", err, tc.code, tc.contains)
			}
		})
	}

	// A chunk larger than the ring: ResourceExhausted, SGLang's hint, and no
	// RetryInfo (it can never fit).
	_, err = s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 5, Rank: prank("p4:1", 0), NumPages: 70})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.HasSuffix(st.Message(), "Increase SGLANG_DISAGG_STAGING_POOL_SIZE_MB or reduce chunked_prefill_size.") {
		t.Errorf("AllocateStaging(70 pages) = %v, want ResourceExhausted with SGLang's hint", err)
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			t.Errorf("the oversized chunk carries a RetryInfo; it can never fit")
		}
	}
	room, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: 5})
	if err != nil || room.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || room.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_STAGING_FAILED {
		t.Errorf("room after the oversized chunk = %v, %v; want failed (staging_failed)", room, err)
	}
}

func TestStagingMLARefusalOverGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dec := stgDecodeConfig(1)
	dec.Pool.Kind, dec.Pool.KVLoraRank, dec.Pool.QKRopeHeadDim, dec.Staging.Enabled = kvlayout.KindMLA, 32, 16, false
	s := newStgServer(t, dec, "")
	s.register(t, ctx, "p4:1", 4)
	_, err := s.stg.SetupStaging(ctx, &pb.SetupStagingRequest{Rank: prank("p4:1", 0)})
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != kvlayout.MsgStagingMLA {
		t.Errorf("SetupStaging on an MLA pool = %v; want FailedPrecondition with exactly %q", err, kvlayout.MsgStagingMLA)
	}
	stream, err := s.stg.WatchWatermark(ctx, &pb.WatchWatermarkRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("WatchWatermark on an MLA pool = %v, want FailedPrecondition", err)
	}
}

func TestWatchWatermarkAuthAndShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const token = "s3cret"
	s := newStgServer(t, stgDecodeConfig(2), token)
	// A read: no token needed.
	stream, err := s.stg.WatchWatermark(ctx, &pb.WatchWatermarkRequest{DecodeTpRanks: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	wm, err := stream.Recv()
	if err != nil || wm.GetDecodeTpRank() != 1 || wm.GetSizeBytes() != 1<<20 || wm.GetLiveAllocations() != 0 {
		t.Fatalf("first watermark = %v, %v; want decode tp 1's empty 1 MiB ring", wm, err)
	}
	// A write: the token is required.
	_, err = s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 1, Rank: prank("p:1", 0), NumPages: 1})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("AllocateStaging without the token = %v, want Unauthenticated", err)
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	if _, err := s.stg.AllocateStaging(actx, &pb.AllocateStagingRequest{Room: 1, Rank: prank("p:1", 0), NumPages: 1}); status.Code(err) != codes.NotFound {
		t.Errorf("AllocateStaging with the token = %v, want NotFound (no such room)", err)
	}
	// Shutdown ends the watch promptly instead of waiting for its deadline.
	done := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		done <- err
	}()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	start := time.Now()
	if err := s.srv.Shutdown(sctx, nil); err != nil {
		t.Fatalf("Shutdown = %v (the watch held the graceful stop)", err)
	}
	if err := <-done; status.Code(err) != codes.Unavailable {
		t.Errorf("the watch ended with %v, want Unavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Shutdown took %s", d)
	}
}

// BenchmarkStagingControlPath measures the staging control path over real
// gRPC (bufconn): per chunk, 4 prefill writers (prefill TP 4) each call
// AllocateStaging and then ChunkReady for one decode rank (decode TP 1); the
// last ChunkReady scatters (simulated, instant) and frees the region. It
// reports AllocateStaging + ChunkReady round trips per second.
func BenchmarkStagingControlPath(b *testing.B) {
	ctx := context.Background()
	dec := stgDecodeConfig(1)
	s := newStgServer(b, dec, "")
	const addr, room = "p4:1", 3
	s.register(b, ctx, addr, 4)
	s.open(b, ctx, addr, 4, room, 160) // 10 pages; each chunk is one page
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for r := range 4 {
			wg.Go(func() {
				_, err := s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: room, Rank: prank(addr, r), ChunkIndex: uint32(i), NumPages: 1})
				if err == nil {
					_, err = s.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: room, Rank: prank(addr, r), ChunkIndex: uint32(i), PageOffset: uint32(i % 10), NumPages: 1})
				}
				errs[r] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatalf("chunk %d: %v", i, err)
		}
	}
	b.StopTimer()
	if _, err := s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room}); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(4*b.N)/b.Elapsed().Seconds(), "roundtrips/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/chunk")
}
