package room

import (
	"errors"
	"fmt"
	"testing"
)

// Staged rooms: a rank's writes into staging regions (AllocateStaging,
// ChunkReady), the scatters into the pages, and the success gates.

func TestStagingWrite(t *testing.T) {
	write := func(edit func(*RankID), staged bool) func(*rig) Event {
		return func(g *rig) Event {
			rk := g.rank(0)
			if edit != nil {
				edit(&rk)
			}
			return StagingWrite{Now: tEvent, Rank: rk, What: "AllocateStaging", Staged: staged}
		}
	}
	stStagedAdmitted, stStagedClaimed := stAdmitted.with("staged", withStaging), stClaimed.with("staged", withStaging)
	refused := func(err string, from state) eff { return eff{Err: err, Phase: from.phase, Next: from.next} }
	claimed := func(want bool) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			if g.r.Claimed(g.rank(0).Key()) != want {
				t.Errorf("rank 0 claimed %v, want %v", g.r.Claimed(g.rank(0).Key()), want)
			}
		}
	}
	attach0 := func(g *rig) { g.attach(g.rank(0)) }
	run(t, []row{
		{name: "a claimed source of a staged room", from: stStagedClaimed, ev: write(nil, true), want: eff{Phase: PhaseClaimed, Next: "1m3s"}},
		{name: "an attached source claims with its write", from: stStagedAdmitted, prep: attach0, ev: write(nil, true),
			want: eff{Phase: PhaseAdmitted, Next: "22s"}, check: claimed(true)},
		{name: "another prefill instance", from: stStagedClaimed, ev: write(func(r *RankID) { r.Addr = addrB }, true),
			want: refused("invalid rank.bootstrap_addr", stStagedClaimed)},
		{name: "a failed room", from: stFailed.with("staged", withStaging), ev: write(nil, true), want: refused("wrong_state", stFailed),
			says: []string{"AllocateStaging of room 7", "the room failed: Aborted by AbortReq."}},
		{name: "no destination yet", from: stQueued.with("staged", withStaging), ev: write(nil, true), want: refused("wrong_state", stQueued),
			says: []string{"the room has no destination yet (phase queued)"}},
		{name: "another DP rank", from: stStagedClaimed.with("dp 2", withDP2), ev: write(func(r *RankID) { r.DP = 1 }, true),
			want: refused("invalid rank.dp_rank", stStagedClaimed)},
		{name: "a rank that sends nothing", from: stStagedClaimed, ev: write(func(r *RankID) { r.TP = 5 }, true), want: refused("invalid rank", stStagedClaimed)},
		{name: "a running room", from: stSucceeded.with("staged", withStaging), ev: write(nil, true), want: refused("wrong_state", stSucceeded),
			says: []string{"phase succeeded"}},
		{name: "a rank without a claim", from: stStagedAdmitted, ev: write(nil, true), want: refused("wrong_state", stStagedAdmitted),
			says: []string{"this rank has not claimed the destination"}, check: claimed(false)},
		{name: "the staging handler holds another attempt: refused, the claim stands", from: stStagedAdmitted, prep: attach0, ev: write(nil, false),
			want: refused("wrong_state", stStagedAdmitted), says: []string{"the room is not staged (its destination has staging = false)"}, check: claimed(true)},
		{name: "a room that is not staged", from: stClaimed, ev: write(nil, true), want: refused("wrong_state", stClaimed),
			says: []string{"send its KV with Rooms.Transfer or ReportTransfer"}},
	})
}

func TestStagingAllocated(t *testing.T) {
	g := newRig(t, withStaging)
	stClaimed.build(g)
	k := g.rank(0).Key()
	for range 2 {
		if d := diff(digest(g.r, g.apply(StagingAllocated{Rank: k})), eff{Phase: PhaseClaimed, Next: "1m3s"}); d != "" {
			t.Error(d)
		}
	}
	g.apply(StagingAllocated{Rank: RankID{TP: 5}.Key()}) // not a source: nothing
	if rp := g.r.handoff.ranks.get(k); rp.stagingOpen != 2 || g.r.RanksSeen() != 2 {
		t.Errorf("staging allocations open %d, ranks seen %d", rp.stagingOpen, g.r.RanksSeen())
	}
}

