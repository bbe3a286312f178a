package room

import (
	"slices"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/transfer"
)

// Whole hand-offs, step by step: the room alone, driven by its events, no
// timers, no goroutines. Each step checks the room's state and the effects
// it hands its caller.

// A rebootstrapped room's admission starts its attempt afresh: the
// previous attempt's claims, chunks, marker and progress are not the new
// destination's (the previous attempt's engine calls are the executor's to
// end). A retracted room's admission resumes it (T20).
func TestRoomAdmittedAgainAfterRebootstrap(t *testing.T) {
	g := newRig(t)
	stRequeued.build(g)
	rk := g.rank(0)
	e := g.apply(Admitted{Now: tEvent, Pages: []int32{11, 12, 13, 14}, FillLen: destFill, MetadataSlot: 5})
	if d := diff(digest(g.r, e), eff{Move: "queued -> admitted T11", Note: "4 pages, metadata slot 5", Admission: true, AdmittedAft: 10e9, Offer: "all",
		Phase: PhaseAdmitted, Next: "30s"}); d != "" {
		t.Fatal(d)
	}
	s := g.r.Snapshot(false, true)
	if s.Attempt != 2 || !slices.Equal(s.Pages, []int32{11, 12, 13, 14}) || s.MetadataSlot != 5 || s.BytesTransferred != 0 || s.ChunksDone != 0 ||
		g.r.RanksSeen() != 0 || g.r.Claimed(rk.Key()) || g.r.marker != 0 || g.r.Inflight() != 0 {
		t.Errorf("second attempt: %+v, ranks seen %d, claimed %v, marker %d", s, g.r.RanksSeen(), g.r.Claimed(rk.Key()), g.r.marker)
	}
	for _, c := range g.r.Coverage() {
		if c.Claimed || c.PagesLanded != 0 || c.LastLanded || c.Bytes != 0 || c.PagesRequired != 4 {
			t.Errorf("second attempt's coverage %+v", c)
		}
	}
	// The first attempt's destination is not claimed by its delivery, and
	// its chunks are refused.
	if e := g.apply(Delivered{Now: tEvent, Rank: rk.Key(), Attempt: 1}); e.Move.Moved || g.r.Claimed(rk.Key()) {
		t.Error("the first attempt's delivery claimed the second attempt's destination")
	}
	req := g.chunk(rk, 0)
	req.Attempt = 1
	if e := g.apply(ChunkBegin{Now: tEvent, Req: req, Via: ViaEngine}); errClass(e.Err) != "wrong_state" {
		t.Errorf("the first attempt's chunk: %v", e.Err)
	}
	// Claimed and landed again on attempt 2: it succeeds as a first attempt.
	g.succeed()
	if s := g.r.Snapshot(false, false); s.ChunksDone != 2 || s.BytesTransferred != 2*chunkBytes || g.r.marker != roomID {
		t.Errorf("after the second attempt's transfer: %+v", s)
	}

	// A retracted room's admission resumes it.
	g = newRig(t)
	stRetracted.build(g)
	e = g.apply(Admitted{Now: tEvent, Pages: []int32{8, 9}, MetadataSlot: -1, Resumed: true})
	if d := diff(digest(g.r, e), eff{Move: "retracted -> succeeded T20", Note: "resumed after retraction with 2 pages", Ledger: "running", Phase: PhaseSucceeded}); d != "" {
		t.Error(d)
	}
}

