package kvmanager

// Chunks: idempotency, retries, validation and the proof of success (every page of every rank, the bytes the layout says). The transitions each covers are listed in lifecycle_test.go.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// TestDuplicateChunk: (room, rank, chunk) idempotency during T12
// (decodeplane).
func TestDuplicateChunk(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		first, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 8, false))
		if err != nil || dup {
			t.Fatalf("Transfer = dup %v, %v", dup, err)
		}
		again, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 8, false))
		if err != nil || !dup || again != first {
			t.Errorf("Transfer(retry) = %+v, dup %v, %v; want %+v, true, nil", again, dup, err, first)
		}
		if poll, dup, err := h.m.ReportTransfer(chunk(1, rk, 0, 0, 8, false)); !dup || err != nil || poll != PollTransferring {
			t.Errorf("ReportTransfer(duplicate) = %s, %v, %v; want Transferring, true, nil", poll, dup, err)
		}
		if s := h.snapshot(1); s.ChunksDone != 1 {
			t.Errorf("chunks done = %d, want 1 (a duplicate counts once)", s.ChunksDone)
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 1, 8, 8, true)); err != nil {
			t.Fatalf("Transfer(last) = %v", err)
		}
		h.wantPhase(1, PhaseSucceeded)
		// Retries after success still answer.
		if _, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 1, 8, 8, true)); !dup || err != nil {
			t.Errorf("Transfer(retry after success) = dup %v, %v", dup, err)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestRetryOfInFlightChunkWaits: a retry of a chunk in flight waits for it and
// does not move it twice (T12, decodeplane).
func TestRetryOfInFlightChunkWaits(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		g := newGate(t)
		h.sim.SetFault(g.hook)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		type result struct {
			res transfer.ChunkResult
			dup bool
			err error
		}
		results := make(chan result, 2)
		send := func() {
			res, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true))
			results <- result{res, dup, err}
		}
		go send()
		<-g.entered
		go send()
		synctest.Wait()
		select {
		case r := <-results:
			t.Fatalf("a Transfer returned while the chunk was in flight: %+v", r)
		default:
		}
		if len(g.entered) != 0 {
			t.Fatalf("the retry moved the chunk a second time")
		}
		// The prefill cannot report a chunk the engine is moving.
		if _, _, err := h.m.ReportTransfer(chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("ReportTransfer of a chunk in flight = %v, want ErrWrongState", err)
		}
		g.release <- nil
		a, b := <-results, <-results
		if a.err != nil || b.err != nil || a.dup == b.dup || a.res.Bytes != b.res.Bytes {
			t.Errorf("results %+v and %+v: want one original and one duplicate with the same result", a, b)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// TestRetryAfterCallerGaveUp: a caller's cancelled Transfer lands nothing and
// does not fail the room (no T13); the retry moves the chunk (decodeplane).
func TestRetryAfterCallerGaveUp(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withSim(sim.SimConfig{BandwidthGBytesPerS: 1, Seed: 1}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		// 1000 tokens × 131072 B = 131 MB at 1 GB/s: 131 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, _, err := h.m.Transfer(ctx, chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Transfer with a short deadline = %v, want DeadlineExceeded", err)
		}
		h.wantPhase(1, PhaseClaimed) // nothing landed; the room lives on
		if _, dup, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true)); err != nil || dup {
			t.Fatalf("Transfer(retry) = dup %v, %v; want a fresh move", dup, err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// TestChunkValidation: chunks refused during T11/T12, and a room that waits
// for a missing chunk before T12.
func TestChunkValidation(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		rk := RankID{Addr: addrA}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 16, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("Transfer before the claim = %v, want ErrWrongState", err)
		}
		h.claimAll(1)
		tests := []struct {
			name  string
			req   ChunkRequest
			field string
			is    error
		}{
			{name: "unknown room", req: chunk(2, rk, 0, 0, 1, false), is: ErrRoomNotFound},
			{name: "other instance", req: chunk(1, RankID{Addr: addrB}, 0, 0, 1, false), field: "rank.bootstrap_addr"},
			{name: "other dp", req: chunk(1, RankID{Addr: addrA, DP: 1}, 0, 0, 1, false), field: "rank.dp_rank"},
			{name: "rank not addressed", req: chunk(1, RankID{Addr: addrA, TP: 1}, 0, 0, 1, false), field: "rank"},
			{name: "pages out of range", req: chunk(1, rk, 0, 10, 7, false), field: "page_offset"},
			{name: "empty non-last chunk", req: chunk(1, rk, 0, 0, 0, false), field: "num_pages"},
			{name: "source pages mismatch", req: ChunkRequest{Room: 1, Rank: rk, NumPages: 2, SrcPages: []int32{1}}, field: "source.page_indices"},
		}
		for _, tc := range tests {
			_, _, err := h.m.Transfer(context.Background(), tc.req)
			var inv *InvalidError
			switch {
			case tc.is != nil && !errors.Is(err, tc.is):
				t.Errorf("%s: Transfer = %v, want %v", tc.name, err, tc.is)
			case tc.field != "" && (!errors.As(err, &inv) || inv.Field != tc.field):
				t.Errorf("%s: Transfer = %v, want InvalidError on %s", tc.name, err, tc.field)
			}
		}
		// The coverage contract: indices in any order, no page twice, a last
		// chunk only when it completes the rank's pages, nothing after it.
		var inv *InvalidError
		wantInvalid := func(what string, req ChunkRequest, field string) {
			t.Helper()
			before := h.snapshot(1)
			if _, _, err := h.m.Transfer(context.Background(), req); !errors.As(err, &inv) || inv.Field != field {
				t.Errorf("%s = %v, want InvalidError on %s", what, err, field)
			}
			if after := h.snapshot(1); after.ChunksDone != before.ChunksDone || after.BytesTransferred != before.BytesTransferred || after.Phase != before.Phase {
				t.Errorf("%s changed the room: %+v -> %+v", what, before, after)
			}
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 5, 4, 4, false)); err != nil {
			t.Fatalf("Transfer(chunk 5, pages [4, 8)) = %v", err)
		}
		wantInvalid("a chunk overlapping pages already sent", chunk(1, rk, 6, 7, 2, false), "page_offset")
		wantInvalid("a retry of chunk 5 with other pages", chunk(1, rk, 5, 8, 4, false), "chunk_index")
		wantInvalid("a last chunk leaving pages unsent", chunk(1, rk, 7, 8, 8, true), "last")
		noMarker := chunk(1, rk, 7, 0, 4, false)
		noMarker.Last = true
		h.m.Transfer(context.Background(), chunk(1, rk, 2, 8, 8, false))
		wantInvalid("a last chunk without the room marker", noMarker, "aux")
		if _, _, dup, err := transferDup(h, chunk(1, rk, 5, 4, 4, false)); err != nil || !dup {
			t.Errorf("a retry of chunk 5 = dup %v, %v; want a duplicate", dup, err)
		}
		// Pages [0, 4) never came: the room waits for them and says so.
		h.wantPhase(1, PhaseTransferring)
		if got := h.getRoom(1); !strings.Contains(got.WaitingFor, "12 of 16 pages landed") || got.Coverage[0].PagesLanded != 12 || got.Coverage[0].PagesRequired != 16 {
			t.Errorf("GetRoom: waiting for %q, coverage %+v; want 12 of 16 pages", got.WaitingFor, got.Coverage)
		}
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 0, 0, 4, true)); err != nil {
			t.Fatalf("Transfer(last chunk 0, pages [0, 4)) = %v", err)
		}
		h.wantPhase(1, PhaseSucceeded)
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, rk, 9, 0, 0, true)); !errors.Is(err, ErrWrongState) {
			t.Errorf("a chunk after success = %v, want ErrWrongState", err)
		}
		h.release(1)
		h.assertClean()
	})
}

