package room

import (
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/transfer"
)

// The ends of a room: failed (from every phase, with each code's SGLang
// label), released, drained until its self-writing ranks acknowledge, and
// its resources back exactly once.

var aborted = Failure{Code: FailureAborted, Message: "Aborted by AbortReq."}

func abort(selfWriter bool) func(*rig) Event {
	return func(*rig) Event { return Fail{Now: tEvent, Failure: aborted, SelfWriter: selfWriter} }
}

// failedFrom is a failure from phase p with code c and message msg, whose
// resources go back at once.
func failedFrom(p Phase, label string, c FailureCode, msg string) eff {
	w := eff{Move: p.String() + " -> failed " + label, Note: msg, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure " + c.String(),
		Failure: c.String(), Finished: "failed " + c.String(), SinceOpen: 10e9, Ledger: "release", End: true, Release: true, Phase: PhaseFailed}
	if c == FailureUnspecified {
		w.Finished = "failed"
	}
	return w
}

// T3, T13–T19 and the timeouts: a failure from each phase a room can fail
// from ends it once, with its claims, its engine calls and its resources.
func TestFailFromEveryPhase(t *testing.T) {
	var rows []row
	for _, from := range []state{stWaitingPrefill, stResolving, stQueued, stAdmitted, stClaimed, stTransferring, stLandedNoMarker,
		stSucceeded, stRetracted, stHeld, stRebootstrapped, stReadmitted, stAdopted} {
		rows = append(rows, row{name: "T16 from " + from.name, from: from, ev: abort(false), want: failedFrom(from.phase, "T16", FailureAborted, aborted.Message),
			says: []string{aborted.Message},
			prep: func(g *rig) {
				if g.r.HandingOff() { // a claim stream attached: the failure ends it
					g.attach(RankID{Addr: addrA})
				}
			},
			check: func(t *testing.T, g *rig, _ Effects) {
				if len(g.r.Ranks()) != 0 || g.r.HandingOff() || g.r.ReleasePending() || g.r.InLedger() {
					t.Errorf("after the failure: attached %v, handing off %v, release pending %v, in ledger %v", g.r.Ranks(), g.r.HandingOff(), g.r.ReleasePending(), g.r.InLedger())
				}
				// Once failed, nothing fails, releases or ends it again.
				for _, ev := range []Event{Fail{Now: tEvent, Failure: Failure{Code: FailureShutdown, Message: "again"}}, Release{Now: tEvent, Why: "released at shutdown"},
					Deadline{Now: sec(1e6)}, Close{Now: tEvent}} {
					if d := diff(digest(g.r, g.apply(ev)), eff{Phase: PhaseFailed}); d != "" || g.r.Failure().Code != FailureAborted {
						t.Errorf("%T after the failure: %s (failure %+v)", ev, d, g.r.Failure())
					}
				}
			}})
	}
	for _, from := range []state{stReleased, stFailed} {
		rows = append(rows, row{name: "an ended room ignores it: " + from.name, from: from, ev: abort(true), want: eff{Phase: from.phase}})
	}
	run(t, rows)
}

// Each failure code is recorded with the SGLang transition it stands for.
func TestFailureCodeLabels(t *testing.T) {
	labels := map[FailureCode]string{
		FailureAborted: "T16", FailurePrefillUnavailable: "T3", FailurePrefillLost: "T15", FailureWaitingTimeout: "T14",
		FailureTransferFailed: "T13/T18", FailureMetadataCorruption: "T19", FailureStagingFailed: "T18",
	}
	var rows []row
	for c := FailureUnspecified; c <= FailureRetractTimeout; c++ {
		msg := "failed with " + c.String()
		rows = append(rows, row{name: c.String(), from: stClaimed,
			ev:   func(*rig) Event { return Fail{Now: tEvent, Failure: Failure{Code: c, Message: msg}} },
			want: failedFrom(PhaseClaimed, labels[c], c, msg)})
	}
	run(t, rows)
	if len(sglangFor) != len(labels) {
		t.Errorf("sglangFor labels %d codes, the test %d", len(sglangFor), len(labels))
	}
}

