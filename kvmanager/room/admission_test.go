package room

import (
	"slices"
	"testing"
)

// Admission (T11), the claim streams (AwaitDestination) and the claims
// (T11's claimed step), up to the first landed chunk.

func TestAdmitted(t *testing.T) {
	admitted := func(staged bool) func(*rig) Event {
		return func(*rig) Event {
			return Admitted{Now: tEvent, Pages: []int32{3, 4, 5, 6}, FillLen: destFill, MetadataSlot: destSlot, Staged: staged}
		}
	}
	t11 := func(next string) eff {
		return eff{Move: "queued -> admitted T11", Note: "4 pages, metadata slot 2", Admission: true, AdmittedAft: 10e9, Offer: "all", Phase: PhaseAdmitted, Next: next}
	}
	destination := func(t *testing.T, g *rig, _ Effects) {
		r := g.r
		if !slices.Equal(r.Pages(), destPages) || r.MetadataSlot() != destSlot || r.Owner() != OwnerDaemon {
			t.Errorf("admitted with pages %v, slot %d, owner %d", r.Pages(), r.MetadataSlot(), r.Owner())
		}
		d := r.Destination(g.rank(0).Key())
		if !slices.Equal(d.Pages, destPages) || d.FillLen != destFill || d.MetadataSlot != destSlot || d.Attempt != r.Attempt() || d.Dummy || d.PageSize != 64 || d.Staging != r.Staging() {
			t.Errorf("destination %+v", d)
		}
	}
	run(t, []row{
		{name: "T11: destination offered, bounded by admission.claim_timeout", from: stQueued, ev: admitted(false), want: t11("30s"),
			check: func(t *testing.T, g *rig, e Effects) {
				destination(t, g, e)
				// The room keeps a copy of the pages.
				ev := Admitted{Now: tEvent, Pages: []int32{1, 2}}
				g2 := newRig(t)
				g2.open()
				g2.known(0)
				g2.apply(ev)
				ev.Pages[0] = 99
				if g2.r.Pages()[0] != 1 {
					t.Error("the room's pages are its caller's slice")
				}
			}},
		{name: "T11 without a claim timeout: bounded by timeouts.bootstrap", from: stQueued.with("no claim timeout", withParams(func(p *Params) { p.ClaimTimeout = 0 })),
			ev: admitted(false), want: t11("5m0s")},
		{name: "T11 staged: the staging gate holds success, its regions open", from: stQueued.with("staged", withStaging), ev: admitted(true),
			want: func() eff { w := t11("30s"); w.StagingOpen = true; return w }(),
			check: func(t *testing.T, g *rig, e Effects) {
				destination(t, g, e)
				if !g.r.HasGate(StagingGate) || !g.r.Gated() {
					t.Error("a staged admission did not hold the staging gate")
				}
			}},
		{name: "T11 on a staged plan without the staging handler: no gate", from: stQueued.with("staged", withStaging), ev: admitted(false), want: t11("30s"),
			check: func(t *testing.T, g *rig, _ Effects) {
				if g.r.Gated() {
					t.Error("gated without the staging handler")
				}
			}},
		{name: "T20: a retracted room resumes with its new pages", from: stRetracted,
			ev: func(*rig) Event {
				return Admitted{Now: tEvent, Pages: []int32{8, 9}, FillLen: 100, MetadataSlot: -1, Resumed: true}
			},
			want: eff{Move: "retracted -> succeeded T20", Note: "resumed after retraction with 2 pages", Ledger: "running", Phase: PhaseSucceeded},
			check: func(t *testing.T, g *rig, _ Effects) {
				if !slices.Equal(g.r.Pages(), []int32{8, 9}) {
					t.Errorf("resumed with pages %v", g.r.Pages())
				}
			}},
		{name: "T11 of a rebootstrap's second attempt", from: stRequeued, ev: admitted(false),
			want: t11("30s"),
			check: func(t *testing.T, g *rig, e Effects) {
				destination(t, g, e)
				if d := g.r.Destination(g.rank(0).Key()); d.Attempt != 2 {
					t.Errorf("destination of attempt %d, want 2", d.Attempt)
				}
			}},
	})
}

