package room

import (
	"errors"
	"fmt"
	"testing"

	"github.com/decodeplane/decodeplane/transfer"
)

// The transfer: chunks begun (validated, registered in flight) and ended,
// staged writes and scatters, and the success check (T12/T17, T19).

// begin is ChunkBegin of the request req builds, at tEvent.
func begin(via Via, req func(*rig) ChunkRequest) func(*rig) Event {
	return func(g *rig) Event { return ChunkBegin{Now: tEvent, Req: req(g), Via: via} }
}

// chunkOf is chunk index of rank 0 (see rig.chunk), changed by edit.
func chunkOf(index int, edit func(*ChunkRequest)) func(*rig) ChunkRequest {
	return func(g *rig) ChunkRequest {
		req := g.chunk(g.rank(0), index)
		if edit != nil {
			edit(&req)
		}
		return req
	}
}

// started begins chunk index of rank 0 (nothing ends it).
func started(index int) func(*rig) {
	return func(g *rig) {
		if b := g.apply(ChunkBegin{Now: tLand, Req: g.chunk(g.rank(0), index), Via: ViaEngine}); !b.Begin.Fresh {
			g.t.Fatalf("begin chunk %d: %v", index, b.Err)
		}
	}
}

// landed0 lands chunk 0 of rank 0.
func landed0(g *rig) { g.land(g.rank(0), 0, 0) }

// weight is what chunk index of rank 0 weighs by the destination's weights
// (2 pages of 64 tokens, the last one 72 tokens of the 200 filled).
func weight(g *rig, index int) int64 {
	d := g.r.Destination(g.rank(0).Key())
	heads := int64(8 / g.shape.tp)                             // the rank's share of the 8 KV heads
	if d.TokenBytes != 2*heads*128*2*32 || d.StateBytes != 0 { // K and V x heads x 128 x bf16 x 32 layers
		g.t.Fatalf("destination weights %d per token, %d state", d.TokenBytes, d.StateBytes)
	}
	tokens := []int64{128, 72}[index]
	return tokens * d.TokenBytes
}

