package room

import (
	"slices"
	"testing"
	"time"
)

// Running rooms: retraction (T20 RETRACT, T21 REBOOTSTRAP), resumption
// (Admitted Resumed: see TestAdmitted), rebootstrap (T22), growth, and the
// rooms adopted at the engine's resync.

func TestRetract(t *testing.T) {
	retract := func(held bool) func(*rig) Event { return func(*rig) Event { return Retract{Now: tEvent, Held: held} } }
	const retractedNote, heldNote = "retracted: pages returned; resumes after the next ReportRunning, before new admissions", "held for rebootstrap until ContinueGeneration"
	pagesBack := func(t *testing.T, g *rig, _ Effects) {
		if g.r.Pages() != nil {
			t.Errorf("a parked room kept pages %v", g.r.Pages())
		}
	}
	noParkedBounds := withParams(func(p *Params) { p.Retracted, p.Held = 0, 0 })
	refused := func(from state) eff { return eff{Err: "wrong_state", Phase: from.phase, Next: from.next} }
	run(t, []row{
		{name: "T20: retracted, bounded by timeouts.retracted", from: stSucceeded, ev: retract(false),
			want: eff{Move: "succeeded -> retracted T20", Note: retractedNote, Phase: PhaseRetracted, Next: "1m50s"}, check: pagesBack},
		{name: "T21: held, bounded by timeouts.held; the freed pages admit", from: stSucceeded, ev: retract(true),
			want: eff{Move: "succeeded -> held T21", Note: heldNote, AdmitNow: true, Phase: PhaseHeld, Next: "3m30s"}, check: pagesBack},
		{name: "T20 with timeouts.retracted 0: DefaultParkedTimeout", from: stSucceeded.with("no parked bounds", noParkedBounds), ev: retract(false),
			want: eff{Move: "succeeded -> retracted T20", Note: retractedNote, Phase: PhaseRetracted, Next: (10*time.Second + DefaultParkedTimeout).String()}},
		{name: "T21 with timeouts.held 0: DefaultParkedTimeout", from: stSucceeded.with("no parked bounds", noParkedBounds), ev: retract(true),
			want: eff{Move: "succeeded -> held T21", Note: heldNote, AdmitNow: true, Phase: PhaseHeld, Next: (10*time.Second + DefaultParkedTimeout).String()}},
		{name: "T20 of an adopted room", from: stAdopted, ev: retract(false),
			want: eff{Move: "succeeded -> retracted T20", Note: retractedNote, Phase: PhaseRetracted, Next: "1m50s"}, check: pagesBack},
		{name: "a room still handing off cannot be retracted", from: stTransferring, ev: retract(false), want: refused(stTransferring),
			says: []string{"retract room 7: operation not valid in the room's state: only a running (succeeded) room can be retracted (phase transferring)"}},
		{name: "a retracted room cannot be retracted again", from: stRetracted, ev: retract(true), want: refused(stRetracted)},
		{name: "a held room cannot be retracted", from: stHeld, ev: retract(false), want: refused(stHeld)},
		{name: "a released room cannot be retracted", from: stReleased, ev: retract(false), want: refused(stReleased)},
	})
	for _, c := range []struct {
		from state
		ok   bool
	}{{stSucceeded, true}, {stAdopted, true}, {stRetracted, false}, {stHeld, false}, {stClaimed, false}, {stFailed, false}} {
		g := newRig(t, c.from.opts...)
		c.from.build(g)
		if err := g.r.CanRetract(); (err == nil) != c.ok || (err != nil && errClass(err) != "wrong_state") {
			t.Errorf("CanRetract from %s: %v, want ok %v", c.from.name, err, c.ok)
		}
	}
}

