package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// ContinueGeneration returns, per re-enqueued room, the prefill's
// /generate and the pinned DP rank (a real daemon; the test plays the
// prefill over the same connection).
func TestContinueGenerationResumed(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d := daemontest.Start(t, daemontest.Options{})
	pool := config.DefaultConfig().KVPool
	conn := d.Conn(t)
	c, err := client.NewFromConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const addr = "10.9.8.7:8998"
	boot, rooms := pb.NewBootstrapClient(conn), pb.NewRoomsClient(conn)
	if _, err := boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: "10.9.8.7:9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: uint32(pool.PageSize),
		KvCacheDtype: pool.DType, PrefillHttpPort: 30000}); err != nil {
		t.Fatal(err)
	}
	if resp, err := c.Engine().ContinueGeneration(ctx); err != nil || len(resp.GetResumed()) != 0 {
		t.Fatalf("ContinueGeneration with nothing held = %v, %v", resp.GetResumed(), err)
	}
	if _, err := c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r-5", BootstrapAddr: addr, Room: 5, PromptLen: 64, MaxNewTokens: 4}); err != nil {
		t.Fatal(err)
	}
	rank := &pb.PrefillRank{BootstrapAddr: addr}
	stream, err := rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: 5, Rank: rank})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination = %v, %v", ev, err)
	}
	dst := ev.GetDestination()
	n := uint32(len(dst.GetPageIndices()))
	tokens := min(uint64(n)*uint64(dst.GetPageSize()), uint64(dst.GetFillLen()))
	if _, err := rooms.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: 5, Rank: rank, NumPages: n, Success: true, Last: true, MetadataRoomMarker: 5,
		Bytes: tokens*dst.GetTokenBytes() + dst.GetStateBytes(), Attempt: dst.GetAttempt()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Engine().RetractRoom(ctx, &pb.RetractRoomRequest{Room: 5, Mode: pb.RetractMode_RETRACT_MODE_REBOOTSTRAP}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Engine().ContinueGeneration(ctx)
	got := resp.GetResumed()
	if err != nil || len(got) != 1 {
		t.Fatalf("ContinueGeneration = %v, %v; want room 5 resumed", got, err)
	}
	if r := got[0]; r.GetRoom() != 5 || r.GetRid() != "r-5" || r.GetAttempt() != 2 || r.GetGenerateUrl() != "http://10.9.8.7:30000/generate" || r.GetPrefillDpRank() != 0 {
		t.Errorf("resumed = %v; want room 5, r-5, attempt 2, http://10.9.8.7:30000/generate, DP rank 0", r)
	}
}
