package kvmanager

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
	"github.com/decodeplane/decodeplane/kvmanager/room"
	"github.com/decodeplane/decodeplane/prealloc"
)

// Engine resync. After a restart the daemon's ledgers are
// empty while the decode engine still decodes its running requests in pages
// a new admission would hand out again. With a resync wait (HoldForResync,
// engine.resync_timeout > 0) the manager starts without admitting: rooms
// open and queue, no admission pass runs (the admission pass returns at once), so
// nothing is pre-allocated. The engine re-declares its running rooms
// (Resync); each becomes a running room (PhaseSucceeded, not released)
// that owns exactly what the engine names (prealloc.Ledger.AdoptEntry).
// Admission starts when the engine says it is done, or when the wait
// expires (a deadline of the one heap, dlResync): then the pool less what
// was declared is admitted into, with a warning, since pages of rooms the
// engine never declared may be handed out again. A resync once admission
// has started is refused (ErrResyncClosed): the pool is in use.
//
// Locks: resync.mu is taken before a shard's lock (Resync adopts under it,
// so that the wait cannot end half-way through a call) and alone (status,
// the expiry); gated is read by the admission pass without it.

// ErrResyncClosed: a Resync once admission has started (no resync wait was
// configured, the engine already sent done, or the wait expired): the pool
// is in use. FailedPrecondition.
var ErrResyncClosed = errors.New("admission already started: the pool is in use, a resync is no longer possible")

// ResyncRoom is one room the decode engine still runs, in its own
// numbering (see prealloc.Adoption).
type ResyncRoom struct {
	Room         uint64
	RID          string
	PromptLen    int
	OutputLen    int
	MaxNewTokens int
	DecodeDP     int
	ReqSlot      int32
	Pages        []int32
	SWAPages     []int32
	MambaSlots   []int32
	// Addr is the room's prefill bootstrap address ("" if unknown; a
	// rebootstrap needs it); PrefillDP its prefill DP rank, -1 if unknown.
	Addr      string
	PrefillDP int
	// InFlight: with the decode engine as the page owner (kv_pool.owner:
	// engine) the engine re-declares only the hand-offs it still had in
	// flight — declared and neither succeeded nor reusable — since a
	// prefill rank may still write into their pages (its running requests
	// are its own: there is nothing to adopt). Pages are then the declared
	// pages beyond DecodePrefixLen, MetadataSlot and State the declared row
	// and state indices; ReqSlot, OutputLen, SWAPages and MambaSlots are
	// not used. See adoptInFlight.
	InFlight        bool
	MetadataSlot    int32
	State           []kvlayout.StateIndices
	DecodePrefixLen int
}

// ResyncState is the resync's progress.
type ResyncState struct {
	// Waiting: admission is held for the engine's resync, until Until.
	Waiting bool
	Until   time.Time
	// Declared rooms adopted so far and the pages they hold.
	Declared int
	Pages    int64
	// Expired: the wait ran out before the engine's done.
	Expired bool
}

// resyncGate is the manager's resync state (Manager.rs).
type resyncGate struct {
	gated atomic.Bool // admission held; read without mu

	mu       sync.Mutex
	open     bool // a resync is accepted (the wait is on)
	started  time.Time
	until    time.Time
	declared int
	pages    int64
	expired  bool
	dl       deadline
}

// HoldForResync starts the resync wait: no admission until Resync(done) or
// timeout from now. Call it before serving; timeout <= 0 does nothing.
func (m *Manager) HoldForResync(timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	g := &m.rs
	g.mu.Lock()
	defer g.mu.Unlock()
	now := m.clock.Now()
	g.open, g.started, g.until = true, now, now.Add(timeout)
	g.gated.Store(true)
	m.dl.set(&g.dl, dlResync, g.until, 0, nil)
}

// ResyncStatus is the resync's progress (for readiness and GetStatus).
func (m *Manager) ResyncStatus() ResyncState {
	g := &m.rs
	g.mu.Lock()
	defer g.mu.Unlock()
	return ResyncState{Waiting: g.open, Until: g.until, Declared: g.declared, Pages: g.pages, Expired: g.expired}
}