// Deferred release: the ranks that may still write by themselves owe an
// acknowledgement; the room's record drains until they give it.
func TestFailOwingRanks(t *testing.T) {
	owing := func(from Phase, ranks string) eff {
		return eff{Move: from.String() + " -> failed T16", Note: aborted.Message, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure aborted",
			Owing: ranks, Failure: "aborted", Finished: "failed aborted", SinceOpen: 10e9, Ledger: "drain", End: true,
			Drain: "started: attempt 1 ranks " + ranks + " until 20s acks 0", Phase: PhaseFailed, Next: "20s"}
	}
	reported := func(g *rig) { // chunk 0 of rank 0 moved by the prefill itself
		req := g.chunk(g.rank(0), 0)
		req.Bytes = weight(g, 0)
		g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaReport})
		g.exec(ChunkEnd{Now: tLand, Req: req, Via: ViaReport, Result: transfer.ChunkResult{Bytes: req.Bytes}})
	}
	stDeferredClaimed := stClaimed.with("deferred", withDeferred)
	run(t, []row{
		{name: "a claimed rank of a self-writing prefill", from: stDeferredClaimed, ev: abort(true), want: owing(PhaseClaimed, "[cp 0 tp 0 pp 0]")},
		{name: "both ranks, sorted", from: stClaimed.with("tp 2, deferred", withTP2, withDeferred), ev: abort(true), want: owing(PhaseClaimed, "[cp 0 tp 0 pp 0; cp 0 tp 1 pp 0]")},
		{name: "an attached rank that never claimed was offered the destination", from: stAdmitted.with("deferred", withDeferred),
			prep: func(g *rig) { g.attach(g.rank(0)) }, ev: abort(true), want: owing(PhaseAdmitted, "[cp 0 tp 0 pp 0]")},
		{name: "a rank whose chunks the prefill reported", from: stDeferredClaimed, prep: reported, ev: abort(true),
			want: owing(PhaseTransferring, "[cp 0 tp 0 pp 0]")},
		{name: "a staged rank with a region not reported ready, self-writer or not", from: stClaimed.with("staged, deferred", withStaging, withDeferred),
			prep: func(g *rig) { g.apply(StagingAllocated{Rank: g.rank(1).Key()}) }, ev: abort(false), want: owing(PhaseClaimed, "[cp 0 tp 1 pp 0]")},
		{name: "not a self-writer: nothing owed", from: stDeferredClaimed, ev: abort(false), want: failedFrom(PhaseClaimed, "T16", FailureAborted, aborted.Message)},
		{name: "deferral off: nothing owed", from: stClaimed, ev: abort(true), want: failedFrom(PhaseClaimed, "T16", FailureAborted, aborted.Message)},
		{name: "the daemon's engine moved the rank's chunks: nothing owed", from: stTransferring.with("deferred", withDeferred), ev: abort(true),
			want: failedFrom(PhaseTransferring, "T16", FailureAborted, aborted.Message)},
		{name: "the rank's last chunk landed: nothing owed", from: stDeferredClaimed,
			prep: func(g *rig) {
				reported(g)
				req := g.chunk(g.rank(0), 1)
				req.Bytes = weight(g, 1)
				g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaReport})
				g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaReport, Result: transfer.ChunkResult{Bytes: req.Bytes}}) // no marker: still transferring
			},
			ev: abort(true), want: failedFrom(PhaseTransferring, "T16", FailureAborted, aborted.Message)},
		{name: "no destination: nothing owed", from: stQueued.with("deferred", withDeferred), prep: func(g *rig) { g.attach(g.rank(0)) },
			ev: abort(true), want: failedFrom(PhaseQueued, "T16", FailureAborted, aborted.Message)},
		{name: "a running room owes nothing", from: stSucceeded.with("deferred", withDeferred), ev: abort(true),
			want: failedFrom(PhaseSucceeded, "T16", FailureAborted, aborted.Message)},
		{name: "a running staged room owes nothing for a region never reported ready", from: stSucceeded.with("staged, deferred", withStaging, withDeferred),
			prep: func(g *rig) { g.apply(StagingAllocated{Rank: g.rank(0).Key()}) }, ev: abort(true),
			want: failedFrom(PhaseSucceeded, "T16", FailureAborted, aborted.Message)},
		{name: "after Close nothing is owed", from: stDeferredClaimed, prep: func(g *rig) { g.apply(Close{Now: tLand}) }, ev: abort(true),
			want: failedFrom(PhaseClaimed, "T16", FailureAborted, aborted.Message)},
		{name: "a chunk in flight: the drain starts when it ends", from: stDeferredClaimed,
			prep: func(g *rig) {
				reported(g)
				started(1)(g)
			},
			ev: abort(true),
			want: eff{Move: "transferring -> failed T16", Note: aborted.Message, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure aborted",
				Failure: "aborted", Finished: "failed aborted", SinceOpen: 10e9, End: true, Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				// The rank's engine moved its last chunk: it owes nothing, and
				// the resources go back when that chunk ends.
				e := g.apply(ChunkEnd{Now: sec(11), Req: g.chunk(g.rank(0), 1), Via: ViaEngine, Result: transfer.ChunkResult{Bytes: 1}})
				if d := diff(digest(g.r, e), eff{Move: "failed -> failed ", Note: PagesReusableNote, Err: "wrong_state", Ledger: "release", Release: true, Phase: PhaseFailed}); d != "" {
					t.Error(d)
				}
			}},
		{name: "the allocator no longer holds the room: no ledger release", from: stHeld,
			ev: func(*rig) Event {
				return Fail{Now: tEvent, LedgerGone: true, Failure: Failure{Code: FailureUnspecified, Message: "rebootstrap of room 7 refused at ContinueGeneration"}}
			},
			want: func() eff {
				w := failedFrom(PhaseHeld, "", FailureUnspecified, "rebootstrap of room 7 refused at ContinueGeneration")
				w.Ledger = ""
				return w
			}()},
	})
}