// A room succeeds once its only rank claimed and its chunk landed with the
// marker, then is released once: its resources go back exactly once.
func TestRoomSucceedsThenReleasesOnce(t *testing.T) {
	g := newRig(t)
	stAdmitted.build(g)
	rk := g.rank(0)
	g.attach(rk)
	e := g.apply(Delivered{Now: tClaim, Rank: rk.Key(), Attempt: 1})
	if d := diff(digest(g.r, e), eff{Move: "admitted -> claimed T11", Note: "destination claimed by 1 prefill ranks; waiting timeout 1m0s", Ledger: "claim",
		Phase: PhaseClaimed, Next: "1m3s"}); d != "" {
		t.Fatal(d)
	}
	if e := g.apply(Delivered{Now: tClaim, Rank: rk.Key(), Attempt: 1}); e.Ledger != 0 || g.r.claimedN != 1 {
		t.Error("a second claim of the same rank counted again")
	}
	if !g.r.claimedAt.time().Equal(tClaim) || !g.r.waitingAt.time().Equal(tClaim.Add(waitingTimeout)) {
		t.Errorf("claimed at %v, waiting until %v", g.r.claimedAt.time(), g.r.waitingAt.time())
	}

	// One chunk with every page, the last, with the marker.
	req := ChunkRequest{Room: roomID, Rank: rk, NumPages: 4, Last: true, Marker: roomID, Attempt: 1}
	g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
	e = g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{Bytes: 4096, Duration: time.Millisecond, MarkerWritten: roomID}})
	if d := diff(digest(g.r, e), eff{Move: "claimed -> transferring ", Note: "chunk 0 from " + rk.String() + " landed", Chunk: "ok true 4096 bytes",
		Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m3s"}); d != "" {
		t.Fatal(d)
	}
	if s := g.r.Snapshot(false, false); s.BytesTransferred != 4096 || s.ChunksDone != 1 || g.r.doneN != 1 || g.r.marker != roomID || g.r.Inflight() != 0 {
		t.Errorf("after the last chunk: %+v, done %d, marker %d", s, g.r.doneN, g.r.marker)
	}

	e = g.apply(CheckSuccess{Now: tDone})
	if d := diff(digest(g.r, e), eff{Move: "transferring -> succeeded T12/T17", Note: "1 chunks, 4096 bytes", Ledger: "running", EndClaims: true, ClaimEnd: "done succeeded",
		Finished: "succeeded", SinceOpen: 5e9, Transferred: 3e9, Phase: PhaseSucceeded}); d != "" {
		t.Fatal(d)
	}
	if len(g.r.Ranks()) != 0 || e.ClaimEnd.Done != &phases[PhaseSucceeded] {
		t.Errorf("success: attached %v, claims end with %v", g.r.Ranks(), e.ClaimEnd.Done)
	}

	e = g.apply(Release{Now: tEvent, Why: "released by the decode engine"})
	if d := diff(digest(g.r, e), eff{Move: "succeeded -> released ", Note: "released by the decode engine", Ledger: "release", End: true, Release: true,
		Phase: PhaseReleased}); d != "" {
		t.Fatal(d)
	}
	for _, ev := range []Event{Release{Now: tEvent, Why: "again"}, Fail{Now: tEvent, Failure: Failure{Code: FailureAborted, Message: "late"}}, Close{Now: tEvent}, Deadline{Now: sec(1e6)}} {
		if d := diff(digest(g.r, g.apply(ev)), eff{Phase: PhaseReleased}); d != "" || g.r.Failure() != nil {
			t.Errorf("%T after the release: %s (failure %v)", ev, d, g.r.Failure())
		}
	}
	if tl := g.r.Snapshot(true, false).Transitions; len(tl) != 7 {
		t.Errorf("%d transitions, want 7 (opened, queued, admitted, claimed, transferring, succeeded, released)", len(tl))
	}

	// A room ended with a transfer in flight gives its resources back when
	// that transfer ends, once.
	g = newRig(t)
	stClaimed.build(g)
	started(0)(g)
	if e := g.apply(Release{Now: tEvent, Why: "released at shutdown"}); !e.End || e.Release || !g.r.ReleasePending() {
		t.Errorf("released with a transfer in flight: end %v release %v", e.End, e.Release)
	}
	end := ChunkEnd{Now: sec(11), Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Result: transfer.ChunkResult{Bytes: 1}}
	if e := g.apply(end); !e.Release || e.Ledger != LedgerRelease || g.r.ReleasePending() || g.r.InLedger() {
		t.Errorf("the transfer ended: release %v ledger %s", e.Release, ledgerOps(e.Ledger))
	}
	if e := g.apply(Deadline{Now: sec(1e6)}); e.Release || e.Ledger != 0 {
		t.Error("the resources went back twice")
	}
}

