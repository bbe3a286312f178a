package room

import (
	"reflect"
	"slices"
	"testing"

	"github.com/decodeplane/decodeplane/transfer"
)

// Applying an event allocates only what the room keeps, and its Effects
// own nothing on the common path: a caller copies them for free.

// sliceFields lists the slice and map fields of t, nested structs
// included, by path.
func sliceFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		switch f.Type.Kind() {
		case reflect.Slice, reflect.Map:
			out = append(out, prefix+f.Name)
		case reflect.Struct:
			out = append(out, sliceFields(f.Type, prefix+f.Name+".")...)
		}
	}
	return out
}

// The Effects of every event of a whole hand-off (opened, its prefill
// known, admitted, a claim stream attached, claimed, its chunks begun and
// landed, succeeded, released) set no slice, no map and no pointer of
// their own: Refuse, Owing and the drain's ranks are nil, there is no reply
// and no failure, and the claims end with the shared Done phase.
func TestEffectsOfTheHappyPathOwnNothing(t *testing.T) {
	if got, want := sliceFields(reflect.TypeFor[Effects](), ""), []string{"Refuse", "Owing", "Drain.Ranks"}; !slices.Equal(got, want) {
		t.Fatalf("Effects' slice and map fields %v, want %v (a new one must stay nil on the common path: add it to this test)", got, want)
	}
	g := newRig(t)
	var effects []Effects
	record := func(e Effects) { effects = append(effects, e) }
	rk := g.rank(0)
	record(g.apply(Open{Now: tOpen, ID: roomID, Addr: addrA, HintDP: -1, Params: g.cfg, Request: Request{RID: "rid-7", PromptLen: 150}}))
	record(g.apply(PrefillKnown{Now: tKnown, Plan: g.plan, Topology: g.topo, Resolved: true}))
	record(g.apply(Admitted{Now: tAdmit, Pages: destPages, FillLen: destFill, MetadataSlot: destSlot}))
	record(g.apply(Attach{Rank: rk, Registered: true}))
	record(g.apply(Delivered{Now: tClaim, Rank: rk.Key(), Attempt: 1}))
	for i := range 2 {
		req := g.chunk(rk, i)
		record(g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine}))
		record(g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{Bytes: chunkBytes, MarkerWritten: req.Marker}}))
	}
	record(g.apply(CheckSuccess{Now: tDone}))
	record(g.apply(Release{Now: tEvent, Why: "released by the decode engine"}))
	if g.r.Phase() != PhaseReleased {
		t.Fatalf("the hand-off ended %s", g.r.Phase())
	}
	for i, e := range effects {
		if e.Refuse != nil || e.Owing != nil || e.Drain.Ranks != nil || e.Reply != nil || e.Failure != nil || e.ClaimEnd.Failure != nil || e.Err != nil {
			t.Errorf("step %d: effects own something: %+v", i, e)
		}
		if d := e.ClaimEnd.Done; d != nil && d != &phases[*d] {
			t.Errorf("step %d: the claims end with a Done phase of their own", i)
		}
	}
	if effects[9].ClaimEnd.Done == nil {
		t.Error("the success did not end the claims")
	}
}

// allocsOf measures what applying the event ev builds allocates on a room
// in state from (testing.AllocsPerRun: a fresh room each run, built
// beforehand, so that only Apply is measured).
func allocsOf(t *testing.T, from state, prep func(*rig), ev func(*rig) Event) float64 {
	t.Helper()
	const runs = 50
	rooms := make([]*Room, 0, runs+1) // AllocsPerRun runs once more to warm up
	evs := make([]Event, 0, runs+1)
	for range runs + 1 {
		g := newRig(t, from.opts...)
		from.build(g)
		if prep != nil {
			prep(g)
		}
		rooms, evs = append(rooms, g.r), append(evs, ev(g))
	}
	i := 0
	return testing.AllocsPerRun(runs, func() {
		rooms[i].Apply(evs[i])
		i++
	})
}

// The hot events allocate exactly what the room keeps of them (measured;
// the comments say what each allocation is).
func TestApplyAllocatesOnlyWhatTheRoomKeeps(t *testing.T) {
	landedLast := func(g *rig) {
		req := g.chunk(g.rank(0), 1)
		g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
		g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: resultWithMarker})
	}
	for _, c := range []struct {
		name   string
		from   state
		prep   func(*rig)
		ev     func(*rig) Event
		allocs float64
	}{
		// The rank's progress: the rank set (its first rank inline) and the
		// rank's chunk table.
		{name: "Delivered on an admitted room", from: stAdmitted, allocs: 2,
			ev: func(g *rig) Event { return Delivered{Now: tEvent, Rank: g.rank(0).Key(), Attempt: 1} }},
		// Nothing: the chunk's state was made when it began, the
		// transferring step fits the timeline's capacity.
		{name: "ChunkEnd landed: claimed -> transferring", from: stClaimed, prep: started(0), allocs: 0,
			ev: func(g *rig) Event {
				return ChunkEnd{Now: tEvent, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Result: transfer.ChunkResult{Bytes: chunkBytes}}
			}},
		{name: "ChunkEnd landed: the last chunk", from: stTransferring, prep: started(1), allocs: 0,
			ev: func(g *rig) Event {
				return ChunkEnd{Now: tEvent, Req: g.chunk(g.rank(0), 1), Via: ViaEngine, Result: resultWithMarker}
			}},
		// Nothing: the succeeded step fits the timeline, the claims end with
		// the shared Done phase.
		{name: "CheckSuccess: T12/T17", from: stTransferring, prep: landedLast, allocs: 0,
			ev: func(*rig) Event { return CheckSuccess{Now: tEvent} }},
		// The rank's first chunk: its page bitmap, the chunk's state and
		// the chunk table's first slots.
		{name: "ChunkBegin of a rank's first chunk", from: stClaimed, allocs: 3,
			ev: func(g *rig) Event { return ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 0), Via: ViaEngine} }},
		// The chunk's state.
		{name: "ChunkBegin of a rank's next chunk", from: stTransferring, allocs: 1,
			ev: func(g *rig) Event { return ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 1), Via: ViaEngine} }},
		// Nothing: a retry is answered from the chunk's state.
		{name: "ChunkBegin of a retry", from: stTransferring, allocs: 0,
			ev: func(g *rig) Event { return ChunkBegin{Now: tEvent, Req: g.chunk(g.rank(0), 0), Via: ViaEngine} }},
		// The handoff state, the copy of the pages, and the timeline grown
		// to hold the whole hand-off.
		{name: "Admitted", from: stQueued, allocs: 3,
			ev: func(*rig) Event {
				return Admitted{Now: tEvent, Pages: destPages, FillLen: destFill, MetadataSlot: destSlot}
			}},
		// Nothing: the released step fits the timeline.
		{name: "Release", from: stSucceeded, allocs: 0,
			ev: func(*rig) Event { return Release{Now: tEvent, Why: "released by the decode engine"} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := allocsOf(t, c.from, c.prep, c.ev); got != c.allocs {
				t.Errorf("Apply allocated %v times, want %v", got, c.allocs)
			}
		})
	}
}
