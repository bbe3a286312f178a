package room

import "testing"

// Every (phase, event) pair the room does not act on changes nothing and
// asks nothing of its caller: the event comes with no effect but the
// room's unchanged phase and deadline.
func TestEventsOutsideTheirPhasesChangeNothing(t *testing.T) {
	states := []state{stWaitingPrefill, stResolving, stQueued, stAdmitted, stClaimed, stTransferring, stLandedNoMarker, stSucceeded,
		stReleased, stFailed, stRetracted, stHeld, stRebootstrapped, stRequeued, stReadmitted, stAdopted, draining()}
	is := func(phases ...Phase) func(state) bool {
		return func(s state) bool {
			for _, p := range phases {
				if s.phase == p {
					return true
				}
			}
			return false
		}
	}
	live := func(s state) bool { return !s.phase.Terminal() }
	for _, ev := range []struct {
		name string
		ev   func(*rig) Event
		acts func(state) bool // the states the event acts on
	}{
		{"PrefillKnown", func(g *rig) Event { return PrefillKnown{Now: tEvent, Plan: g.plan, Topology: g.topo, Resolved: true} }, is(PhaseWaitingPrefill)},
		{"Bound to the room's DP rank", func(*rig) Event { return Bound{Now: tEvent, Addr: addrA, DP: 0} }, is(PhaseResolvingDP)},
		{"Delivered", func(g *rig) Event { return Delivered{Now: tEvent, Rank: g.rank(0).Key(), Attempt: g.r.Attempt()} }, is(PhaseAdmitted)},
		{"Rebootstrap", func(*rig) Event { return Rebootstrap{Now: tEvent} }, is(PhaseHeld)},
		{"CheckSuccess before every rank is done", func(*rig) Event { return CheckSuccess{Now: tEvent} }, func(state) bool { return false }},
		{"Release", func(*rig) Event { return Release{Now: tEvent, Why: "released at shutdown"} }, live},
		{"Fail", func(*rig) Event { return Fail{Now: tEvent, Failure: aborted} }, live},
		{"Gate lifted", func(*rig) Event { return Gate{Now: tEvent, Name: "kv-events", Failure: &aborted} }, live},
		{"Deadline before any bound", func(*rig) Event { return Deadline{Now: tEvent} }, func(state) bool { return false }},
		{"Ack of a room that owes nothing", func(g *rig) Event { return Ack{Now: tEvent, Rank: g.rank(0), Attempt: g.r.Attempt()} },
			func(s state) bool { return s.name == "draining" }},
		{"Close of a room that holds nothing back", func(*rig) Event { return Close{Now: tEvent} }, func(s state) bool { return s.name == "draining" }},
		{"Detach of a rank never attached", func(*rig) Event { return Detach{Rank: RankID{TP: 3}.Key()} }, func(state) bool { return false }},
		{"ChunkDropped of a chunk never sent", func(g *rig) Event { return ChunkDropped{Rank: g.rank(0).Key(), Index: 9} }, func(state) bool { return false }},
		{"StagingAllocated of a rank that sends nothing", func(*rig) Event { return StagingAllocated{Rank: RankID{TP: 3}.Key()} }, func(state) bool { return false }},
	} {
		for _, s := range states {
			if ev.acts(s) {
				continue
			}
			t.Run(ev.name+" of "+s.name, func(t *testing.T) {
				g := newRig(t, s.opts...)
				s.build(g)
				before := observe(g.r)
				if d := diff(digest(g.r, g.apply(ev.ev(g))), eff{Phase: s.phase, Next: s.next}); d != "" {
					t.Error(d)
				}
				if after := observe(g.r); after != before {
					t.Errorf("the room changed:\n before %s\n after  %s", before, after)
				}
			})
		}
	}
}