// Writes that may continue (an engine's batch of unknown outcome) hold the
// release until their deadline, unless the process is going away.
func TestRoomReleaseWaitsOutQuarantine(t *testing.T) {
	for _, closed := range []bool{false, true} {
		g := newRig(t)
		stClaimed.build(g)
		started(0)(g)
		e := g.apply(ChunkEnd{Now: tDone, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30)})
		if !e.End || e.Release || !e.QuarantineUntil.Equal(sec(30)) || !g.r.NextDeadline().Equal(sec(30)) {
			t.Fatalf("quarantined failure: end %v release %v until %v, next %v", e.End, e.Release, e.QuarantineUntil, g.r.NextDeadline())
		}
		if closed {
			e = g.apply(Close{Now: sec(6)})
			if !e.Release || e.Ledger != LedgerRelease || g.r.InLedger() || !g.r.NextDeadline().IsZero() {
				t.Errorf("closed: release %v ledger %s; want the resources back at once", e.Release, ledgerOps(e.Ledger))
			}
			continue
		}
		if e := g.apply(Deadline{Now: sec(30).Add(-time.Nanosecond)}); e.Release {
			t.Error("released before the quarantine ended")
		}
		// A later quarantine extends it; an earlier one does not shorten it.
		if e := g.apply(ScatterEnd{Now: sec(6), Err: errBoom, WritesUntil: sec(20)}); !e.QuarantineUntil.IsZero() || !g.r.NextDeadline().Equal(sec(30)) {
			t.Errorf("an earlier quarantine: %v, next %v", e.QuarantineUntil, g.r.NextDeadline())
		}
		e = g.apply(Deadline{Now: sec(30)})
		if !e.Release || e.Ledger != LedgerRelease || g.r.InLedger() || g.r.ReleasePending() || !g.r.NextDeadline().IsZero() {
			t.Errorf("at the quarantine's end: release %v ledger %s", e.Release, ledgerOps(e.Ledger))
		}
	}
}

// A held room's next attempt forgets the previous attempt's destination,
// claims and progress, and records the attempt.
func TestRoomRebootstrapForgetsThePreviousAttempt(t *testing.T) {
	g := newRig(t)
	stHeld.build(g)
	rk := g.rank(0)
	if !g.r.Claimed(rk.Key()) || g.r.marker != roomID || g.r.Snapshot(false, false).BytesTransferred == 0 {
		t.Fatal("the held room did not keep its first attempt")
	}
	e := g.apply(Rebootstrap{Now: tEvent})
	if e.Move.Step.t.attempt != 2 || g.r.Attempt() != 2 {
		t.Errorf("attempt %d (recorded %d), want 2", g.r.Attempt(), e.Move.Step.t.attempt)
	}
	h := g.r.handoff
	if g.r.Pages() != nil || g.r.MetadataSlot() != -1 || h.marker != 0 || h.bytes != 0 || h.chunksDone != 0 || g.r.Plan() != nil || h.ranks != nil || g.r.Claimed(rk.Key()) || g.r.Gated() {
		t.Errorf("previous attempt kept: pages %v slot %d marker %d bytes %d chunks %d plan %v ranks %v", g.r.Pages(), g.r.MetadataSlot(), h.marker, h.bytes, h.chunksDone, g.r.Plan() != nil, h.ranks != nil)
	}
	if g.r.bootstrapAt != stampOf(tEvent.Add(bootstrapTimeout)) || h.claimedAt != 0 || h.waitingAt != 0 || h.admittedAt != 0 || h.claimBy != 0 || h.parkedAt != 0 {
		t.Errorf("bounds: bootstrap %v claimed %v waiting %v admitted %v claimBy %v parked %v", g.r.bootstrapAt.time(), h.claimedAt, h.waitingAt, h.admittedAt, h.claimBy, h.parkedAt)
	}
	if got := e.Move.Step.Public(g.r.Addr(), g.r.Texts()); got.SGLang != "T22" || got.Note != "rebootstrap attempt 2" {
		t.Errorf("transition %+v", got)
	}
}

