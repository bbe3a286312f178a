package kvmanager

import (
	"fmt"
	"slices"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// The reuse invariant: no page, metadata row or state slot is handed to a
// room while a writer of the room that held it before may still land in
// it. The ledgers (prealloc.Ledger, prealloc.Holds) decide when an index is
// free; this is an independent check of their decisions, kept by the
// executor from what it sees happen to rooms, and counted (never enforced)
// when it fails: Observer.PageReuseViolations, the metric
// decodeplane_page_reuse_violations_total, an error log line, and a panic
// under the package's tests (Manager.invariant).
//
// Each shard keeps its own record of the indices a writer may still reach:
//
//   - a room's destination joins it when the destination goes out to a
//     prefill rank (shard.offer: the only place a destination leaves the
//     daemon), or when the engine resyncs a hand-off that was in flight
//     under the previous daemon (adoptInFlight: its ranks may still write);
//   - it leaves once the room's writers are known to have stopped: the
//     room succeeded (every page landed from every rank, each rank's last
//     chunk included), or its resources went back (room.Effects.Release:
//     its failure's drain, quarantine and transfers are over) — and, in
//     either case, the engine calls the executor itself recorded as running
//     into the room (subscribers.calls) have all returned.
//
// Every hand-out of indices to a room (an admission, a resumed room's
// pages, ReportRunning's growth, a declaration of the engine's, a resync's
// adoption) is checked against the record first. The record counts, per
// index, the rooms whose writers may reach it (one byte per page, row and
// slot of the pool), so that noting, checking and forgetting a room's
// destination costs one load or store per index.
type reachTable struct {
	pages, meta []uint8
	state       map[kvlayout.StateType][]uint8
}

// reached is a room's part of its shard's record: the destination it
// noted (the room's own slices, which are never written in place), for
// which attempt, and whether its writers stopped.
type reached struct {
	active  bool
	stopped bool
	attempt uint32
	pages   []int32
	meta    int32
	state   []kvlayout.StateIndices
}

// newReachTable sizes the record by the pool cfg describes (the ledgers
// refuse any index outside it).
func newReachTable(cfg kvlayout.Config) *reachTable {
	p := cfg.Pool
	t := &reachTable{pages: make([]uint8, max(p.Pages(), 0)), meta: make([]uint8, max(p.Metadata(), 0)), state: map[kvlayout.StateType][]uint8{}}
	for _, st := range p.Kind.StateTypes() {
		switch st {
		case kvlayout.StateSWA:
			if p.PageSize > 0 {
				t.state[st] = make([]uint8, max(p.SWA.TotalTokens/int64(p.PageSize), 0))
			}
		case kvlayout.StateMamba:
			t.state[st] = make([]uint8, max(p.Mamba.StateSlots, 0))
		}
		// DSA's indexer pages share the KV pages' numbering: checked as pages.
	}
	return t
}

// add counts one more (delta 1) or one fewer (delta -1) room reaching each
// index of the destination.
func (t *reachTable) add(pages []int32, meta int32, state []kvlayout.StateIndices, delta int) {
	bump := func(tab []uint8, i int32) {
		if i < 0 || int(i) >= len(tab) {
			return
		}
		switch {
		case delta > 0 && tab[i] < 255:
			tab[i]++
		case delta < 0 && tab[i] > 0:
			tab[i]--
		}
	}
	for _, p := range pages {
		bump(t.pages, p)
	}
	bump(t.meta, meta)
	for _, s := range state {
		for _, i := range s.Indices {
			bump(t.state[s.Type], i)
		}
	}
}

// reachable reports whether a writer of some room may still reach index i
// of tab.
func reachable(tab []uint8, i int32) bool { return i >= 0 && int(i) < len(tab) && tab[i] > 0 }

// noteReach records e's destination d in the shard's record (it went out
// to a prefill rank, or its writers outlived the previous daemon). A
// destination noted for this attempt already is not noted again.
func (sh *shard) noteReach(e *entry, pages []int32, meta int32, state []kvlayout.StateIndices) {
	s := e.s()
	r := &s.reach
	if r.active {
		if r.attempt == e.Attempt() {
			return
		}
		sh.reach.add(r.pages, r.meta, r.state, -1) // an earlier attempt's: its writers ended with its success
	}
	*r = reached{active: true, attempt: e.Attempt(), pages: pages, meta: meta, state: state}
	sh.reach.add(pages, meta, state, 1)
}

// writersStopped is told that e's writers are known to have stopped (its
// effects said so: success, or its resources back); its destination leaves
// the record once no engine call the executor started into it is running.
func (sh *shard) writersStopped(e *entry, ef *room.Effects) {
	if e.subs == nil || !e.subs.reach.active {
		return
	}
	if ef.Release || (ef.Move.Moved && ef.Move.To == PhaseSucceeded) {
		e.subs.reach.stopped = true
	}
	sh.settleReach(e)
}

// settleReach forgets e's destination once its writers stopped and no
// engine call into it is running (a call that ends calls it again).
func (sh *shard) settleReach(e *entry) {
	s := e.subs
	if s == nil || !s.reach.active || !s.reach.stopped || len(s.calls) > 0 {
		return
	}
	sh.reach.add(s.reach.pages, s.reach.meta, s.reach.state, -1)
	s.reach = reached{}
}

// handOut checks indices about to be handed to room e against the record:
// every one that a writer of another room may still reach is a violation
// of the reuse invariant, counted, logged and, under the package's tests,
// a panic. It never refuses: the ledger decided; this only checks it.
func (sh *shard) handOut(e *entry, pages []int32, meta int32, state []kvlayout.StateIndices) {
	t := sh.reach
	own := func(what string, i int32) bool { // e's own destination, still noted
		if e.subs == nil || !e.subs.reach.active {
			return false
		}
		r := &e.subs.reach
		switch what {
		case "page":
			return slices.Contains(r.pages, i)
		case "metadata row":
			return r.meta == i
		}
		for _, s := range r.state {
			if s.Type.String()+" slot" == what && slices.Contains(s.Indices, i) {
				return true
			}
		}
		return false
	}
	n, first, firstWhat := 0, int32(-1), ""
	check := func(tab []uint8, what string, i int32) {
		if reachable(tab, i) && !own(what, i) {
			if n == 0 {
				first, firstWhat = i, what
			}
			n++
		}
	}
	for _, p := range pages {
		check(t.pages, "page", p)
	}
	check(t.meta, "metadata row", meta)
	for _, s := range state {
		for _, i := range s.Indices {
			check(t.state[s.Type], s.Type.String()+" slot", i)
		}
	}
	if n == 0 {
		return
	}
	m := sh.m
	m.obs.PageReuseViolations(sh.idx, n)
	m.invariant("page reuse: indices handed to a room while a writer of the room that held them may still land", e.ID(),
		fmt.Errorf("%d of them on decode DP shard %d, the first %s %d, still reachable by the writers of room %d", n, sh.idx, firstWhat, first, sh.reacher(e, firstWhat, first)))
}

// reacher names a room other than e whose noted destination holds index i
// (0 when none is found): for the violation's log line only.
func (sh *shard) reacher(e *entry, what string, i int32) uint64 {
	for id, o := range sh.rooms {
		if o == e || o.subs == nil || !o.subs.reach.active {
			continue
		}
		r := &o.subs.reach
		switch {
		case what == "page" && slices.Contains(r.pages, i), what == "metadata row" && r.meta == i:
			return id
		}
		for _, s := range r.state {
			if s.Type.String()+" slot" == what && slices.Contains(s.Indices, i) {
				return id
			}
		}
	}
	return 0
}