func TestRebootstrap(t *testing.T) {
	rebootstrap := func(*rig) Event { return Rebootstrap{Now: tEvent} }
	forgotten := func(attempt uint32) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			r := g.r
			s := r.Snapshot(false, true)
			if r.Attempt() != attempt || s.Attempt != attempt || r.Pages() != nil || r.MetadataSlot() != -1 || r.Plan() != nil || len(r.Ranks()) != 0 || r.Gated() ||
				s.BytesTransferred != 0 || s.ChunksDone != 0 || r.RanksSeen() != 0 || r.Coverage() != nil || r.marker != 0 {
				t.Errorf("the previous attempt was kept: %+v, plan %v, attached %v, gated %v, ranks seen %d, marker %d", s, r.Plan() != nil, r.Ranks(), r.Gated(), r.RanksSeen(), r.marker)
			}
			if r.PrefillDP() != 0 || s.DPRule.String() != "single_dp" {
				t.Errorf("the pinned DP rank was not kept: %d (%s)", r.PrefillDP(), s.DPRule)
			}
			if tl := s.Transitions; tl != nil {
				t.Errorf("transitions asked for none: %v", tl)
			}
			if tl := r.Snapshot(true, false).Transitions; tl[len(tl)-1].Attempt != attempt || tl[len(tl)-2].Attempt != attempt-1 {
				t.Errorf("timeline attempts: %+v", tl[len(tl)-2:])
			}
		}
	}
	run(t, []row{
		{name: "T22: the held room's next attempt bootstraps again", from: stHeld, ev: rebootstrap,
			want: eff{Move: "held -> waiting_prefill T22", Note: "rebootstrap attempt 2", Phase: PhaseWaitingPrefill, Next: "5m10s"}, check: forgotten(2)},
		{name: "T22 again: attempt 3", from: stReadmitted,
			prep: func(g *rig) {
				g.succeed()
				g.apply(Retract{Now: sec(9), Held: true})
			},
			ev:   rebootstrap,
			want: eff{Move: "held -> waiting_prefill T22", Note: "rebootstrap attempt 3", Phase: PhaseWaitingPrefill, Next: "5m10s"}, check: forgotten(3)},
		{name: "a retracted room is not rebootstrapped", from: stRetracted, ev: rebootstrap, want: eff{Phase: PhaseRetracted, Next: "1m45s"}},
		{name: "a running room is not rebootstrapped", from: stSucceeded, ev: rebootstrap, want: eff{Phase: PhaseSucceeded}},
		{name: "a failed room is not rebootstrapped", from: stFailed, ev: rebootstrap, want: eff{Phase: PhaseFailed}},
	})
}

func TestAdopt(t *testing.T) {
	adopt := func(prefillDP int) func(*rig) Event {
		return func(g *rig) Event {
			return Adopt{Now: tEvent, ID: 9, Addr: addrA, DecodeDP: 1, PrefillDP: prefillDP, Params: g.cfg, ReqSlot: 4, Pages: []int32{1, 2, 3}, FillLen: 130,
				Request: Request{RID: "rid-9", PromptLen: 100, OutputLen: 30}}
		}
	}
	adopted := eff{Move: "unspecified -> succeeded ", Note: "adopted at the engine's resync: 3 pages, req slot 4 (prompt 100 + output 30 tokens)", Phase: PhaseSucceeded}
	running := func(prefillDP int) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			r := g.r
			if r.ID() != 9 || r.DecodeDP() != 1 || r.PrefillDP() != prefillDP || r.HintDP() != -1 || r.Attempt() != 1 || !r.InLedger() || r.MetadataSlot() != -1 ||
				!slices.Equal(r.Pages(), []int32{1, 2, 3}) || r.Plan() != nil || !r.OpenedAt().Equal(tEvent) || r.Request().RID != "rid-9" {
				t.Errorf("adopted room %+v", r.Snapshot(false, true))
			}
			if tl := r.Snapshot(true, false).Transitions; len(tl) != 2 || tl[1].Phase != PhaseSucceeded {
				t.Errorf("timeline %+v", tl)
			}
		}
	}
	run(t, []row{
		{name: "a running room the engine declared", from: stZero, ev: adopt(2), want: adopted, check: running(2)},
		{name: "without its prefill DP rank", from: stZero, ev: adopt(-1), want: adopted, check: running(-1)},
	})
}

func TestGrow(t *testing.T) {
	g := newRig(t)
	stSucceeded.build(g)
	grown := []int32{7, 8}
	if d := diff(digest(g.r, g.apply(Grow{Pages: grown})), eff{Phase: PhaseSucceeded}); d != "" {
		t.Error(d)
	}
	grown[0] = 99
	if !slices.Equal(g.r.Pages(), []int32{3, 4, 5, 6, 7, 8}) {
		t.Errorf("grown pages %v", g.r.Pages())
	}
	// A room never admitted has no pages to grow.
	g2 := newRig(t)
	stQueued.build(g2)
	g2.apply(Grow{Pages: []int32{1}})
	if g2.r.Pages() != nil {
		t.Errorf("a queued room grew: %v", g2.r.Pages())
	}
}