func TestChunkBeginRefusals(t *testing.T) {
	refused := func(err string, from state) eff { return eff{Err: err, Phase: from.phase, Next: from.next} }
	rank0 := RankID{Addr: addrA}
	run(t, []row{
		{name: "another prefill instance", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Rank.Addr = addrB })),
			want: refused("invalid rank.bootstrap_addr", stClaimed), says: []string{`"10.0.0.2:8998" is not room 7's prefill instance`}},
		{name: "a failed room", from: stFailed, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: refused("wrong_state", stFailed), says: []string{"chunk 0 of room 7", "the room failed: Aborted by AbortReq."}},
		{name: "the previous attempt's chunk", from: stReadmitted, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Attempt = 1 })),
			want: refused("wrong_state", stReadmitted), says: []string{"it belongs to attempt 1, but the room was rebootstrapped (attempt 2)"}},
		{name: "no destination yet", from: stQueued, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: refused("wrong_state", stQueued), says: []string{"the room has no destination yet (phase queued)"}},
		{name: "another DP rank", from: stClaimed.with("dp 2", withDP2), ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Rank.DP = 1 })),
			want: refused("invalid rank.dp_rank", stClaimed), says: []string{"1 is not room 7's prefill DP rank 0 (single_dp)"}},
		{name: "a rank that sends nothing", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Rank.TP = 5 })),
			want: refused("invalid rank", stClaimed), says: []string{"sends no KV for room 7: it is a dummy target or not addressed by any decode rank"}},
		{name: "a rank that neither claimed nor holds a claim stream", from: stAdmitted, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: refused("wrong_state", stAdmitted), says: []string{"from " + rank0.String(), "this rank has not claimed the destination (call AwaitDestination first)"}},
		{name: "a chunk of a running room", from: stSucceeded, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Index = 5 })),
			want: refused("wrong_state", stSucceeded), says: []string{"chunk 5 of room 7", "phase succeeded"}},
		{name: "pages past the destination", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.PageOffset = 3 })),
			want: refused("invalid page_offset", stClaimed), says: []string{"pages [3, 5) are outside the destination's 4 pages"}},
		{name: "a negative page offset", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.PageOffset = -1 })),
			want: refused("invalid page_offset", stClaimed), says: []string{"pages [-1, 1) are outside"}},
		{name: "a negative page count", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.NumPages = -1 })),
			want: refused("invalid page_offset", stClaimed)},
		{name: "no pages in a chunk that is not the last", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.NumPages = 0 })),
			want: refused("invalid num_pages", stClaimed), says: []string{"must be > 0 (only the last chunk may carry no pages)"}},
		{name: "source pages that do not match", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.SrcPages = []int32{1} })),
			want: refused("invalid source.page_indices", stClaimed), says: []string{"has 1 entries for 2 pages"}},
		{name: "a chunk after the last one", from: stTransferring, prep: started(1), ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Index, r.NumPages = 2, 1 })),
			want: refused("invalid chunk_index", stTransferring), says: []string{"2 comes after this rank's last chunk 1: nothing may follow the last chunk"}},
		{name: "pages sent before", from: stTransferring, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.Index, r.PageOffset = 2, 1 })),
			want: refused("invalid page_offset", stTransferring), says: []string{"pages [1, 3) overlap page 1, which " + rank0.String() + " already sent for room 7: each page is sent once per rank"}},
		{name: "a last chunk with pages never sent", from: stClaimed, ev: begin(ViaEngine, chunkOf(1, nil)),
			want: refused("invalid last", stClaimed), says: []string{"chunk 1 is marked last, but pages [0, 2) of the destination's 4 were never sent by " + rank0.String()}},
		{name: "a last chunk without the room marker", from: stTransferring, ev: begin(ViaEngine, chunkOf(1, func(r *ChunkRequest) { r.Marker = 0 })),
			want: refused("invalid aux", stTransferring), says: []string{"the last chunk of every prefill rank carries the room marker", "chunk 1 has none"}},
		{name: "a reported chunk whose bytes are not its weight", from: stClaimed, ev: begin(ViaReport, chunkOf(0, func(r *ChunkRequest) { r.Bytes = 1 })),
			want: refused("invalid bytes", stClaimed), says: []string{"1 is not what chunk 0 of " + rank0.String() + " weighs: pages [0, 2) carry 16777216 bytes by the layout"}},
		{name: "a retry with other pages", from: stTransferring, ev: begin(ViaEngine, chunkOf(0, func(r *ChunkRequest) { r.NumPages = 1 })),
			want: refused("invalid chunk_index", stTransferring), says: []string{"0 was already sent with pages [0, 2) and last=false; a retry must carry the same page_offset, num_pages and last (got pages [0, 1), last=false)"}},
	})
}