func TestAttach(t *testing.T) {
	attach := func(rk RankID, registered bool) func(*rig) Event {
		return func(*rig) Event { return Attach{Rank: rk, Registered: registered} }
	}
	rank0 := RankID{Addr: addrA}
	attached := func(t *testing.T, g *rig, _ Effects) {
		if !g.r.Attached(rank0.Key()) || len(g.r.Ranks()) != 1 || g.r.Ranks()[0] != rank0 {
			t.Errorf("attached ranks %v, want %v", g.r.Ranks(), rank0)
		}
	}
	notAttached := func(t *testing.T, g *rig, _ Effects) {
		if len(g.r.Ranks()) != 0 {
			t.Errorf("attached ranks %v, want none", g.r.Ranks())
		}
	}
	run(t, []row{
		{name: "another prefill instance is refused", from: stQueued, ev: attach(RankID{Addr: addrB}, true),
			want: eff{Err: "invalid rank.bootstrap_addr", Reply: "failure unspecified refused invalid rank.bootstrap_addr", Phase: PhaseQueued, Next: "5m0s"},
			says: []string{`"10.0.0.2:8998" is not room 7's prefill instance ("10.0.0.1:8998")`}, check: notAttached},
		{name: "another DP rank is refused", from: stQueued.with("dp 2", withDP2), ev: attach(RankID{Addr: addrA, DP: 1}, true),
			want: eff{Err: "invalid rank.dp_rank", Reply: "failure dp_rank_conflict refused invalid rank.dp_rank", Phase: PhaseQueued, Next: "5m0s"},
			says: []string{"1 is not room 7's prefill DP rank 0 (single_dp)"}, check: notAttached},
		{name: "an unregistered rank is refused", from: stAdmitted, ev: attach(rank0, false),
			want: eff{Err: "prefill_not_found", Reply: "failure unspecified refused prefill_not_found", Phase: PhaseAdmitted, Next: "22s"},
			says: []string{"await destination of room 7", "is not registered with this daemon"}, check: notAttached},
		{name: "an unregistered rank is refused by a failed room too", from: stFailed, ev: attach(rank0, false),
			want: eff{Err: "prefill_not_found", Reply: "failure unspecified refused prefill_not_found", Phase: PhaseFailed}},
		{name: "a failed room answers with its failure", from: stFailed, ev: attach(rank0, true),
			want: eff{Reply: "failure aborted", Phase: PhaseFailed}, says: []string{"Aborted by AbortReq."},
			check: func(t *testing.T, g *rig, e Effects) {
				if e.Reply.Failure != g.r.Failure() {
					t.Error("the reply is not the room's failure")
				}
				notAttached(t, g, e)
			}},
		{name: "a succeeded room answers done", from: stSucceeded, ev: attach(rank0, true), want: eff{Reply: "done succeeded", Phase: PhaseSucceeded}, check: notAttached},
		{name: "an adopted room answers done", from: stAdopted, ev: attach(rank0, true), want: eff{Reply: "done succeeded", Phase: PhaseSucceeded}, check: notAttached},
		{name: "a released room answers done", from: stReleased, ev: attach(rank0, true), want: eff{Reply: "done released", Phase: PhaseReleased}, check: notAttached},
		{name: "a retracted room answers done", from: stRetracted, ev: attach(rank0, true), want: eff{Reply: "done retracted", Phase: PhaseRetracted, Next: "1m45s"}},
		{name: "a held room answers done", from: stHeld, ev: attach(rank0, true), want: eff{Reply: "done held", Phase: PhaseHeld, Next: "3m25s"}},
		{name: "a room waiting for its prefill attaches any DP rank", from: stWaitingPrefill.with("dp 2", withDP2), ev: attach(RankID{Addr: addrA, DP: 1}, true),
			want: eff{Phase: PhaseWaitingPrefill, Next: "5m0s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if rs := g.r.Ranks(); len(rs) != 1 || rs[0].DP != 1 {
					t.Errorf("attached %v", rs)
				}
			}},
		{name: "a queued room attaches without an offer", from: stQueued, ev: attach(rank0, true), want: eff{Phase: PhaseQueued, Next: "5m0s"}, check: attached},
		{name: "an admitted room offers its destination", from: stAdmitted, ev: attach(rank0, true),
			want: eff{Offer: "one {CP:0 TP:0 PP:0}", Phase: PhaseAdmitted, Next: "22s"}, check: attached},
		{name: "an admitted room offers its destination to the rank attached", from: stAdmitted.with("tp 2", withTP2), ev: attach(RankID{Addr: addrA, TP: 1}, true),
			want: eff{Offer: "one {CP:0 TP:1 PP:0}", Phase: PhaseAdmitted, Next: "22s"}},
		{name: "a claimed room offers it again", from: stClaimed, ev: attach(rank0, true),
			want: eff{Offer: "one {CP:0 TP:0 PP:0}", Phase: PhaseClaimed, Next: "1m3s"}, check: attached},
		{name: "a transferring room offers it again", from: stTransferring, ev: attach(rank0, true),
			want: eff{Offer: "one {CP:0 TP:0 PP:0}", Phase: PhaseTransferring, Next: "1m3s"}, check: attached},
		{name: "a rebootstrapped room waiting for its prefill attaches without an offer", from: stRebootstrapped, ev: attach(rank0, true),
			want: eff{Phase: PhaseWaitingPrefill, Next: "5m9s"}, check: attached},
	})
}