// TestSuccessNeedsEveryPageOfEveryRank: prefill TP 2 -> decode TP 1 (both
// ranks required): ranks whose last chunks carry no pages, half of them, or
// one rank sending everything and the other nothing never succeed, through
// Transfer and ReportTransfer alike.
func TestSuccessNeedsEveryPageOfEveryRank(t *testing.T) {
	for _, report := range []bool{false, true} {
		t.Run(fmt.Sprintf("report=%v", report), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				h := newHarness(t)
				h.register(instance{addr: addrA, tp: 2})
				h.open(addrA, 3)
				h.claimAll(3)
				ranks := h.requiredRanks(3)
				if len(ranks) != 2 {
					t.Fatalf("required ranks = %v, want 2", ranks)
				}
				pages := h.snapshot(3).NumPages
				send := func(rk RankID, idx, off, n int, last bool) error {
					req := chunk(3, rk, idx, off, n, last)
					if report {
						req.Bytes = h.chunkWeight(3, req)
						_, _, err := h.m.ReportTransfer(req)
						return err
					}
					_, _, err := h.m.Transfer(context.Background(), req)
					return err
				}
				var inv *InvalidError
				if err := send(ranks[0], 0, 0, 0, true); !errors.As(err, &inv) || inv.Field != "last" {
					t.Errorf("an empty last chunk = %v, want InvalidError on last", err)
				}
				if err := send(ranks[0], 0, 0, pages/2, true); !errors.As(err, &inv) || inv.Field != "last" {
					t.Errorf("a last chunk with half the pages = %v, want InvalidError on last", err)
				}
				if err := send(ranks[0], 0, 0, pages, true); err != nil {
					t.Fatalf("rank 0 sends everything: %v", err)
				}
				h.wantPhase(3, PhaseTransferring) // rank 1 sent nothing
				if err := send(ranks[1], 0, 0, pages/2, false); err != nil {
					t.Fatalf("rank 1, first half: %v", err)
				}
				h.wantPhase(3, PhaseTransferring)
				if err := send(ranks[1], 1, pages/2, pages-pages/2, true); err != nil {
					t.Fatalf("rank 1, second half: %v", err)
				}
				s := h.wantPhase(3, PhaseSucceeded)
				if report {
					want := h.chunkWeight(3, chunk(3, ranks[0], 0, 0, pages, true)) + h.chunkWeight(3, chunk(3, ranks[1], 0, 0, pages, true))
					if int64(s.BytesTransferred) != want {
						t.Errorf("bytes = %d, want %d", s.BytesTransferred, want)
					}
				}
				h.release(3)
				h.assertClean()
			})
		})
	}
}