func TestChunkBegin(t *testing.T) {
	fresh := func(from state) eff { return eff{Begin: "fresh", Phase: from.phase, Next: from.next} }
	engineMoves := func(inflight int) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			if g.r.Inflight() != inflight || g.r.handoff.ranks.get(g.rank(0).Key()).engine != (inflight > 0) {
				t.Errorf("in flight %d, want %d", g.r.Inflight(), inflight)
			}
		}
	}
	run(t, []row{
		{name: "through the engine: in flight", from: stClaimed, ev: begin(ViaEngine, chunkOf(0, nil)), want: fresh(stClaimed), check: engineMoves(1)},
		{name: "reported with its weight", from: stClaimed,
			ev: func(g *rig) Event {
				req := g.chunk(g.rank(0), 0)
				req.Bytes = weight(g, 0)
				return ChunkBegin{Now: tEvent, Req: req, Via: ViaReport}
			},
			want: fresh(stClaimed), check: engineMoves(0)},
		{name: "the last reported, with its tokens' weight", from: stTransferring,
			ev: func(g *rig) Event {
				req := g.chunk(g.rank(0), 1)
				req.Bytes = weight(g, 1)
				return ChunkBegin{Now: tEvent, Req: req, Via: ViaReport}
			},
			want: fresh(stTransferring)},
		{name: "an empty last chunk after every page", from: stTransferring,
			prep: func(g *rig) {
				req := g.chunk(g.rank(0), 1)
				req.Last, req.Marker = false, 0
				g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
			},
			ev:   begin(ViaEngine, chunkOf(2, func(r *ChunkRequest) { r.PageOffset, r.NumPages, r.Last, r.Marker = 4, 0, true, roomID })),
			want: fresh(stTransferring)},
		{name: "a retry of a chunk in flight waits for it", from: stClaimed, prep: started(0), ev: begin(ViaEngine, chunkOf(0, nil)),
			want: eff{Begin: "busy", Phase: PhaseClaimed, Next: "1m3s"}, check: engineMoves(1)},
		{name: "a retry of a landed chunk is answered with its result", from: stTransferring, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: eff{Begin: "done 1000 bytes", Phase: PhaseTransferring, Next: "1m3s"}},
		{name: "a retry of a landed chunk of a running room", from: stSucceeded, ev: begin(ViaEngine, chunkOf(1, nil)),
			want: eff{Begin: "done 1000 bytes", Phase: PhaseSucceeded}},
		{name: "a chunk from an attached rank claims it (T11) and stops the claim timeout", from: stAdmitted,
			prep: func(g *rig) { g.attach(g.rank(0)) }, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: eff{Begin: "fresh", Move: "admitted -> claimed T11", Note: "destination claimed by 1 prefill ranks; waiting timeout 1m0s", Ledger: "claim",
				Phase: PhaseClaimed, Next: "1m10s"},
			check: func(t *testing.T, g *rig, e Effects) {
				engineMoves(1)(t, g, e)
				if !g.r.Claimed(g.rank(0).Key()) {
					t.Error("the chunk's rank is not claimed")
				}
			}},
		{name: "a write before every rank claimed stops the claim timeout", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) { g.apply(Delivered{Now: tClaim, Rank: g.rank(0).Key(), Attempt: 1}) }, ev: begin(ViaEngine, chunkOf(0, nil)),
			want: eff{Begin: "fresh", Ledger: "claim", Phase: PhaseAdmitted, Next: "5m0s"}},
		{name: "a reported chunk before every rank claimed keeps the claim timeout", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) { g.apply(Delivered{Now: tClaim, Rank: g.rank(0).Key(), Attempt: 1}) },
			ev: func(g *rig) Event {
				req := g.chunk(g.rank(0), 0)
				req.Bytes = weight(g, 0)
				return ChunkBegin{Now: tEvent, Req: req, Via: ViaReport}
			},
			want: eff{Begin: "fresh", Phase: PhaseAdmitted, Next: "22s"}},
		{name: "a staged chunk closes one of its rank's staging allocations", from: stClaimed.with("staged", withStaging),
			prep: func(g *rig) { g.apply(StagingAllocated{Rank: g.rank(0).Key()}) }, ev: begin(ViaStaging, chunkOf(0, nil)),
			want: eff{Begin: "fresh", Phase: PhaseClaimed, Next: "1m3s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if rp := g.r.handoff.ranks.get(g.rank(0).Key()); rp.stagingOpen != 0 || rp.engine || g.r.Inflight() != 0 {
					t.Errorf("staging allocations open %d, engine %v, in flight %d", rp.stagingOpen, rp.engine, g.r.Inflight())
				}
			}},
	})
}

