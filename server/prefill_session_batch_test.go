package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestPrefillSessionPackedOps: ops packed into one message
// (PrefillRequest.more) are each handled as if sent alone, in order: the
// claims of two rooms and a ping in one message get their results, the
// destinations and the pong; the chunks of both rooms in one message land
// and both rooms succeed.
func TestPrefillSessionPackedOps(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	s := openSession(t, ctx, w.s.conn)
	s.hello(prank(w.addr, 0), 0)
	openSmall(w, 7)
	openSmall(w, 8)
	c7, c8 := claimOp(7), claimOp(8)
	c7.Seq, c8.Seq = 1, 2
	c7.More = []*pb.PrefillRequest{pingOp(), c8}
	s.seq = 2
	s.send(c7)
	dests := map[uint64]*pb.Destination{}
	results, pongs := map[uint64]bool{}, 0
	for len(dests) < 2 || len(results) < 2 || pongs < 1 {
		ev := s.recv()
		switch {
		case ev.GetResult() != nil:
			r := ev.GetResult()
			if r.GetError() != nil || r.GetClaim() == nil {
				t.Fatalf("claim result = %v", r)
			}
			results[r.GetSeq()] = true
		case ev.GetPong() != nil:
			pongs++
		case ev.GetRoom().GetEvent().GetDestination() != nil:
			dests[ev.GetRoom().GetRoom()] = ev.GetRoom().GetEvent().GetDestination()
		default:
			t.Fatalf("unexpected %v", ev)
		}
	}
	if !results[1] || !results[2] {
		t.Fatalf("claim results for seqs %v, want 1 and 2", results)
	}
	k7, k8 := chunkOp(lastChunk(7, dests[7])), chunkOp(lastChunk(8, dests[8]))
	k7.Seq, k8.Seq = 3, 4
	k7.More = []*pb.PrefillRequest{k8}
	s.seq = 4
	s.send(k7)
	chunks, ends := map[uint64]bool{}, map[uint64]bool{}
	for len(chunks) < 2 || len(ends) < 2 {
		ev := s.recv()
		switch {
		case ev.GetResult() != nil:
			if r := ev.GetResult(); r.GetError() != nil || r.GetChunk() == nil {
				t.Fatalf("chunk result = %v", r)
			}
			chunks[ev.GetResult().GetSeq()] = true
		case ev.GetRoom().GetEvent().GetDone() != nil || ev.GetRoom().GetEvent().GetFailure() != nil:
			if ev.GetRoom().GetEvent().GetFailure() != nil {
				t.Fatalf("room end = %v", ev)
			}
			ends[ev.GetRoom().GetRoom()] = true
		}
	}
	for _, room := range []uint64{7, 8} {
		if p := w.phase(room); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Errorf("room %d is %v, want SUCCEEDED", room, p)
		}
	}
}

// TestPrefillSessionSeqOutOfBound: an op whose seq is beyond its bound
// (2^63-1) is refused INVALID_ARGUMENT naming seq, the stream stays open,
// and the refused seq does not move the session's sequence: the next op
// with a seq above the last good one runs.
func TestPrefillSessionSeqOutOfBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	s := openSession(t, ctx, w.s.conn)
	s.hello(prank(w.addr, 0), 0)
	openSmall(w, 7)
	big := claimOp(7)
	big.Seq = 1 << 63
	s.send(big)
	if r := s.result(1 << 63); r.GetError() == nil || !strings.Contains(r.GetError().GetMessage(), "seq") {
		t.Fatalf("seq 2^63 = %v, want INVALID_ARGUMENT naming seq", r)
	}
	ok := claimOp(7)
	ok.Seq = 1
	s.send(ok)
	if r := s.result(1); r.GetError() != nil || r.GetClaim() == nil {
		t.Fatalf("then seq 1 = %v, want the claim", r)
	}
}

// TestPrefillSessionViolationAfterAnOp: a protocol violation sent right
// after an op (without reading) ends the stream after the op's result.
func TestPrefillSessionViolationAfterAnOp(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	for i := range 10 {
		s := openSession(t, ctx, w.s.conn)
		s.hello(prank(w.addr, 0), 0)
		ok := claimOp(uint64(100 + i))
		ok.Seq = 5
		bad := claimOp(uint64(200 + i))
		bad.Seq = 3
		s.send(ok)
		s.send(bad)
		if r := s.result(5); r.GetError() != nil || r.GetClaim() == nil {
			t.Fatalf("try %d: result 5 = %v, want the claim", i, r)
		}
		wantEnd(t, "seq 3 after 5", s.streamEnd(), codes.InvalidArgument, "seq: 3 must be > 0 and above the previous op's 5")
	}
}

// TestPrefillSessionPacksOnlyWhenAsked: the daemon's header says it reads
// packed requests; it packs its events (PrefillEvent.more) only for a
// client whose metadata asks for it (pb.PackKey): 1,300 pongs queued by a
// tight loop come one per message to a client that did not ask, and some
// share a message for one that did.
func TestPrefillSessionPacksOnlyWhenAsked(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	const messages = 20
	pongs := messages * (1 + pb.MaxPrefillRequestsPerMessage)
	burst := func(t *testing.T, ctx context.Context) int {
		s := openSession(t, ctx, w.s.conn)
		md, err := s.st.Header()
		if err != nil || !slices.Contains(md.Get(pb.PackKey), pb.PackMore) {
			t.Errorf("response header %v (%v), want %s: %s", md, err, pb.PackKey, pb.PackMore)
		}
		s.hello(prank(w.addr, 0), 0)
		for range messages {
			m := pingOp()
			m.More = slices.Repeat([]*pb.PrefillRequest{pingOp()}, pb.MaxPrefillRequestsPerMessage)
			s.send(m)
		}
		got, n := 0, 0
		for got < pongs {
			ev, err := s.st.Recv()
			if err != nil {
				t.Fatalf("Recv after %d pongs: %v", got, err)
			}
			n++
			for _, e := range append([]*pb.PrefillEvent{ev}, ev.GetMore()...) {
				if e.GetPong() == nil {
					t.Fatalf("event %v, want a pong", e)
				}
				got++
			}
		}
		return n
	}
	t.Run("not asked", func(t *testing.T) {
		if n := burst(t, ctx); n != pongs {
			t.Errorf("%d pongs came in %d messages, want one each (the client did not ask for packing)", pongs, n)
		}
	})
	t.Run("asked", func(t *testing.T) {
		if n := burst(t, metadata.AppendToOutgoingContext(ctx, pb.PackKey, pb.PackMore)); n >= pongs {
			t.Errorf("%d pongs came in %d messages, want fewer (packed)", pongs, n)
		}
	})
}
