package room

import (
	"slices"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// What the room answers without changing: phases and their KVPoll, the
// checks its executor makes before a chunk, the engine's operation of a
// chunk, destinations and the timeline's steps.

// Each phase reports SGLang's KVPoll (statuses only move forward, Failed
// is 0 and terminal), and its name parses back.
func TestPhasePollAndNames(t *testing.T) {
	for _, c := range []struct {
		p        Phase
		name     string
		poll     KVPoll
		terminal bool
	}{
		{PhaseWaitingPrefill, "waiting_prefill", PollBootstrapping, false},
		{PhaseResolvingDP, "resolving_dp_rank", PollBootstrapping, false},
		{PhaseQueued, "queued", PollWaitingForInput, false},
		{PhaseAdmitted, "admitted", PollWaitingForInput, false},
		{PhaseClaimed, "claimed", PollWaitingForInput, false},
		{PhaseTransferring, "transferring", PollTransferring, false},
		{PhaseSucceeded, "succeeded", PollSuccess, false},
		{PhaseReleased, "released", PollSuccess, true},
		{PhaseFailed, "failed", PollFailed, true},
		{PhaseRetracted, "retracted", PollSuccess, false},
		{PhaseHeld, "held", PollSuccess, false},
	} {
		if c.p.String() != c.name || c.p.Poll() != c.poll || c.p.Terminal() != c.terminal {
			t.Errorf("%d: %s %s terminal %v; want %s %s %v", c.p, c.p, c.p.Poll(), c.p.Terminal(), c.name, c.poll, c.terminal)
		}
		if p, ok := ParsePhase(c.name); !ok || p != c.p {
			t.Errorf("ParsePhase(%q) = %s, %v", c.name, p, ok)
		}
	}
	for _, bad := range []string{"", "unspecified", "Queued"} {
		if p, ok := ParsePhase(bad); ok || p != PhaseUnspecified {
			t.Errorf("ParsePhase(%q) = %s, %v", bad, p, ok)
		}
	}
	// SGLang's numbers (disaggregation/base/conn.py).
	for _, c := range []struct {
		p    KVPoll
		n    int
		name string
	}{{PollFailed, 0, "Failed"}, {PollBootstrapping, 1, "Bootstrapping"}, {PollWaitingForInput, 2, "WaitingForInput"}, {PollTransferring, 3, "Transferring"}, {PollSuccess, 4, "Success"}} {
		if int(c.p) != c.n || c.p.String() != c.name {
			t.Errorf("KVPoll %s = %d, want %s = %d", c.p, int(c.p), c.name, c.n)
		}
	}
	if PhaseUnspecified.Poll() != PollFailed || Phase(99).String() != "Phase(99)" || KVPoll(9).String() != "KVPoll(9)" ||
		FailureCode(99).String() != "FailureCode(99)" || FailureRetractTimeout.String() != "retract_timeout" {
		t.Error("out-of-range names")
	}
}

// The executor's checks before a chunk: the source of a failure report,
// whether a chunk was sent, whether a retry is the same chunk.
func TestChunkChecks(t *testing.T) {
	g := newRig(t, withDP2)
	stTransferring.build(g)
	rk := g.rank(0)
	if err := g.r.CheckSource(g.chunk(rk, 1)); err != nil {
		t.Errorf("CheckSource of the room's rank: %v", err)
	}
	other := g.chunk(rk, 1)
	other.Rank.DP = 1
	if err := g.r.CheckSource(other); errClass(err) != "invalid rank.dp_rank" {
		t.Errorf("CheckSource of another DP rank: %v", err)
	}
	if !g.r.ChunkSent(rk, 0) || g.r.ChunkSent(rk, 1) || g.r.ChunkSent(other.Rank, 0) || g.r.ChunkSent(RankID{Addr: addrB}, 0) {
		t.Error("ChunkSent: want chunk 0 of the room's rank alone")
	}
	if err := g.r.SameChunk(g.chunk(rk, 0)); err != nil {
		t.Errorf("SameChunk of the same chunk: %v", err)
	}
	moved := g.chunk(rk, 0)
	moved.PageOffset = 1
	if err := g.r.SameChunk(moved); errClass(err) != "invalid chunk_index" {
		t.Errorf("SameChunk of other pages: %v", err)
	}
	if err := g.r.SameChunk(g.chunk(rk, 1)); err != nil {
		t.Errorf("SameChunk of a chunk never sent: %v", err)
	}
}

// A chunk's engine operation carries its slice of the destination, its
// tokens (the last page partial), its rank's targets, and with the last
// chunk the state indices and the metadata.
func TestChunkOp(t *testing.T) {
	g := newRig(t, withTP2)
	stQueued.build(g)
	state := []kvlayout.StateIndices{{Type: kvlayout.StateSWA, Indices: []int32{1, 2}}}
	g.apply(Admitted{Now: tAdmit, Pages: destPages, FillLen: destFill, MetadataSlot: destSlot, State: state})
	state[0].Indices[0] = 99 // the room keeps a copy
	rk := g.rank(1)
	op := g.r.ChunkOp(g.chunk(rk, 1))
	if op.Room != roomID || op.RID != "rid-7" || op.Attempt != 1 || op.Rank != transfer.Rank(rk) || op.ChunkIndex != 1 || !slices.Equal(op.DestPages, []int32{5, 6}) ||
		op.Tokens != 72 || !op.Last || op.MetadataSlot != destSlot || op.Marker != roomID || op.PrefillTP != 2 || op.PrefillPP != 1 ||
		len(op.State) != 1 || !slices.Equal(op.State[0].Indices, []int32{1, 2}) || !slices.Equal(op.Targets, g.r.TargetsOf(rk.Key())) || len(op.Targets) != 1 {
		t.Errorf("last chunk's op %+v", op)
	}
	if op := g.r.ChunkOp(g.chunk(rk, 0)); op.Tokens != 128 || op.Last || op.State != nil {
		t.Errorf("first chunk's op: %d tokens, last %v, state %v", op.Tokens, op.Last, op.State)
	}
	if d := g.r.Destination(rk.Key()); d.Dummy || !slices.Equal(d.State[0].Indices, []int32{1, 2}) || d.RequiredDstInfoNum != 1 || d.TokenBytes != 2*4*128*2*32 {
		t.Errorf("destination %+v", d)
	}
	// A rank no decode rank addresses gets an empty destination.
	if d := g.r.Destination(RankID{TP: 5}.Key()); !d.Dummy || d.Pages != nil || d.State != nil || d.MetadataSlot != -1 || d.Targets != nil {
		t.Errorf("a rank outside the plan's destination %+v", d)
	}
	if g.r.TargetsOf(RankID{TP: 5}.Key()) != nil {
		t.Error("targets of a rank outside the plan")
	}
	g2 := newRig(t)
	stWaitingPrefill.build(g2)
	if g2.r.TargetsOf(rk.Key()) != nil || g2.r.Coverage() != nil {
		t.Error("targets or coverage before the plan is known")
	}
}

// Steps is the room's whole timeline (OpenRoom's first), Seq its length,
// each step rendering what the snapshot shows.
func TestSteps(t *testing.T) {
	g := newRig(t)
	stReleased.build(g)
	steps, snap := g.r.Steps(), g.r.Snapshot(true, false).Transitions
	if len(steps) != int(g.r.Seq()) || len(steps) != len(snap) || len(steps) != 7 {
		t.Fatalf("%d steps, seq %d, %d transitions", len(steps), g.r.Seq(), len(snap))
	}
	for i, s := range steps {
		if s.Public(g.r.Addr(), g.r.Texts()) != snap[i] || s.Phase() != snap[i].Phase {
			t.Errorf("step %d %+v, snapshot %+v", i, s.Public(g.r.Addr(), g.r.Texts()), snap[i])
		}
	}
	want := []string{"T1", "T2/T4/T8", "T11", "T11", "", "T12/T17", ""}
	for i, w := range want {
		if snap[i].SGLang != w {
			t.Errorf("step %d: %q, want %q", i, snap[i].SGLang, w)
		}
	}
	if g.r.Opened() != t0.UnixNano() {
		t.Errorf("opened %d", g.r.Opened())
	}
}