func TestChunkEnd(t *testing.T) {
	end := func(index int, res transfer.ChunkResult, err error, retryable bool, edit func(*ChunkEnd)) func(*rig) Event {
		return func(g *rig) Event {
			ce := ChunkEnd{Now: tEvent, Req: g.chunk(g.rank(0), index), Via: ViaEngine, Result: res, Err: err, Retryable: retryable}
			if edit != nil {
				edit(&ce)
			}
			return ce
		}
	}
	ok := transfer.ChunkResult{Bytes: chunkBytes}
	last := transfer.ChunkResult{Bytes: chunkBytes, MarkerWritten: roomID}
	rank0 := RankID{Addr: addrA}
	boom := errors.New("boom")
	const failedMsg = "KVTransferError(bootstrap_room=7): chunk 0 from 10.0.0.1:8998[dp 0 cp 0 tp 0 pp 0] failed: boom"
	failed := eff{Err: "transfer_failed", Move: "claimed -> failed T13/T18", Note: failedMsg, Unwait: true, Cancel: true, EndClaims: true,
		ClaimEnd: "failure transfer_failed", Failure: "transfer_failed", Finished: "failed transfer_failed", SinceOpen: 10e9, Chunk: "ok false 0 bytes",
		Ledger: "release", End: true, Release: true, Phase: PhaseFailed}
	progress := func(bytes uint64, chunks, landed int, lastLanded bool) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			s, c := g.r.Snapshot(false, false), g.r.Coverage()[0]
			if s.BytesTransferred != bytes || s.ChunksDone != chunks || c.PagesLanded != landed || c.LastLanded != lastLanded || c.Bytes != bytes || g.r.Inflight() != 0 {
				t.Errorf("bytes %d chunks %d, coverage %+v, in flight %d; want %d bytes, %d chunks, %d pages landed, last %v", s.BytesTransferred, s.ChunksDone, c, g.r.Inflight(), bytes, chunks, landed, lastLanded)
			}
		}
	}
	run(t, []row{
		{name: "the first chunk lands: Transferring, then the success check", from: stClaimed, prep: started(0), ev: end(0, ok, nil, false, nil),
			want: eff{Move: "claimed -> transferring ", Note: "chunk 0 from " + rank0.String() + " landed", Chunk: "ok true 1000 bytes", Then: ThenCheckSuccess,
				Phase: PhaseTransferring, Next: "1m3s"},
			check: progress(1000, 1, 2, false)},
		{name: "the last chunk lands with the marker", from: stTransferring, prep: started(1), ev: end(1, last, nil, false, nil),
			want:  eff{Chunk: "ok true 1000 bytes", Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m3s"},
			check: func(t *testing.T, g *rig, e Effects) { progress(2000, 2, 4, true)(t, g, e); wantDone(t, g, 1, roomID) }},
		{name: "a chunk lands before every rank claimed: still admitted", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) {
				g.apply(Delivered{Now: tClaim, Rank: g.rank(0).Key(), Attempt: 1})
				started(0)(g)
			},
			ev: end(0, ok, nil, false, nil), want: eff{Chunk: "ok true 1000 bytes", Then: ThenCheckSuccess, Phase: PhaseAdmitted, Next: "5m0s"}},
		{name: "nothing landed: the chunk may be sent again", from: stClaimed, prep: started(0),
			ev:   end(0, transfer.ChunkResult{}, fmt.Errorf("%w: agent restarting", transfer.ErrEngineUnavailable), true, nil),
			want: eff{Err: "engine_unavailable", Phase: PhaseClaimed, Next: "1m3s"},
			check: func(t *testing.T, g *rig, e Effects) {
				progress(0, 0, 0, false)(t, g, e)
				if b := g.apply(ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 0), Via: ViaEngine}); !b.Begin.Fresh {
					t.Errorf("the dropped chunk sent again: %+v %v", b.Begin, b.Err)
				}
			}},
		{name: "T13/T18: a failed chunk fails the room", from: stClaimed, prep: started(0), ev: end(0, transfer.ChunkResult{}, boom, false, nil),
			want: failed, says: []string{failedMsg}},
		{name: "T13/T18 with writes that may continue: the release waits out the quarantine", from: stClaimed, prep: started(0),
			ev: end(0, transfer.ChunkResult{}, boom, false, func(c *ChunkEnd) { c.WritesUntil = sec(15) }),
			want: func() eff {
				w := failed
				w.Quarantine, w.Ledger, w.Release, w.Next = "15s", "", false, "15s"
				return w
			}(),
			check: func(t *testing.T, g *rig, _ Effects) {
				if !g.r.ReleasePending() || !g.r.InLedger() {
					t.Error("a quarantined room's resources went back")
				}
			}},
		{name: "T13/T18 quarantined with another chunk in flight: no deadline until that chunk ends", from: stClaimed.with("tp 2", withTP2),
			prep: func(g *rig) {
				started(0)(g)
				g.apply(ChunkBegin{Now: tLand, Req: g.chunk(g.rank(1), 0), Via: ViaEngine})
			},
			ev: end(0, transfer.ChunkResult{}, boom, false, func(c *ChunkEnd) { c.WritesUntil = sec(15) }),
			want: eff{Err: "transfer_failed", Move: "claimed -> failed T13/T18", Note: failedMsg, Unwait: true, Cancel: true, EndClaims: true,
				ClaimEnd: "failure transfer_failed", Failure: "transfer_failed", Finished: "failed transfer_failed", SinceOpen: 10e9, Chunk: "ok false 0 bytes",
				Quarantine: "15s", End: true, Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				e := g.apply(ChunkEnd{Now: sec(11), Req: g.chunk(g.rank(1), 0), Via: ViaEngine, Result: ok})
				if d := diff(digest(g.r, e), eff{Err: "wrong_state", Phase: PhaseFailed, Next: "15s"}); d != "" {
					t.Errorf("the other chunk ends: %s", d)
				}
			}},
		{name: "a chunk in flight when the room failed ends it; the resources go back", from: stClaimed,
			prep: func(g *rig) {
				started(0)(g)
				if e := g.apply(Fail{Now: tDone, Failure: Failure{Code: FailureAborted, Message: "Aborted by AbortReq."}}); e.Release || !g.r.ReleasePending() {
					g.t.Error("released with a chunk in flight")
				}
			},
			ev: end(0, ok, nil, false, nil), want: eff{Move: "failed -> failed ", Note: PagesReusableNote, Err: "wrong_state", Ledger: "release", Release: true, Phase: PhaseFailed},
			says: []string{"chunk 0 of room 7", "the room failed: Aborted by AbortReq."}},
		{name: "a chunk the room does not hold (the previous attempt's)", from: stReadmitted,
			ev:   end(0, ok, nil, false, func(c *ChunkEnd) { c.Via, c.Req.Attempt = ViaReport, 1 }),
			want: eff{Err: "wrong_state", Phase: PhaseAdmitted, Next: "29s"}, says: []string{"the chunk is not the room's (a previous attempt's)"}},
	})
}