// A rank whose chunks the daemon's engine moves owes nothing, even from a
// self-writing prefill; a staged rank with an open region owes its ack,
// and its drain (with its bound) starts only once the scatter in flight
// ended.
func TestDrainStartsWhenNothingIsInFlight(t *testing.T) {
	g := newRig(t, withDeferred)
	stClaimed.build(g)
	started(0)(g)
	if e := g.apply(Fail{Now: tEvent, Failure: aborted, SelfWriter: true}); e.Owing != nil || e.DrainStarted || e.Release {
		t.Errorf("an engine's rank: owing %v, drain %v, release %v", e.Owing, e.DrainStarted, e.Release)
	}
	g2 := newRig(t, withDeferred, withStaging)
	stClaimed.build(g2)
	g2.apply(StagingAllocated{Rank: g2.rank(0).Key()})
	g2.apply(ScatterBegin{})
	e := g2.apply(Fail{Now: tEvent, Failure: aborted})
	if d := diff(digest(g2.r, e), eff{Move: "claimed -> failed T16", Note: aborted.Message, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure aborted",
		Owing: "[cp 0 tp 0 pp 0]", Failure: "aborted", Finished: "failed aborted", SinceOpen: 10e9, End: true, Phase: PhaseFailed}); d != "" {
		t.Errorf("fail with a scatter in flight:\n\t%s", d)
	}
	e = g2.apply(ScatterEnd{Now: sec(12), Chunk: 0})
	if d := diff(digest(g2.r, e), eff{Err: "wrong_state", Ledger: "drain", Drain: "started: attempt 1 ranks [cp 0 tp 0 pp 0] until 22s acks 0",
		Phase: PhaseFailed, Next: "22s"}); d != "" {
		t.Errorf("the last scatter ends:\n\t%s", d)
	}
}