// TestReportedBytesMustMatchTheLayout: a prefill's bytes are checked
// against what its pages weigh; a mismatch (or 2^63) changes nothing.
func TestReportedBytesMustMatchTheLayout(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 4)
		h.claimAll(4)
		rk := h.requiredRanks(4)[0]
		pages := h.snapshot(4).NumPages
		req := chunk(4, rk, 0, 0, pages, true)
		want := h.chunkWeight(4, req)
		for _, b := range []int64{0, want - 1, want + 1, -1 << 63} {
			req.Bytes = b
			var inv *InvalidError
			if _, _, err := h.m.ReportTransfer(req); !errors.As(err, &inv) || inv.Field != "bytes" {
				t.Errorf("bytes %d = %v, want InvalidError on bytes", b, err)
			}
		}
		if s := h.snapshot(4); s.ChunksDone != 0 || s.BytesTransferred != 0 || s.Phase != PhaseClaimed {
			t.Errorf("refused reports changed the room: %+v", s)
		}
		req.Bytes = want
		if _, dup, err := h.m.ReportTransfer(req); err != nil || dup {
			t.Fatalf("ReportTransfer(exact bytes) = %v, %v", dup, err)
		}
		h.wantPhase(4, PhaseSucceeded)
		h.release(4)
		h.assertClean()
	})
}