// wantDone fails unless n ranks are done and the room's marker is marker.
func wantDone(t *testing.T, g *rig, n int, marker uint64) {
	t.Helper()
	if g.r.doneN != n || g.r.marker != marker {
		t.Errorf("%d ranks done, marker %d; want %d, %d", g.r.doneN, g.r.marker, n, marker)
	}
}

func TestChunkDropped(t *testing.T) {
	g := newRig(t)
	stTransferring.build(g)
	started(1)(g)
	if d := diff(digest(g.r, g.apply(ChunkDropped{Rank: g.rank(0).Key(), Index: 1})), eff{Phase: PhaseTransferring, Next: "1m3s"}); d != "" {
		t.Error(d)
	}
	// The dropped last chunk may be sent again; a landed one may not.
	if b := g.apply(ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 1), Via: ViaEngine}); !b.Begin.Fresh {
		t.Errorf("the dropped chunk sent again: %+v %v", b.Begin, b.Err)
	}
	g.apply(ChunkDropped{Rank: g.rank(0).Key(), Index: 0})
	if b := g.apply(ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 0), Via: ViaEngine}); b.Begin.Fresh {
		t.Error("a landed chunk was dropped")
	}
	// A rank or chunk the room never saw: nothing.
	g.apply(ChunkDropped{Rank: RankID{TP: 3}.Key(), Index: 0})
	g.apply(ChunkDropped{Rank: g.rank(0).Key(), Index: 9})
}

