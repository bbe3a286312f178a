package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// incServer is a whole daemon (stgDecodeConfig's pool) and its clients.
func incServer(t *testing.T, dec kvlayout.Config) (*daemontest.Daemon, *stgServer) {
	t.Helper()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	conn := d.Conn(t)
	return d, &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn), stg: pb.NewStagingClient(conn)}
}

// wantStale checks a STALE_INCARNATION refusal of a call naming got.
func wantStale(t *testing.T, what string, err error, got, own uint64) {
	t.Helper()
	st := status.Convert(err)
	msg := fmt.Sprintf("destination of an earlier decodeplane incarnation %x (this daemon is %x): every destination it handed out is void; re-register and re-claim", got, own)
	if st.Code() != codes.FailedPrecondition || st.Message() != msg {
		t.Fatalf("%s = %v; want FailedPrecondition %q", what, err, msg)
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == server.ReasonStaleIncarnation && ei.GetDomain() == server.ErrorDomain &&
			ei.GetMetadata()["incarnation"] == fmt.Sprintf("%x", got) && ei.GetMetadata()["daemon_incarnation"] == fmt.Sprintf("%x", own) {
			return
		}
	}
	t.Fatalf("%s: details %v lack ErrorInfo %s with both incarnations", what, st.Details(), server.ReasonStaleIncarnation)
}

// staleCount reads decodeplane_stale_incarnation_total{method}.
func staleCount(t *testing.T, d *daemontest.Daemon, method string) float64 {
	t.Helper()
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "decodeplane_stale_incarnation_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "method" && l.GetValue() == method {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no decodeplane_stale_incarnation_total{method=%q}", method)
	return 0
}

// unchanged runs call, which must be refused as stale, and checks that the
// room's state (GetRoom with pages) is the same before and after.
func unchanged(t *testing.T, ctx context.Context, s *stgServer, room uint64, what string, got, own uint64, call func() error) {
	t.Helper()
	before, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room, IncludePages: true})
	if err != nil {
		t.Fatal(err)
	}
	wantStale(t, what, call(), got, own)
	after, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room, IncludePages: true})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(before, after) {
		t.Fatalf("%s refused, yet room %d changed:\nbefore %v\nafter  %v", what, room, before, after)
	}
}

func TestIncarnationAtTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, s := incServer(t, stgDecodeConfig(1))
	own := d.Incarnation()
	if own == 0 || s.srv.Incarnation() != own {
		t.Fatalf("daemon incarnation %x, server's %x: want the same non-zero value", own, s.srv.Incarnation())
	}
	stale := own ^ 0x5a5a
	const addr = "p1:1"
	reg, err := s.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: "10.0.0.1:9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16"})
	if err != nil || reg.GetIncarnation() != own {
		t.Fatalf("RegisterPrefill = %v, %v; want incarnation %x", reg, err, own)
	}
	hb, err := s.boot.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: prank(addr, 0)})
	if err != nil || hb.GetIncarnation() != own {
		t.Fatalf("Heartbeat = %v, %v; want incarnation %x", hb, err, own)
	}
	st, err := pb.NewAdminClient(s.conn).GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil || st.GetIncarnation() != own {
		t.Fatalf("GetStatus incarnation = %x, %v; want %x", st.GetIncarnation(), err, own)
	}

	// Room 7 moves by Transfer, room 8 by ReportTransfer; each RPC is
	// refused with a stale incarnation, then accepted with the daemon's
	// and with 0.
	for _, room := range []uint64{7, 8} {
		if _, err := s.room.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: addr, Room: room, PromptLen: 64, MaxNewTokens: 4}); err != nil {
			t.Fatal(err)
		}
	}
	dest := map[uint64]*pb.Destination{}
	for room, inc := range map[uint64]uint64{7: own, 8: 0} {
		unchanged(t, ctx, s, room, "AwaitDestination", stale, own, func() error {
			stream, err := s.room.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: prank(addr, 0), Incarnation: stale})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		})
		cctx, ccancel := context.WithCancel(ctx)
		stream, err := s.room.AwaitDestination(cctx, &pb.AwaitDestinationRequest{Room: room, Rank: prank(addr, 0), Incarnation: inc})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := stream.Recv()
		ccancel()
		if err != nil || ev.GetDestination().GetIncarnation() != own {
			t.Fatalf("AwaitDestination(room %d, incarnation %x) = %v, %v; want a destination of incarnation %x", room, inc, ev, err, own)
		}
		dest[room] = ev.GetDestination()
	}
	if n := len(dest[7].GetPageIndices()); n < 2 {
		t.Fatalf("destination of %d pages; the test needs 2", n)
	}

	transfer := func(i int, inc uint64) *pb.TransferRequest {
		n := uint32(len(dest[7].GetPageIndices()))
		r := &pb.TransferRequest{Room: 7, Rank: prank(addr, 0), ChunkIndex: uint32(i), PageOffset: 0, NumPages: n / 2, Attempt: dest[7].GetAttempt(), Incarnation: inc}
		if i == 1 {
			r.PageOffset, r.NumPages, r.Last, r.Aux = n/2, n-n/2, true, &pb.Aux{RoomMarker: 7}
		}
		return r
	}
	unchanged(t, ctx, s, 7, "Transfer", stale, own, func() error { _, err := s.room.Transfer(ctx, transfer(0, stale)); return err })
	unchanged(t, ctx, s, 7, "Transfer (last)", stale, own, func() error { _, err := s.room.Transfer(ctx, transfer(1, stale)); return err })
	for i, inc := range []uint64{own, 0} {
		if _, err := s.room.Transfer(ctx, transfer(i, inc)); err != nil {
			t.Fatalf("Transfer chunk %d with incarnation %x: %v", i, inc, err)
		}
	}

	report := func(i int, inc uint64) *pb.ReportTransferRequest {
		dst := dest[8]
		n := uint32(len(dst.GetPageIndices()))
		off, num := uint32(0), n/2
		if i == 1 {
			off, num = n/2, n-n/2
		}
		tokens := min(uint64(off+num)*uint64(dst.GetPageSize()), uint64(dst.GetFillLen())) - uint64(off)*uint64(dst.GetPageSize())
		r := &pb.ReportTransferRequest{Room: 8, Rank: prank(addr, 0), ChunkIndex: uint32(i), PageOffset: off, NumPages: num, Success: true,
			Bytes: tokens * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: inc}
		if i == 1 {
			r.Last, r.MetadataRoomMarker, r.Bytes = true, 8, r.Bytes+dst.GetStateBytes()
		}
		return r
	}
	unchanged(t, ctx, s, 8, "ReportTransfer", stale, own, func() error { _, err := s.room.ReportTransfer(ctx, report(0, stale)); return err })
	for i, inc := range []uint64{0, own} {
		if _, err := s.room.ReportTransfer(ctx, report(i, inc)); err != nil {
			t.Fatalf("ReportTransfer chunk %d with incarnation %x: %v", i, inc, err)
		}
	}
	for _, room := range []uint64{7, 8} {
		r, err := s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
		if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Errorf("room %d = %v, %v; want succeeded", room, r.GetPhase(), err)
		}
	}
	for method, want := range map[string]float64{"AwaitDestination": 2, "Transfer": 2, "ReportTransfer": 1} {
		if got := staleCount(t, d, method); got != want {
			t.Errorf("decodeplane_stale_incarnation_total{method=%q} = %v, want %v", method, got, want)
		}
	}
}

func TestIncarnationStaging(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d, s := incServer(t, stgDecodeConfig(2))
	own := d.Incarnation()
	stale := own + 1
	s.register(t, ctx, "p4:1", 4)
	s.open(t, ctx, "p4:1", 4, 5, 1280)

	unchanged(t, ctx, s, 5, "AllocateStaging", stale, own, func() error {
		_, err := s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 5, Rank: prank("p4:1", 0), NumPages: 1, Incarnation: stale})
		return err
	})
	// The daemon's incarnation and 0 are accepted: chunk 0 with the one,
	// chunk 1 with the other.
	for i, inc := range []uint64{own, 0} {
		resp, err := s.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: 5, Rank: prank("p4:1", 0), ChunkIndex: uint32(i), NumPages: 1, Incarnation: inc})
		if err != nil || len(resp.GetRegions()) == 0 {
			t.Fatalf("AllocateStaging(chunk %d, incarnation %x) = %v, %v", i, inc, resp, err)
		}
	}
	unchanged(t, ctx, s, 5, "ChunkReady", stale, own, func() error {
		_, err := s.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: 5, Rank: prank("p4:1", 0), NumPages: 1, Incarnation: stale})
		return err
	})
	for i, inc := range []uint64{own, 0} {
		resp, err := s.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: 5, Rank: prank("p4:1", 0), ChunkIndex: uint32(i), PageOffset: uint32(i), NumPages: 1, Incarnation: inc})
		if err != nil || resp.GetWritersArrived() == 0 {
			t.Fatalf("ChunkReady(chunk %d, incarnation %x) = %v, %v", i, inc, resp, err)
		}
	}
	for _, method := range []string{"AllocateStaging", "ChunkReady"} {
		if got := staleCount(t, d, method); got != 1 {
			t.Errorf("decodeplane_stale_incarnation_total{method=%q} = %v, want 1", method, got)
		}
	}
}