func TestRelease(t *testing.T) {
	release := func(why string) func(*rig) Event {
		return func(*rig) Event { return Release{Now: tEvent, Why: why} }
	}
	released := func(from Phase, why string) eff {
		return eff{Move: from.String() + " -> released ", Note: why, Ledger: "release", End: true, Release: true, Phase: PhaseReleased}
	}
	const byEngine, atShutdown = "released by the decode engine", "released at shutdown"
	run(t, []row{
		{name: "the engine releases a running room", from: stSucceeded, ev: release(byEngine), want: released(PhaseSucceeded, byEngine),
			check: func(t *testing.T, g *rig, _ Effects) {
				if already, err := g.r.CanRelease(); !already || err != nil {
					t.Errorf("CanRelease after the release: %v %v", already, err)
				}
				if d := diff(digest(g.r, g.apply(Release{Now: sec(11), Why: byEngine})), eff{Phase: PhaseReleased}); d != "" {
					t.Errorf("released again: %s", d)
				}
			}},
		{name: "an adopted room", from: stAdopted, ev: release(byEngine), want: released(PhaseSucceeded, byEngine)},
		{name: "shutdown releases a retracted room", from: stRetracted, ev: release(atShutdown), want: released(PhaseRetracted, atShutdown)},
		{name: "shutdown releases a held room", from: stHeld, ev: release(atShutdown), want: released(PhaseHeld, atShutdown)},
		{name: "shutdown releases a live room", from: stClaimed, ev: release(atShutdown), want: released(PhaseClaimed, atShutdown)},
		{name: "a room released with a note of its own", from: stSucceeded, ev: release("released: engine restarted"),
			want: released(PhaseSucceeded, "released: engine restarted"),
			check: func(t *testing.T, g *rig, _ Effects) {
				if tx := g.r.Texts(); len(tx) != 1 || tx[0] != "released: engine restarted" {
					t.Errorf("texts %q", tx)
				}
			}},
		{name: "a failed room stays failed", from: stFailed, ev: release(atShutdown), want: eff{Phase: PhaseFailed}},
	})
}

func TestCanRelease(t *testing.T) {
	for _, c := range []struct {
		from    state
		already bool
		err     string
		says    string
	}{
		{from: stSucceeded},
		{from: stRetracted},
		{from: stHeld},
		{from: stAdopted},
		{from: stReleased, already: true},
		{from: stFailed, err: "wrong_state", says: "release room 7: operation not valid in the room's state: the room failed (its pages are already back): Aborted by AbortReq."},
		{from: stTransferring, err: "wrong_state", says: "release room 7: operation not valid in the room's state: the room has not succeeded (phase transferring); abort it instead"},
		{from: stQueued, err: "wrong_state", says: "(phase queued)"},
	} {
		g := newRig(t, c.from.opts...)
		c.from.build(g)
		already, err := g.r.CanRelease()
		if already != c.already || errClass(err) != c.err || (c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says))) {
			t.Errorf("%s: CanRelease %v, %v; want %v, %s %q", c.from.name, already, err, c.already, c.err, c.says)
		}
	}
}

// draining is a claimed room of a self-writing prefill failed at tDone:
// its ranks owe acks until tDone + deferred (15 s).
func draining(opts ...rigOpt) state {
	return state{name: "draining", opts: append([]rigOpt{withDeferred}, opts...), build: func(g *rig) {
		stClaimed.build(g)
		g.want(g.apply(Fail{Now: tDone, Failure: aborted, SelfWriter: true}), PhaseFailed)
	}, phase: PhaseFailed, next: "15s"}
}