func TestCheckSuccess(t *testing.T) {
	check := func(pending bool) func(*rig) Event {
		return func(*rig) Event { return CheckSuccess{Now: tEvent, ScattersPending: pending} }
	}
	// lastLanded lands the last chunk of every rank without the success
	// check the executor would run.
	lastLanded := func(marker uint64) func(*rig) {
		return func(g *rig) {
			for _, rk := range g.ranks() {
				req := g.chunk(rk, 1)
				g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
				g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{Bytes: chunkBytes, MarkerWritten: marker}})
			}
		}
	}
	succeeded := func(chunks, bytes int) eff {
		return eff{Move: "transferring -> succeeded T12/T17", Note: fmt.Sprintf("%d chunks, %d bytes", chunks, bytes), Ledger: "running", EndClaims: true,
			ClaimEnd: "done succeeded", Finished: "succeeded", SinceOpen: 10e9, Transferred: 8e9, Phase: PhaseSucceeded}
	}
	const corrupt = "Metadata corruption detected - bootstrap_room mismatch: metadata slot 2 holds room 99, expected 7"
	t19 := eff{Move: "transferring -> failed T19", Note: corrupt, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure metadata_corruption",
		Failure: "metadata_corruption", Finished: "failed metadata_corruption", SinceOpen: 10e9, Ledger: "release", End: true, Release: true, Phase: PhaseFailed}
	stStaged := stTransferring.with("staged", withStaging)
	stagingBy := func(g *rig) { g.apply(CheckSuccess{Now: tDone, ScattersPending: true}) }
	run(t, []row{
		{name: "T12/T17: every page and the marker landed", from: stTransferring, prep: lastLanded(roomID), ev: check(false), want: succeeded(2, 2000),
			check: func(t *testing.T, g *rig, _ Effects) {
				if len(g.r.Ranks()) != 0 {
					t.Errorf("claim streams still attached: %v", g.r.Ranks())
				}
			}},
		{name: "T12/T17 of two ranks", from: stTransferring.with("tp 2", withTP2), prep: lastLanded(roomID), ev: check(false), want: succeeded(4, 4000)},
		{name: "a rank still sending: wait", from: stTransferring, ev: check(false), want: eff{Phase: PhaseTransferring, Next: "1m3s"}},
		{name: "one of two ranks done: wait", from: stTransferring.with("tp 2", withTP2),
			prep: func(g *rig) { g.land(g.rank(0), 1, roomID) }, ev: check(false), want: eff{Phase: PhaseTransferring, Next: "1m3s"}},
		{name: "the last chunk landed before an earlier one: wait", from: stClaimed,
			prep: func(g *rig) {
				started(0)(g) // chunk 0 in flight
				lastLanded(roomID)(g)
			},
			ev: check(false), want: eff{Phase: PhaseTransferring, Next: "1m3s"},
			check: func(t *testing.T, g *rig, _ Effects) { wantDone(t, g, 0, roomID) }},
		{name: "every page landed, no marker yet: wait", from: stLandedNoMarker, ev: check(false), want: eff{Phase: PhaseTransferring, Next: "1m3s"}},
		{name: "T19: another room's marker", from: stTransferring, prep: lastLanded(99), ev: check(false), want: t19, says: []string{corrupt}},
		{name: "T19 before every rank is done", from: stTransferring.with("tp 2", withTP2),
			prep: func(g *rig) {
				req := g.chunk(g.rank(0), 1)
				g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
				g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{MarkerWritten: 99}})
			},
			ev: check(false), want: t19},
		{name: "a claimed room has nothing to check", from: stClaimed, ev: check(false), want: eff{Phase: PhaseClaimed, Next: "1m3s"}},
		{name: "a running room has nothing to check", from: stSucceeded, ev: check(false), want: eff{Phase: PhaseSucceeded}},
		{name: "another gate holds it", from: stTransferring,
			prep: func(g *rig) { lastLanded(roomID)(g); g.apply(Gate{Now: tLand, Name: "kv-events", Hold: true}) },
			ev:   check(false), want: eff{Phase: PhaseTransferring, Next: "1m3s"}},
		{name: "staged, scatters pending: the completion timeout replaces the waiting timeout", from: stStaged, prep: lastLanded(roomID), ev: check(true),
			want: eff{Phase: PhaseTransferring, Next: "1m10s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if !g.r.HasGate(StagingGate) {
					t.Error("the staging gate was lifted with scatters pending")
				}
			}},
		{name: "staged, every scatter done: the gate lifts, T12/T17", from: stStaged, prep: lastLanded(roomID), ev: check(false), want: succeeded(4, 4000)},
		{name: "staged, the last scatter done within the completion timeout: T12/T17", from: stStaged,
			prep: func(g *rig) { lastLanded(roomID)(g); stagingBy(g) }, ev: check(false), want: succeeded(4, 4000)},
		{name: "staged, scatters done but no marker: the waiting bound is the completion timeout's", from: stStaged,
			prep: func(g *rig) { lastLanded(0)(g); stagingBy(g) }, ev: check(false), want: eff{Phase: PhaseTransferring, Next: "1m5s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if g.r.Gated() {
					t.Error("the staging gate still holds")
				}
			}},
		{name: "staged, still pending at the next check: the completion timeout stays", from: stStaged,
			prep: func(g *rig) { lastLanded(roomID)(g); stagingBy(g) }, ev: check(true), want: eff{Phase: PhaseTransferring, Next: "1m5s"}},
	})
}

// resultWithMarker is a last chunk's result that wrote the room's marker.
var resultWithMarker = transfer.ChunkResult{Bytes: chunkBytes, MarkerWritten: roomID}
