package kvmanager

import (
	"context"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// The room's transitions, driven on the room alone: no Manager, no gRPC, no
// timers, no goroutines. Each step checks the room's state and the effects
// it hands its caller.

var t0 = time.Unix(1_700_000_000, 0)

// roomPlan is the plan of a one-rank prefill instance (tp = dp = pp = 1)
// for the default decode layout, from a registry of its own (a pure
// package: no timer, no goroutine).
func roomPlan(t *testing.T) (*room, RankID) {
	t.Helper()
	dec := kvlayout.DefaultConfig()
	reg := newRegistry(DefaultConfig(), dec.Layout(), kvlayout.RealClock{}, false)
	checked, err := reg.Check(Registration{Addr: addrA, Endpoint: "tcp://r", PageSize: dec.Pool.PageSize, KVDType: dec.Pool.DType, HTTPPort: 1,
		Parallel: ParallelInfo{AttnTP: 1, AttnDP: 1, AttnCP: 1, PP: 1, SystemDP: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := reg.Record(checked); err != nil {
		t.Fatal(err)
	}
	inst, ok := reg.Instance(addrA)
	if !ok || !inst.Complete {
		t.Fatalf("instance %s not complete", addrA)
	}
	r := newRoom(7, addrA, 0, -1, t0, 300*time.Second)
	r.plan = inst.Plan
	return r, RankID{Addr: addrA}
}

// wantMove checks that e is the step from → to and that the room is there.
func wantMove(t *testing.T, r *room, e effects, from, to Phase) {
	t.Helper()
	if !e.moved || e.from != from || e.to != to || r.phase != to || Phase(e.t.phase) != to {
		t.Fatalf("effects moved %v %s -> %s (recorded %s), room %s; want %s -> %s", e.moved, e.from, e.to, Phase(e.t.phase), r.phase, from, to)
	}
	if last := r.lastStep(); last != e.t { // OpenRoom's (T1) is derived, not kept
		t.Fatalf("the room's last transition %+v is not the effects' %+v", last, e.t)
	}
}

// admitRoom walks a fresh room to Admitted with a 4-page destination.
func admitRoom(t *testing.T, r *room) {
	t.Helper()
	wantMove(t, r, r.transition(t0, PhaseWaitingPrefill, "T1", numNote(noteOpened, 0, 0)), PhaseUnspecified, PhaseWaitingPrefill)
	e := r.dpResolved(t0, 0, DPRuleSingleDP)
	wantMove(t, r, e, PhaseWaitingPrefill, PhaseQueued)
	if r.prefillDP != 0 || r.dpRule != DPRuleSingleDP || !e.resolved || e.rule != DPRuleSingleDP || e.dp != 0 {
		t.Fatalf("DP resolved: room dp %d (%s), effects %v %s %d", r.prefillDP, r.dpRule, e.resolved, e.rule, e.dp)
	}
	al := prealloc.Allocation{Pages: []int32{3, 4, 5, 6}, FillLen: 200, MetadataSlot: 2}
	r.allocated(al)
	al.Pages[0] = 99 // the room keeps a copy
	e = r.admitted(t0.Add(time.Second))
	wantMove(t, r, e, PhaseQueued, PhaseAdmitted)
	if r.pages[0] != 3 || len(r.pages) != 4 || r.fillLen != 200 || r.metaSlot != 2 || !r.admittedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("admitted: pages %v fill %d slot %d at %v", r.pages, r.fillLen, r.metaSlot, r.admittedAt)
	}
	if !e.admission || e.admittedAfter != time.Second || e.cancelPrev != nil {
		t.Fatalf("admission effects: %v after %v, cancel %v", e.admission, e.admittedAfter, e.cancelPrev != nil)
	}
}

// TestRoomAdmittedAgain: the admission of a rebootstrapped room hands its
// previous attempt's transfer context to the caller to cancel; a retracted
// room's admission resumes it (T20).
func TestRoomAdmittedAgain(t *testing.T) {
	r, _ := roomPlan(t)
	admitRoom(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	r.xferCtx, r.xferCancel = ctx, cancel
	r.phase = PhaseQueued
	e := r.admitted(t0.Add(time.Hour))
	if e.cancelPrev == nil || r.xferCtx != nil || r.xferCancel != nil {
		t.Fatalf("the previous attempt's context stayed with the room (effects cancel %v)", e.cancelPrev != nil)
	}
	e.cancelPrev()
	if ctx.Err() == nil {
		t.Error("cancelPrev is not the previous attempt's cancel")
	}
	r.phase = PhaseRetracted
	r.allocated(prealloc.Allocation{Pages: []int32{8, 9}, MetadataSlot: -1})
	e = r.resumed(t0.Add(2 * time.Hour))
	wantMove(t, r, e, PhaseRetracted, PhaseSucceeded)
	if got := e.t.public(r.addr, r.texts()); got.SGLang != "T20" || got.Note != "resumed after retraction with 2 pages" || e.admission {
		t.Errorf("resume: %+v (admission %v)", got, e.admission)
	}
}

// sendLast marks the rank's whole destination sent, as chunkBeginLocked
// does for one last chunk, and returns the request.
func sendLast(r *room, rp *rankProgress, rk RankID) ChunkRequest {
	rp.cov.init(len(r.pages))
	rp.cov.mark(0, len(r.pages), true)
	rp.last = 0
	return ChunkRequest{Room: r.id, Rank: rk, NumPages: len(r.pages), Last: true, Marker: r.id}
}

func TestRoomSucceedsThenReleasesOnce(t *testing.T) {
	r, rk := roomPlan(t)
	admitRoom(t, r)
	c := &Claim{room: r.id, rank: rk, ch: make(chan DestinationEvent, claimBuffer)}
	r.addClaim(rk.Key(), c)

	rp := r.progress(rk.Key())
	if rp == nil {
		t.Fatal("the required rank has no progress")
	}
	if !r.claimRank(rp) {
		t.Fatal("claimRank of the only required rank: want all claimed")
	}
	if r.claimRank(rp) {
		t.Error("a second claim of the same rank counted again")
	}
	e := r.claimed(t0.Add(2*time.Second), 30*time.Second)
	wantMove(t, r, e, PhaseAdmitted, PhaseClaimed)
	if want := t0.Add(32 * time.Second); !r.waitingAt.Equal(want) || !r.claimedAt.Equal(t0.Add(2*time.Second)) {
		t.Errorf("waitingAt %v claimedAt %v, want %v and the claim's time", r.waitingAt, r.claimedAt, want)
	}

	req := sendLast(r, rp, rk)
	e = r.chunkLanded(t0.Add(3*time.Second), rp, req, transfer.ChunkResult{Bytes: 4096, Duration: time.Millisecond, MarkerWritten: r.id})
	wantMove(t, r, e, PhaseClaimed, PhaseTransferring)
	if !e.chunk || e.chunkRes.Bytes != 4096 || e.markerSet != r.id || !e.checkAfter {
		t.Errorf("chunk effects %+v: want the chunk observed, marker %d for the ledger, the success check", e, r.id)
	}
	if r.bytes != 4096 || r.chunksDone != 1 || !rp.done || r.doneN != 1 || r.marker != r.id {
		t.Errorf("after the last chunk: bytes %d chunks %d rank done %v doneN %d marker %d", r.bytes, r.chunksDone, rp.done, r.doneN, r.marker)
	}

	e = r.succeeded(t0.Add(4 * time.Second))
	wantMove(t, r, e, PhaseTransferring, PhaseSucceeded)
	if e.claims.get(rk.Key()) != c || r.claims.get(rk.Key()) != nil || e.claimEv.Done == nil || *e.claimEv.Done != PhaseSucceeded {
		t.Errorf("success: claims %+v (room keeps %v), event %+v; want the claim moved out with Done(succeeded)", e.claims, r.claims.get(rk.Key()), e.claimEv)
	}
	if !e.finished || e.outcome != PhaseSucceeded || e.transferred != 3*time.Second || e.sinceOpen != 4*time.Second || e.end {
		t.Errorf("success effects: finished %v %s, transferred %v, since open %v, end %v", e.finished, e.outcome, e.transferred, e.sinceOpen, e.end)
	}
	if rel := r.release(t0, false); rel.done || rel.wait {
		t.Errorf("a succeeded room released its resources: %+v", rel)
	}

	e = r.released(t0.Add(5*time.Second), "released by the decode engine")
	wantMove(t, r, e, PhaseSucceeded, PhaseReleased)
	if !e.end || !r.releasePending || e.failure != nil || e.cancel {
		t.Errorf("release effects: end %v pending %v failure %v cancel %v", e.end, r.releasePending, e.failure, e.cancel)
	}
	r.inflight = 1
	if rel := r.release(t0, false); rel.done || rel.wait {
		t.Errorf("released with a transfer in flight: %+v", rel)
	}
	r.inflight = 0
	rel := r.release(t0, false)
	if !rel.done || !rel.ledger || rel.wait || r.inLedger || r.releasePending {
		t.Errorf("release: %+v, in ledger %v, pending %v; want the ledger's record back", rel, r.inLedger, r.releasePending)
	}
	if again := r.release(t0, false); again.done || again.ledger {
		t.Errorf("second release handed resources back again: %+v", again)
	}
	if e := r.released(t0, "again"); e.moved || e.end {
		t.Errorf("releasing a released room: %+v", e)
	}
	if e := r.fail(t0, Failure{Code: FailureAborted, Message: "late"}); e.moved || e.end || r.failure != nil {
		t.Errorf("failing a released room: %+v (failure %v)", e, r.failure)
	}
	if n := len(r.steps()); n != 7 {
		t.Errorf("%d transitions, want 7 (opened, queued, admitted, claimed, transferring, succeeded, released)", n)
	}
}

// TestRoomFailsFromEveryPhase fails a room in each phase it can fail from:
// it is Failed, its claims move out with the failure, transfers are to be
// cancelled, it leaves the waiting rooms, and it ends exactly once.
func TestRoomFailsFromEveryPhase(t *testing.T) {
	for _, p := range []Phase{PhaseWaitingPrefill, PhaseResolvingDP, PhaseQueued, PhaseAdmitted, PhaseClaimed, PhaseTransferring, PhaseSucceeded, PhaseRetracted, PhaseHeld} {
		t.Run(p.String(), func(t *testing.T) {
			r, rk := roomPlan(t)
			if p >= PhaseAdmitted {
				admitRoom(t, r)
			}
			r.phase = p
			c := &Claim{room: r.id, rank: rk, ch: make(chan DestinationEvent, claimBuffer)}
			r.addClaim(rk.Key(), c)
			f := Failure{Code: FailureAborted, Message: "Aborted by AbortReq."}
			e := r.fail(t0.Add(time.Minute), f)
			wantMove(t, r, e, p, PhaseFailed)
			if e.failure == nil || *e.failure != f || r.failure == nil || *r.failure != f || e.claimEv.Failure != e.failure {
				t.Errorf("failure %v (room %v, claim event %+v), want %v", e.failure, r.failure, e.claimEv, f)
			}
			if e.claims.get(rk.Key()) != c || r.claims.get(rk.Key()) != nil {
				t.Error("the claim did not move out of the room")
			}
			if !e.cancel || !e.unwait || !e.end || !r.releasePending {
				t.Errorf("effects cancel %v unwait %v end %v, pending %v; want all", e.cancel, e.unwait, e.end, r.releasePending)
			}
			if !e.finished || e.outcome != PhaseFailed || e.code != FailureAborted || e.sinceOpen != time.Minute {
				t.Errorf("outcome %v %s %s after %v", e.finished, e.outcome, e.code, e.sinceOpen)
			}
			if got := e.t.public(r.addr, r.texts()); got.SGLang != "T16" || got.Note != f.Message {
				t.Errorf("transition %+v, want T16 with the failure's message", got)
			}
			if again := r.fail(t0, Failure{Code: FailureShutdown, Message: "again"}); again.moved || again.end || r.failure.Code != FailureAborted {
				t.Errorf("second failure changed the room: %+v", again)
			}
			if rel := r.release(t0, false); !rel.done || !rel.ledger {
				t.Errorf("release after the failure: %+v", rel)
			}
			if rel := r.release(t0, false); rel.done {
				t.Errorf("second release: %+v", rel)
			}
		})
	}
}

// TestRoomReleaseWaitsOutQuarantine: writes that may continue (a lost
// agent's batch) hold the release until their deadline, unless the
// process is going away.
func TestRoomReleaseWaitsOutQuarantine(t *testing.T) {
	for _, closed := range []bool{false, true} {
		r, _ := roomPlan(t)
		admitRoom(t, r)
		until := t0.Add(10 * time.Second)
		r.quarantine = &quarantine{until: until}
		r.fail(t0, Failure{Code: FailureTransferFailed, Message: "agent lost"})
		rel := r.release(t0.Add(time.Second), closed)
		if closed {
			if !rel.done || !rel.ledger || rel.q == nil || r.quarantine != nil {
				t.Errorf("closed: %+v; want the resources back at once and the quarantine cleared", rel)
			}
			continue
		}
		if !rel.wait || !rel.until.Equal(until) || rel.q != &r.quarantine.dl || rel.done {
			t.Fatalf("quarantined: %+v; want a wait until %v", rel, until)
		}
		rel = r.release(until, false)
		if !rel.done || !rel.ledger || rel.q == nil || r.quarantine != nil || r.inLedger {
			t.Errorf("at the quarantine's end: %+v", rel)
		}
	}
}

// TestRoomRebootstrap: a held room's next attempt forgets the previous
// attempt's destination, claims and progress, and records the attempt.
func TestRoomRebootstrap(t *testing.T) {
	r, rk := roomPlan(t)
	admitRoom(t, r)
	r.addClaim(rk.Key(), &Claim{room: r.id, rank: rk, ch: make(chan DestinationEvent, claimBuffer)})
	rp := r.progress(rk.Key())
	r.claimRank(rp)
	r.hold(stagingGate)
	r.marker, r.bytes, r.chunksDone = r.id, 100, 1
	r.phase = PhaseHeld
	e := r.rebootstrap(t0.Add(time.Hour), 300*time.Second)
	wantMove(t, r, e, PhaseHeld, PhaseWaitingPrefill)
	if r.attempt != 2 || e.t.attempt != 2 {
		t.Errorf("attempt %d (recorded %d), want 2", r.attempt, e.t.attempt)
	}
	if r.pages != nil || r.metaSlot != -1 || r.marker != 0 || r.bytes != 0 || r.chunksDone != 0 || r.plan != nil || r.ranks != nil || r.claims.get(rk.Key()) != nil || r.gated() {
		t.Errorf("previous attempt kept: pages %v slot %d marker %d bytes %d chunks %d plan %v ranks %v gated %v",
			r.pages, r.metaSlot, r.marker, r.bytes, r.chunksDone, r.plan != nil, r.ranks != nil, r.gated())
	}
	if want := stampOf(t0.Add(time.Hour + 300*time.Second)); r.bootstrapAt != want || !r.claimedAt.IsZero() || !r.waitingAt.IsZero() {
		t.Errorf("bootstrapAt %v claimedAt %v waitingAt %v", r.bootstrapAt.time(), r.claimedAt, r.waitingAt)
	}
	if got := e.t.public(r.addr, r.texts()); got.SGLang != "T22" || got.Note != "rebootstrap attempt 2" {
		t.Errorf("transition %+v", got)
	}
}

// TestRoomMarker: the first marker is recorded for the ledger; a wrong one
// sticks and nothing later replaces it.
func TestRoomMarker(t *testing.T) {
	r, _ := roomPlan(t)
	admitRoom(t, r)
	if got := r.markerLanded(0); got != 0 || r.marker != 0 {
		t.Errorf("no marker: %d (room %d)", got, r.marker)
	}
	if got := r.markerLanded(99); got != 99 || r.marker != 99 {
		t.Errorf("a wrong marker: %d (room %d), want it recorded", got, r.marker)
	}
	if got := r.markerLanded(r.id); got != 0 || r.marker != 99 {
		t.Errorf("after a wrong marker the right one replaced it: %d (room %d)", got, r.marker)
	}
}

// TestRoomDeadlines: each phase is bounded by its own deadline, and each
// deadline fails the room with its own code once passed (not before).
func TestRoomDeadlines(t *testing.T) {
	boot, dp, wait := t0.Add(300*time.Second), t0.Add(30*time.Second), t0.Add(60*time.Second)
	for _, c := range []struct {
		phase Phase
		next  time.Time
		code  FailureCode
	}{
		{PhaseWaitingPrefill, boot, FailureBootstrapTimeout},
		{PhaseResolvingDP, dp, FailureDPRankUnresolved},
		{PhaseQueued, boot, FailureBootstrapTimeout},
		{PhaseAdmitted, boot, FailureBootstrapTimeout},
		{PhaseClaimed, wait, FailureWaitingTimeout},
		{PhaseTransferring, wait, FailureWaitingTimeout},
		{PhaseSucceeded, time.Time{}, FailureUnspecified},
		{PhaseRetracted, time.Time{}, FailureUnspecified},
		{PhaseHeld, time.Time{}, FailureUnspecified},
		{PhaseFailed, time.Time{}, FailureUnspecified},
		{PhaseReleased, time.Time{}, FailureUnspecified},
	} {
		r, _ := roomPlan(t)
		admitRoom(t, r)
		r.dpAt, r.waitingAt, r.phase = stampOf(dp), wait, c.phase
		if got := r.nextDeadline(); !got.Equal(c.next) {
			t.Errorf("%s: next deadline %v, want %v", c.phase, got, c.next)
		}
		if c.next.IsZero() {
			if got := r.expired(boot.Add(time.Hour)); got != FailureUnspecified {
				t.Errorf("%s: expired %s, want none", c.phase, got)
			}
			continue
		}
		if got := r.expired(c.next.Add(-time.Nanosecond)); got != FailureUnspecified {
			t.Errorf("%s: expired %s a nanosecond before its deadline", c.phase, got)
		}
		if got := r.expired(c.next); got != c.code {
			t.Errorf("%s: expired %s at its deadline, want %s", c.phase, got, c.code)
		}
	}
	// Resolving its DP rank, a room is also bounded by timeouts.bootstrap.
	r, _ := roomPlan(t)
	r.phase, r.dpAt = PhaseResolvingDP, stampOf(boot.Add(time.Hour))
	if got, want := r.nextDeadline(), boot; !got.Equal(want) {
		t.Errorf("resolving, DP bound after bootstrap: next %v, want %v", got, want)
	}
	if got := r.expired(boot); got != FailureBootstrapTimeout {
		t.Errorf("resolving at timeouts.bootstrap: %s, want %s", got, FailureBootstrapTimeout)
	}
}

// TestRoomResolvesDPRank: a room whose DP rank no rule resolves waits,
// bounded by the resolution timeout, and a BindRoom queues it; a
// rebootstrapped room's new plan starts its rank progress empty.
func TestRoomResolvesDPRank(t *testing.T) {
	r, rk := roomPlan(t)
	plan := r.plan
	r.plan = nil
	r.transition(t0, PhaseWaitingPrefill, "T1", numNote(noteOpened, 0, 0))
	r.prefillKnown(plan)
	if r.plan != plan || r.staging {
		t.Fatalf("plan %v staging %v", r.plan, r.staging)
	}
	e := r.resolvingDP(t0, 10*time.Second, 2, true)
	wantMove(t, r, e, PhaseWaitingPrefill, PhaseResolvingDP)
	if got := r.nextDeadline(); !got.Equal(t0.Add(10 * time.Second)) {
		t.Errorf("resolving: next deadline %v, want the resolution bound", got)
	}
	if got := e.t.public(r.addr, r.texts()).Note; got != addrA+": dp_size 2, follow_bootstrap_room true: waiting for BindRoom" {
		t.Errorf("note %q", got)
	}
	e = r.dpResolved(t0.Add(time.Second), 1, DPRuleBinding)
	wantMove(t, r, e, PhaseResolvingDP, PhaseQueued)
	if r.dpAt != 0 || r.prefillDP != 1 || r.dpRule != DPRuleBinding {
		t.Errorf("after BindRoom: dpAt %v, dp %d (%s)", r.dpAt, r.prefillDP, r.dpRule)
	}
	// A new attempt's plan forgets the previous attempt's rank progress.
	r.admittedOnce()
	r.pages = []int32{1}
	r.claimRank(r.progress(rk.Key()))
	r.prefillKnown(plan)
	if r.ranks != nil || r.claimedN != 0 || r.doneN != 0 {
		t.Errorf("rank progress kept across attempts: ranks %v claimed %d done %d", r.ranks != nil, r.claimedN, r.doneN)
	}
}

// TestRoomSuccessCheck: success waits for every required rank, refuses
// another room's marker, and then waits for the gates and the marker.
func TestRoomSuccessCheck(t *testing.T) {
	r, rk := roomPlan(t)
	admitRoom(t, r)
	if got := r.successCheck(); got != checkWait {
		t.Errorf("admitted: %d, want wait", got)
	}
	rp := r.progress(rk.Key())
	r.claimRank(rp)
	r.claimed(t0, time.Minute)
	r.phase = PhaseTransferring
	if got := r.successCheck(); got != checkWait {
		t.Errorf("no rank done: %d, want wait", got)
	}
	req := sendLast(r, rp, rk)
	r.chunkLanded(t0, rp, req, transfer.ChunkResult{Bytes: 1})
	if got := r.successCheck(); got != checkRanksDone || r.successReady() {
		t.Errorf("every rank done, no marker: %d ready %v, want ranks done and not ready", got, r.successReady())
	}
	r.hold(stagingGate)
	r.markerLanded(r.id)
	if r.successReady() {
		t.Error("ready while a gate holds the room")
	}
	r.unhold(stagingGate)
	if !r.successReady() {
		t.Error("not ready with every rank done, no gate and the marker")
	}
	r.marker = 99
	if got := r.successCheck(); got != checkCorrupt {
		t.Errorf("another room's marker: %d, want corrupt", got)
	}
	r.phase = PhaseSucceeded
	wantMove(t, r, r.retracted(t0), PhaseSucceeded, PhaseRetracted)
	if r.pages != nil {
		t.Error("a retracted room kept its pages")
	}
	r.phase = PhaseSucceeded
	r.pages = []int32{1}
	wantMove(t, r, r.held(t0), PhaseSucceeded, PhaseHeld)
	if r.pages != nil {
		t.Error("a held room kept its pages")
	}
}
