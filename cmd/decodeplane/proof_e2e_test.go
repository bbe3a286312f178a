package main

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestRoomsE2ESuccessIsAProof: a prefill TP 2 -> decode TP 1 room of 1,000
// tokens (131,072,000 bytes) through the real binary. Last chunks that carry
// no pages, half of them, or one rank sending everything and the other
// nothing never make the room SUCCEEDED, through Transfer and ReportTransfer
// alike; a mismatched byte count or a last chunk without the marker is
// refused naming the field and changes nothing. Only full coverage from both
// ranks succeeds, and GetRoom shows the coverage on the way.
func TestRoomsE2ESuccessIsAProof(t *testing.T) {
	t.Parallel()
	roomsOverBoth(t, func(t *testing.T, tr roomsTransport) {
		d := roomsStartOver(t, tr, "kv_pool:\n  kind: gqa\n", "")
		ctx := roomsCtx(t)
		for i, report := range []bool{false, true} {
			t.Run(fmt.Sprintf("report=%v", report), func(t *testing.T) {
				addr := fmt.Sprintf("10.0.9.%d:8998", i+1)
				room := uint64(9100 + i)
				const prompt = 1000
				ranks := d.startRanks(t, roomsInstance(addr, 2, 1, "", roomsGQAModel)...)
				if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, prompt)); err != nil {
					t.Fatal(err)
				}
				_, dest0 := roomsAwaitDestination(t, ctx, ranks[0], room)
				_, dest1 := roomsAwaitDestination(t, ctx, ranks[1], room)
				n := uint32(len(dest0.GetPageIndices()))
				if want := uint64(2 * 4 * 128 * 2 * 32); dest0.GetTokenBytes() != want || dest1.GetTokenBytes() != want {
					t.Fatalf("token_bytes %d/%d, want %d (half the heads each)", dest0.GetTokenBytes(), dest1.GetTokenBytes(), want)
				}
				send := func(r *roomsRank, dest *pb.Destination, index, off, pages uint32, last bool, bytesDelta int64) error {
					ch := client.Chunk{Destination: dest, Index: int(index), PageOffset: int(off), NumPages: int(pages), Last: last}
					if report {
						req := &pb.ReportTransferRequest{Room: room, Rank: r.Rank(), ChunkIndex: index, PageOffset: off, NumPages: pages,
							Last: last, Success: true, Bytes: uint64(int64(ch.Bytes()) + bytesDelta)}
						if last {
							req.MetadataRoomMarker = room
						}
						_, err := r.report(ctx, req)
						return err
					}
					_, err := roomsTransfer(ctx, r, dest, index, off, pages, last)
					return err
				}
				refused := func(what, field string, err error) {
					t.Helper()
					if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), field) {
						t.Errorf("%s: %v, want InvalidArgument naming %s", what, err, field)
					}
					if got := d.getRoom(t, ctx, room); got.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
						t.Fatalf("%s: the room SUCCEEDED: %v", what, got)
					}
				}
				refused("rank 0: a last chunk with no pages", "last", send(ranks[0], dest0, 0, 0, 0, true, 0))
				refused("rank 0: a last chunk with half the pages", "last", send(ranks[0], dest0, 0, 0, n/2, true, 0))
				if report {
					refused("rank 0: bytes one short", "bytes", send(ranks[0], dest0, 0, 0, n, true, -1))
				} else {
					req := &pb.TransferRequest{Room: room, Rank: ranks[0].Rank(), ChunkIndex: 0, NumPages: n, Last: true}
					_, err := ranks[0].chunk(ctx, req)
					refused("rank 0: a last chunk without aux", "aux", err)
				}
				if err := send(ranks[0], dest0, 0, 0, n, true, 0); err != nil {
					t.Fatalf("rank 0 sends every page: %v", err)
				}
				got := d.getRoom(t, ctx, room)
				if got.GetPhase() != pb.RoomPhase_ROOM_PHASE_TRANSFERRING {
					t.Fatalf("one rank sent everything, the other nothing: %s, want TRANSFERRING", got.GetPhase())
				}
				cov := got.GetCoverage()
				if len(cov) != 2 || cov[0].GetPagesLanded() != n || cov[1].GetPagesLanded() != 0 || cov[0].GetPagesRequired() != n {
					t.Errorf("coverage %v, want %d/%d and 0/%d", cov, n, n, n)
				}
				if !strings.Contains(got.GetWaitingFor(), "cp 0 tp 1 pp 0 (0 of") {
					t.Errorf("waiting_for %q does not name rank 1's missing pages", got.GetWaitingFor())
				}
				if err := send(ranks[1], dest1, 0, 0, n/2, false, 0); err != nil {
					t.Fatalf("rank 1, the first half: %v", err)
				}
				refused("rank 1: a chunk overlapping its first half", "page_offset", send(ranks[1], dest1, 1, n/2-1, 2, false, 0))
				if err := send(ranks[1], dest1, 2, n/2, n-n/2, true, 0); err != nil {
					t.Fatalf("rank 1, the rest: %v", err)
				}
				got, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
				if err != nil {
					t.Fatal(err)
				}
				if want := uint64(prompt * 2 * 8 * 128 * 2 * 32); got.GetBytesTransferred() != want {
					t.Errorf("bytes transferred %d, want %d (1,000 tokens of the layout)", got.GetBytesTransferred(), want)
				}
				d.release(t, ctx, got)
			})
		}
		d.assertDrained(t)
	})
}