func TestScatter(t *testing.T) {
	scatterEnd := func(err error, unavailable bool, marker uint64, edit func(*ScatterEnd)) func(*rig) Event {
		return func(*rig) Event {
			s := ScatterEnd{Now: tEvent, Chunk: 3, DecodeTP: 0, Err: err, Unavailable: unavailable, Marker: marker}
			if edit != nil {
				edit(&s)
			}
			return s
		}
	}
	scattering := func(g *rig) { g.apply(ScatterBegin{}) }
	stStaged := stTransferring.with("staged", withStaging)
	inflight := func(n int) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			if g.r.Inflight() != n {
				t.Errorf("in flight %d, want %d", g.r.Inflight(), n)
			}
		}
	}
	const scatterFailed = "KVTransferError(bootstrap_room=7): scatter of staged chunk 3 into decode rank dp 0 tp 0 failed: boom"
	run(t, []row{
		{name: "a scatter begins: in flight", from: stStaged, ev: func(*rig) Event { return ScatterBegin{} },
			want: eff{Phase: PhaseTransferring, Next: "1m3s"}, check: inflight(1)},
		{name: "a scatter before every rank claimed stops the claim timeout", from: stAdmitted.with("staged", withStaging),
			ev: func(*rig) Event { return ScatterBegin{} }, want: eff{Ledger: "claim", Phase: PhaseAdmitted, Next: "5m0s"}, check: inflight(1)},
		{name: "a scatter lands with the marker: the success check", from: stStaged, prep: scattering, ev: scatterEnd(nil, false, roomID, nil),
			want:  eff{Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m3s"},
			check: func(t *testing.T, g *rig, e Effects) { inflight(0)(t, g, e); wantDone(t, g, 0, roomID) }},
		{name: "T18: a scatter failed", from: stStaged, prep: scattering, ev: scatterEnd(errors.New("boom"), false, 0, nil),
			want: eff{Err: "transfer_failed", Move: "transferring -> failed T18", Note: scatterFailed, Unwait: true, Cancel: true, EndClaims: true,
				ClaimEnd: "failure staging_failed", Failure: "staging_failed", Finished: "failed staging_failed", SinceOpen: 10e9,
				Ledger: "release", End: true, Release: true, Phase: PhaseFailed},
			says: []string{scatterFailed}},
		{name: "T18 with writes that may continue", from: stStaged, prep: scattering,
			ev: scatterEnd(errors.New("boom"), false, 0, func(s *ScatterEnd) { s.WritesUntil = sec(15) }),
			want: eff{Err: "transfer_failed", Move: "transferring -> failed T18", Note: scatterFailed, Unwait: true, Cancel: true, EndClaims: true,
				ClaimEnd: "failure staging_failed", Failure: "staging_failed", Finished: "failed staging_failed", SinceOpen: 10e9,
				Quarantine: "15s", End: true, Phase: PhaseFailed, Next: "15s"}},
		{name: "a scatter the engine could not run: resubmitted later", from: stStaged, prep: scattering,
			ev:   scatterEnd(fmt.Errorf("agent down"), true, 0, nil),
			want: eff{Err: "other: scatter chunk 3 of room 7 into decode rank 0: agent down", Phase: PhaseTransferring, Next: "1m3s"}, check: inflight(0)},
		{name: "the last scatter of a failed room gives its resources back", from: stStaged,
			prep: func(g *rig) {
				scattering(g)
				g.apply(Fail{Now: tDone, Failure: Failure{Code: FailureAborted, Message: "Aborted by AbortReq."}})
			},
			ev: scatterEnd(nil, false, roomID, nil), want: eff{Move: "failed -> failed ", Note: PagesReusableNote, Err: "wrong_state", Ledger: "release", Release: true, Phase: PhaseFailed},
			says: []string{"scatter chunk 3 of room 7", "the room failed: Aborted by AbortReq."}},
	})
	// ScatterWritable: a live room takes scatters; an ended one says why not.
	g := newRig(t, withStaging)
	stSucceeded.build(g)
	if err := g.r.ScatterWritable(1); err != nil {
		t.Errorf("a running room refuses a scatter: %v", err)
	}
	g.apply(Release{Now: tEvent, Why: "released by the decode engine"})
	if err := g.r.ScatterWritable(1); errClass(err) != "wrong_state" || err.Error() != "scatter chunk 1 of room 7: operation not valid in the room's state: the room ended" {
		t.Errorf("a released room: %v", err)
	}
}

func TestGate(t *testing.T) {
	gate := func(hold bool, f *Failure) func(*rig) Event {
		return func(*rig) Event { return Gate{Now: tEvent, Name: "kv-events", Hold: hold, Failure: f} }
	}
	held := func(want bool) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			if g.r.HasGate("kv-events") != want || g.r.Gated() != want {
				t.Errorf("gate held %v, want %v", g.r.HasGate("kv-events"), want)
			}
		}
	}
	hold := func(g *rig) { g.apply(Gate{Now: tLand, Name: "kv-events", Hold: true}) }
	run(t, []row{
		{name: "hold a claimed room's success", from: stClaimed, ev: gate(true, nil), want: eff{Phase: PhaseClaimed, Next: "1m3s"}, check: held(true)},
		{name: "hold a queued room's success", from: stQueued, ev: gate(true, nil), want: eff{Phase: PhaseQueued, Next: "5m0s"}, check: held(true)},
		{name: "a running room cannot be held", from: stSucceeded, ev: gate(true, nil), want: eff{Err: "wrong_state", Phase: PhaseSucceeded},
			says: []string{"hold success of room 7", "(phase succeeded)"}, check: held(false)},
		{name: "an ended room cannot be held", from: stFailed, ev: gate(true, nil), want: eff{Err: "wrong_state", Phase: PhaseFailed}},
		{name: "lifted: the success check", from: stLandedNoMarker, prep: hold, ev: gate(false, nil),
			want: eff{Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m3s"}, check: held(false)},
		{name: "lifted with a failure: the room fails", from: stClaimed, prep: hold,
			ev: gate(false, &Failure{Code: FailureStagingFailed, Message: "staging region lost"}),
			want: eff{Move: "claimed -> failed T18", Note: "staging region lost", Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure staging_failed",
				Failure: "staging_failed", Finished: "failed staging_failed", SinceOpen: 10e9, Ledger: "release", End: true, Release: true, Phase: PhaseFailed},
			check: held(false)},
		{name: "lifting a gate of an ended room does nothing", from: stReleased, ev: gate(false, &Failure{Code: FailureStagingFailed}), want: eff{Phase: PhaseReleased}},
	})
}