// Resync adopts the rooms the decode engine still runs, in order; done ends
// the wait once they are adopted. It returns how many rooms this call
// adopted; the first room refused stops it (the rooms before it stay
// adopted) with an error naming rooms[i] and its field: an InvalidError
// (a bad index, count or shard), ErrRoomExists, prealloc.ErrOwned (a page,
// slot or row another room holds) or ErrResyncClosed.
func (m *Manager) Resync(rooms []ResyncRoom, done bool) (int, ResyncState, error) {
	g := &m.rs
	g.mu.Lock()
	if !g.open {
		st := ResyncState{Declared: g.declared, Pages: g.pages, Expired: g.expired}
		g.mu.Unlock()
		return 0, st, fmt.Errorf("resync: %w", ErrResyncClosed)
	}
	var err error
	n := 0
	for i := range rooms {
		if err = m.adopt(i, &rooms[i]); err != nil {
			break
		}
		n++
		g.declared++
		g.pages += int64(len(rooms[i].Pages))
	}
	if n > 0 {
		m.obs.RoomsAdopted(n)
	}
	ended := done && err == nil
	if ended {
		m.endResync(false)
	}
	st := ResyncState{Waiting: g.open, Until: g.until, Declared: g.declared, Pages: g.pages, Expired: g.expired}
	g.mu.Unlock()
	if ended {
		m.shards.each(func(sh *shard) { sh.admit() }) // the wait ended: admit
	}
	return n, st, err
}

// adopt makes one declared room a running room (g.mu held).
func (m *Manager) adopt(i int, d *ResyncRoom) error {
	at := func(f string) string { return fmt.Sprintf("rooms[%d].%s", i, f) }
	if d.DecodeDP < 0 || d.DecodeDP >= len(m.shards) {
		return invalid(at("decode_dp_rank"), "%d is out of range: this daemon hosts %d decode DP shards (allowed 0..%d)", d.DecodeDP, len(m.shards), len(m.shards)-1)
	}
	switch engine := m.shards[d.DecodeDP].holds != nil; {
	case engine && !d.InFlight:
		return invalid(at("in_flight"), "is false, but kv_pool.owner is engine: the engine's running requests are its own (there is nothing to adopt); re-declare only the hand-offs still in flight, with in_flight set")
	case !engine && d.InFlight:
		return invalid(at("in_flight"), "is set, but kv_pool.owner is daemon: re-declare the running rooms with what each holds (in_flight is for an engine that owns its pages)")
	}
	sh := m.shards[d.DecodeDP]
	sh.mu.Lock()
	defer sh.unlock()
	// The room id is unique across the shards: look, adopt and insert under
	// openMu (a resync is rare; the ledger's lock is a leaf).
	m.openMu.Lock()
	defer m.openMu.Unlock()
	if _, other := m.shards.find(d.Room); other != nil {
		return fmt.Errorf("%s: room %d: %w (phase %s)", at("room"), d.Room, ErrRoomExists, other.Phase())
	}
	if d.InFlight {
		return sh.adoptInFlight(i, d)
	}
	e := &entry{}
	a := prealloc.Adoption{
		Request: prealloc.Request{Room: d.Room, RID: d.RID, PromptLen: d.PromptLen, OutputLen: d.OutputLen, MaxNewTokens: d.MaxNewTokens},
		ReqSlot: d.ReqSlot, Pages: d.Pages, SWAPages: d.SWAPages, MambaSlots: d.MambaSlots,
	}
	if err := sh.led.AdoptEntry(&e.led, a); err != nil {
		if errors.Is(err, prealloc.ErrInvalidRequest) {
			return invalid(at(adoptField(err)), "%v", err)
		}
		return fmt.Errorf("%s: %w", at(adoptField(err)), err)
	}
	var state []kvlayout.StateIndices
	if al, ok := sh.led.Allocation(d.Room); ok {
		state = al.State
	}
	ef := e.Apply(room.Adopt{Now: m.clock.Now(), ID: d.Room, Addr: d.Addr, DecodeDP: d.DecodeDP, PrefillDP: d.PrefillDP, Params: m.params,
		Request: room.Request{RID: d.RID, PromptLen: d.PromptLen, OutputLen: d.OutputLen, MaxNewTokens: d.MaxNewTokens},
		ReqSlot: d.ReqSlot, Pages: d.Pages, FillLen: d.PromptLen + d.OutputLen, State: state})
	sh.handOut(e, d.Pages, -1, state)
	sh.insert(e)
	sh.apply(e, &ef)
	// Claims that came before the room was adopted (a prefill that claimed
	// again after the restart) get its state now, as OpenRoom's do, instead
	// of waiting for timeouts.bootstrap.
	for _, c := range m.pend.take(e.ID()) {
		m.dl.clear(&c.expiry)
		sh.attach(e, c)
	}
	return nil
}