func TestAck(t *testing.T) {
	ack := func(rank int, attempt uint32, edit func(*RankID)) func(*rig) Event {
		return func(g *rig) Event {
			rk := g.rank(rank)
			if edit != nil {
				edit(&rk)
			}
			return Ack{Now: tEvent, Rank: rk, Attempt: attempt}
		}
	}
	run(t, []row{
		{name: "the last owing rank: the resources go back", from: draining(), ev: ack(0, 1, nil),
			want: eff{Move: "failed -> failed ", Note: PagesReusableNote, Ack: "owed true remaining 0 released true", Drain: "acked: attempt 1 ranks none until  acks 1", Ledger: "release", Release: true, Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				if g.r.Draining() || g.r.DrainWaiting() != "" {
					t.Error("still draining")
				}
				if d := diff(digest(g.r, g.apply(Ack{Now: sec(11), Rank: g.rank(0), Attempt: 1})), eff{Phase: PhaseFailed}); d != "" {
					t.Errorf("acked again: %s", d)
				}
			}},
		{name: "one of two owing ranks", from: draining(withTP2), ev: ack(1, 1, nil),
			want: eff{Ack: "owed true remaining 1 released false", Drain: "acked: attempt 0 ranks none until  acks 0", Phase: PhaseFailed, Next: "15s"}},
		{name: "a rank that owes nothing is accepted", from: draining(withTP2),
			prep: func(g *rig) { g.apply(Ack{Now: sec(6), Rank: g.rank(1), Attempt: 1}) }, ev: ack(1, 1, nil),
			want: eff{Ack: "owed false remaining 1 released false", Phase: PhaseFailed, Next: "15s"}},
		{name: "a rank of another DP rank owes nothing", from: draining(withDP2), ev: ack(0, 1, func(r *RankID) { r.DP = 1 }),
			want: eff{Ack: "owed false remaining 1 released false", Phase: PhaseFailed, Next: "15s"}},
		{name: "another attempt's ack is stale", from: draining(), ev: ack(0, 2, nil), want: eff{Err: "stale_attempt", Phase: PhaseFailed, Next: "15s"},
			says: []string{"ack end of room 7: stale attempt: attempt 2, the room's attempt is 1"}},
		{name: "another prefill instance", from: draining(), ev: ack(0, 1, func(r *RankID) { r.Addr = addrB }),
			want: eff{Err: "invalid rank.bootstrap_addr", Phase: PhaseFailed, Next: "15s"}},
		{name: "a live room owes nothing", from: stClaimed, ev: ack(0, 1, nil), want: eff{Phase: PhaseClaimed, Next: "1m3s"}},
		{name: "a room that failed with nothing owed", from: stFailed, ev: ack(0, 1, nil), want: eff{Phase: PhaseFailed}},
		{name: "the last ack before the drain started: the resources go back when nothing is in flight", from: stClaimed.with("tp 2, deferred", withTP2, withDeferred),
			prep: func(g *rig) {
				started(0)(g) // rank 0's engine moves its chunk: it owes nothing
				g.want(g.apply(Fail{Now: tDone, Failure: aborted, SelfWriter: true}), PhaseFailed)
			},
			ev: ack(1, 1, nil), want: eff{Ack: "owed true remaining 0 released false", Drain: "acked: attempt 1 ranks none until  acks 1", Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				e := g.apply(ChunkEnd{Now: sec(11), Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Result: transfer.ChunkResult{Bytes: 1}})
				if d := diff(digest(g.r, e), eff{Move: "failed -> failed ", Note: PagesReusableNote, Err: "wrong_state", Ledger: "release", Release: true, Phase: PhaseFailed}); d != "" {
					t.Errorf("the chunk in flight ends: %s", d)
				}
			}},
		{name: "the last ack while writes may continue: the quarantine still holds the resources", from: stClaimed.with("tp 2, deferred", withTP2, withDeferred),
			prep: func(g *rig) {
				// Rank 0's chunk failed with writes that may continue, while
				// rank 1 writes by itself.
				started(0)(g)
				g.apply(ChunkEnd{Now: tDone, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30), SelfWriter: true})
			},
			ev: ack(1, 1, nil), want: eff{Ack: "owed true remaining 0 released false", Drain: "acked: attempt 1 ranks none until  acks 1", Phase: PhaseFailed, Next: "30s"}},
	})
}

// errBoom is an engine's failure of a chunk.
var errBoom = transfer.ErrTransferFailed

func TestClose(t *testing.T) {
	closeAt := func(n float64) func(*rig) Event { return func(*rig) Event { return Close{Now: sec(n)} } }
	quarantined := state{name: "quarantined", build: func(g *rig) {
		stClaimed.build(g)
		started(0)(g)
		g.apply(ChunkEnd{Now: tDone, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30)})
	}, phase: PhaseFailed, next: "30s"}
	run(t, []row{
		{name: "a quarantined room gives its resources back at once", from: quarantined, ev: closeAt(10),
			want: eff{Ledger: "release", Release: true, Phase: PhaseFailed}},
		{name: "a draining room gives its resources back at once", from: draining(), ev: closeAt(10),
			want: eff{Ledger: "release", Release: true, Phase: PhaseFailed}},
		{name: "a live room is left as it is", from: stClaimed, ev: closeAt(10), want: eff{Phase: PhaseClaimed, Next: "1m3s"}},
		{name: "a failed room with a chunk in flight waits for it", from: stClaimed,
			prep: func(g *rig) { started(0)(g); g.apply(Fail{Now: tDone, Failure: aborted}) }, ev: closeAt(10),
			want: eff{Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				e := g.apply(ChunkEnd{Now: sec(11), Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30)})
				if d := diff(digest(g.r, e), eff{Err: "wrong_state", Ledger: "release", Release: true, Quarantine: "30s", Phase: PhaseFailed}); d != "" {
					t.Errorf("the chunk ends after Close: %s", d)
				}
			}},
		{name: "a released room has nothing left", from: stReleased, ev: closeAt(10), want: eff{Phase: PhaseReleased}},
	})
}