func TestDetach(t *testing.T) {
	g := newRig(t)
	stAdmitted.build(g)
	rk := g.rank(0)
	g.attach(rk)
	if d := diff(digest(g.r, g.apply(Detach{Rank: rk.Key()})), eff{Phase: PhaseAdmitted, Next: "22s"}); d != "" || g.r.Attached(rk.Key()) {
		t.Errorf("detach: %s; attached %v", d, g.r.Attached(rk.Key()))
	}
	// A claim made stands after its stream ended.
	g.attach(rk)
	g.exec(Delivered{Now: tClaim, Rank: rk.Key(), Attempt: 1})
	g.apply(Detach{Rank: rk.Key()})
	if !g.r.Claimed(rk.Key()) || g.r.Phase() != PhaseClaimed {
		t.Errorf("after detaching a claimed rank: claimed %v, phase %s", g.r.Claimed(rk.Key()), g.r.Phase())
	}
	// Detaching from a room nothing attached to changes nothing.
	g2 := newRig(t)
	stQueued.build(g2)
	g2.apply(Detach{Rank: rk.Key()})
}

func TestDelivered(t *testing.T) {
	delivered := func(rank int, attempt uint32) func(*rig) Event {
		return func(g *rig) Event { return Delivered{Now: tEvent, Rank: g.rank(rank).Key(), Attempt: attempt} }
	}
	claimedBy := func(n int) eff {
		return eff{Move: "admitted -> claimed T11", Note: "destination claimed by " + itoa(n) + " prefill ranks; waiting timeout 1m0s", Ledger: "claim",
			Phase: PhaseClaimed, Next: "1m10s"}
	}
	claims := func(want ...bool) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			for i, w := range want {
				if g.r.Claimed(g.rank(i).Key()) != w || g.r.Coverage()[i].Claimed != w {
					t.Errorf("rank %d claimed %v (coverage %+v), want %v", i, g.r.Claimed(g.rank(i).Key()), g.r.Coverage()[i], w)
				}
			}
		}
	}
	deliver := func(rank int) func(*rig) {
		return func(g *rig) { g.apply(Delivered{Now: tClaim, Rank: g.rank(rank).Key(), Attempt: 1}) }
	}
	run(t, []row{
		{name: "T11 claimed: the waiting timeout starts", from: stAdmitted, ev: delivered(0, 1), want: claimedBy(1), check: claims(true)},
		{name: "one of two ranks claims: still admitted", from: stAdmitted.with("tp 2", withTP2), ev: delivered(0, 1),
			want: eff{Phase: PhaseAdmitted, Next: "22s"}, check: claims(true, false)},
		{name: "the second of two ranks claims: T11 claimed", from: stAdmitted.with("tp 2", withTP2), prep: deliver(0), ev: delivered(1, 1),
			want: claimedBy(2), check: claims(true, true)},
		{name: "a rank's second delivery counts once", from: stAdmitted.with("tp 2", withTP2), prep: deliver(0), ev: delivered(0, 1),
			want: eff{Phase: PhaseAdmitted, Next: "22s"},
			check: func(t *testing.T, g *rig, e Effects) {
				claims(true, false)(t, g, e)
				if g.r.claimedN != 1 {
					t.Errorf("%d claims counted", g.r.claimedN)
				}
			}},
		{name: "the previous attempt's destination is not a claim", from: stReadmitted, ev: delivered(0, 1),
			want: eff{Phase: PhaseAdmitted, Next: "29s"}, check: claims(false)},
		{name: "a rank that sends nothing is not a claim", from: stAdmitted,
			ev:   func(*rig) Event { return Delivered{Now: tEvent, Rank: RankID{TP: 5}.Key(), Attempt: 1} },
			want: eff{Phase: PhaseAdmitted, Next: "22s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if g.r.RanksSeen() != 0 {
					t.Errorf("%d ranks seen", g.r.RanksSeen())
				}
			}},
		{name: "a claimed room ignores it", from: stClaimed, ev: delivered(0, 1), want: eff{Phase: PhaseClaimed, Next: "1m3s"}},
		{name: "a queued room ignores it", from: stQueued, ev: delivered(0, 1), want: eff{Phase: PhaseQueued, Next: "5m0s"}},
		{name: "chunks landed before the last claim: then Transferring", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) {
				deliver(0)(g)
				g.land(g.rank(0), 0, 0)
			},
			ev: delivered(1, 1), want: func() eff { w := claimedBy(2); w.Then = ThenTransferring; return w }()},
	})
}

// Transferring follows a claim that completed after chunks landed.
func TestTransferringAfterLateClaim(t *testing.T) {
	run(t, []row{{name: "claimed -> transferring, then the success check",
		from: stAdmitted.with("tp 2", withTP2),
		prep: func(g *rig) {
			g.apply(Delivered{Now: tClaim, Rank: g.rank(0).Key(), Attempt: 1})
			g.land(g.rank(0), 0, 0)
			g.apply(Delivered{Now: tClaim, Rank: g.rank(1).Key(), Attempt: 1})
		},
		ev:   func(*rig) Event { return Transferring{Now: tEvent} },
		want: eff{Move: "claimed -> transferring ", Note: "chunks landed before every rank claimed", Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m3s"},
	}})
}