// adoptInFlight holds a hand-off the decode engine still had in flight when
// the previous daemon stopped (kv_pool.owner: engine; mu and openMu held):
// its declared pages, row and state slots are held in the hand-off ledger
// (a *prealloc.HeldError when another room holds one) and the room starts
// failed and draining (room.Adopt InFlight). The prefill ranks that may
// still write are known only when its prefill instance is registered
// complete at this daemon with the room's prefill DP rank given: they owe
// an AckRoomEnd (any attempt, incarnation 0: their claims died with the
// previous daemon); otherwise release.deferred_timeout alone ends the
// hold. Either way the room's watchers then see its pages reusable.
func (sh *shard) adoptInFlight(i int, d *ResyncRoom) error {
	m := sh.m
	at := fmt.Sprintf("rooms[%d].", i)
	fill, err := room.DeclaredFill(m.layout.PageSize, d.PromptLen, d.DecodePrefixLen, len(d.Pages), at)
	if err != nil {
		return err
	}
	if err := sh.holds.Declare(d.Room, prealloc.Declared{Pages: d.Pages, MetadataSlot: d.MetadataSlot, State: d.State}); err != nil {
		var fe *kvlayout.Invalid
		if errors.As(err, &fe) {
			return invalid(at+fe.Field, "%s", fe.Msg)
		}
		if errors.Is(err, prealloc.ErrHeld) {
			m.obs.DeclarationRefused(sh.idx) // counted as the ledger counts it
		}
		return fmt.Errorf("%s: %w", at+heldField(err), err)
	}
	var owing []ranks.RankID
	if inst, ok := m.reg.Instance(d.Addr); ok && inst.Complete && d.PrefillDP >= 0 && d.PrefillDP < inst.Topology.DP {
		for _, k := range inst.Plan.Required() {
			owing = append(owing, ranks.RankID{Addr: inst.Addr, DP: d.PrefillDP, CP: k.CP, TP: k.TP, PP: k.PP})
		}
	}
	e := &entry{}
	ef := e.Apply(room.Adopt{Now: m.clock.Now(), ID: d.Room, Addr: d.Addr, DecodeDP: d.DecodeDP, PrefillDP: d.PrefillDP, Params: m.params,
		Request: room.Request{RID: d.RID, PromptLen: d.PromptLen, MaxNewTokens: d.MaxNewTokens}, ReqSlot: -1,
		Pages: d.Pages, FillLen: fill, State: d.State, InFlight: true, Owing: owing, DecodePrefixLen: d.DecodePrefixLen})
	// The previous daemon's claims may still write into it: checked, then
	// noted until its pages are reusable.
	sh.handOut(e, d.Pages, d.MetadataSlot, d.State)
	sh.noteReach(e, d.Pages, d.MetadataSlot, d.State)
	sh.insert(e)
	sh.apply(e, &ef)
	return nil
}

// heldField names the field of a hand-off in flight whose index another
// room holds (a *prealloc.HeldError).
func heldField(err error) string {
	var he *prealloc.HeldError
	switch {
	case !errors.As(err, &he) || he.What == "page":
		return "page_indices"
	case he.What == "metadata slot":
		return "metadata_slot"
	}
	return "state"
}

// adoptField names the ResyncRoom field a ledger refusal is about.
func adoptField(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "swa page"), strings.Contains(s, "SWA pages"):
		return "swa_page_indices"
	case strings.Contains(s, "mamba slot"):
		return "mamba_slots"
	case strings.Contains(s, "req slot"):
		return "req_slot"
	case strings.Contains(s, "page"):
		return "page_indices"
	}
	return "prompt_len"
}

// endResync ends the wait (g.mu held); the caller admits on every shard after
// releasing g.mu.
func (m *Manager) endResync(expired bool) {
	g := &m.rs
	g.open, g.expired = false, expired
	g.gated.Store(false)
	m.dl.clear(&g.dl)
	d := m.clock.Now().Sub(g.started)
	m.obs.ResyncEnded(d, g.declared, expired)
	if expired {
		m.log.Warn("the decode engine's resync did not finish in time: admitting with the pool less the rooms it declared; pages of rooms it never declared may be handed out again",
			"waited", d, "rooms_declared", g.declared, "pages_declared", g.pages)
		return
	}
	m.log.Info("decode engine resync done: admitting", "took", d, "rooms_adopted", g.declared, "pages_adopted", g.pages)
}

// resyncExpired is the dlResync deadline.
func (m *Manager) resyncExpired() {
	g := &m.rs
	g.mu.Lock()
	if !g.open || m.clock.Now().Before(g.until) {
		g.mu.Unlock()
		return
	}
	m.endResync(true)
	g.mu.Unlock()
	m.shards.each(func(sh *shard) { sh.admit() }) // the wait ended: admit
}