// The first marker is recorded; a wrong one sticks and nothing later
// replaces it: the success check fails the room as metadata corruption.
func TestRoomWrongMarkerSticks(t *testing.T) {
	g := newRig(t, withTP2)
	stTransferring.build(g)
	g.land(g.rank(0), 1, 0) // no marker: nothing recorded
	if g.r.marker != 0 {
		t.Fatalf("marker %d without one", g.r.marker)
	}
	g.r.markerLanded(99)
	if g.r.marker != 99 {
		t.Fatalf("a wrong marker: %d, want it recorded", g.r.marker)
	}
	g.r.markerLanded(roomID)
	if g.r.marker != 99 {
		t.Fatalf("after a wrong marker the right one replaced it: %d", g.r.marker)
	}

	// Through events: rank 0 writes another room's marker, rank 1 the right
	// one after it.
	g = newRig(t, withTP2)
	stTransferring.build(g)
	req := g.chunk(g.rank(0), 1)
	g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
	g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{MarkerWritten: 99}})
	req = g.chunk(g.rank(1), 1)
	g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
	g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{MarkerWritten: roomID}})
	e := g.apply(CheckSuccess{Now: tEvent})
	if e.Failure == nil || e.Failure.Code != FailureMetadataCorruption || e.Move.SGLang != "T19" ||
		e.Failure.Message != "Metadata corruption detected - bootstrap_room mismatch: metadata slot 2 holds room 99, expected 7" {
		t.Errorf("success check after a wrong marker: %+v (%s)", e.Failure, e.Move.SGLang)
	}
}

// Each phase is bounded by its own deadline, and each deadline fails the
// room with its own code once passed (not a nanosecond before).
func TestRoomDeadlinesPerPhase(t *testing.T) {
	for _, c := range []struct {
		from state
		code FailureCode
	}{
		{stWaitingPrefill, FailureBootstrapTimeout},
		{stResolving, FailureDPRankUnresolved},
		{stQueued, FailureBootstrapTimeout},
		{stAdmitted, FailureClaimTimeout},
		{stAdmitted.with("no claim timeout", withParams(func(p *Params) { p.ClaimTimeout = 0 })).at("5m0s"), FailureBootstrapTimeout},
		{stClaimed, FailureWaitingTimeout},
		{stTransferring, FailureWaitingTimeout},
		{stRetracted, FailureRetractTimeout},
		{stHeld, FailureRetractTimeout},
		{stRebootstrapped, FailureBootstrapTimeout},
		{stReadmitted, FailureClaimTimeout},
		{stSucceeded, FailureUnspecified},
		{stAdopted, FailureUnspecified},
		{stFailed, FailureUnspecified},
		{stReleased, FailureUnspecified},
	} {
		t.Run(c.from.name, func(t *testing.T) {
			g := newRig(t, c.from.opts...)
			c.from.build(g)
			next := g.r.NextDeadline()
			if since(next) != c.from.next {
				t.Fatalf("next deadline %q, want %q", since(next), c.from.next)
			}
			if next.IsZero() {
				if e := g.apply(Deadline{Now: sec(1e6)}); e.Failure != nil || e.Move.Moved {
					t.Errorf("a room without a deadline failed: %+v", e.Failure)
				}
				return
			}
			if e := g.apply(Deadline{Now: next.Add(-time.Nanosecond)}); e.Failure != nil {
				t.Errorf("failed %s a nanosecond before its deadline", e.Failure.Code)
			}
			if e := g.apply(Deadline{Now: next}); e.Failure == nil || e.Failure.Code != c.code {
				t.Errorf("at its deadline: %+v, want %s", e.Failure, c.code)
			}
		})
	}
}

// A room whose DP rank no rule resolves waits, bounded by the resolution
// timeout, and a BindRoom queues it (the resolution bound gone).
func TestRoomResolvesDPRankByBinding(t *testing.T) {
	g := newRig(t, withDP2)
	stResolving.build(g)
	if g.r.Plan() != g.plan || g.r.Staging() || g.r.dpBound() != stampOf(tKnown.Add(dpTimeout)) {
		t.Fatalf("plan %v staging %v dp bound %v", g.r.Plan() == g.plan, g.r.Staging(), g.r.dpBound().time())
	}
	e := g.apply(Bound{Now: tEvent, Addr: addrA, DP: 1})
	if g.r.dpBound() != 0 || g.r.PrefillDP() != 1 || g.r.Snapshot(false, false).DPRule.String() != "binding" || !e.Resolved || !g.r.NextDeadline().Equal(sec(300)) {
		t.Errorf("after BindRoom: dp bound %v, dp %d (%s), next %v", g.r.dpBound(), g.r.PrefillDP(), g.r.Snapshot(false, false).DPRule, g.r.NextDeadline())
	}
}
