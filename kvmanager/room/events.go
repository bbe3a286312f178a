package room

import (
	"fmt"
	"slices"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// The events of a room's way to its destination: opened, its prefill
// known, its DP rank bound, admitted (or adopted, or resumed), claimed.

// Open opens a room (OpenRoom, SGLang T1): it is WaitingPrefill, attempt 1,
// bounded by Params.Bootstrap from Now. It is applied to a zero Room, once.
type Open struct {
	Now      time.Time
	ID       uint64
	Addr     string
	DecodeDP int
	// HintDP is the router's prefill DP rank hint, -1 if none.
	HintDP         int
	Request        Request
	IdempotencyKey string
	Params         *Params
	// Timeout is the request's time budget from Now (0: none; at most
	// MaxTimeout, in whole milliseconds): its hand-off must succeed by then,
	// and every bound of its first attempt ends by then at the latest.
	Timeout time.Duration
}

// PrefillKnown: the room's prefill instance completed its registration
// (SGLang T4's handshake): its rank plan and topology, and, when the room
// has neither a pinned DP rank nor an out-of-range hint, what the
// registry's rules resolved its DP rank to (ranks.ResolveDP).
type PrefillKnown struct {
	Now      time.Time
	Plan     *ranks.Plan
	Topology ranks.PrefillTopology
	Resolved bool
	DP       int
	Rule     ranks.DPRule
}

// Bound: a prefill rank of Addr reported holding the room on DP rank DP
// (BindRoom, SGLang's register_dp_rank).
type Bound struct {
	Now        time.Time
	Addr       string
	DP         int
	SelfWriter bool
}

// Admitted: the room's destination is allocated by the daemon's ledger or
// declared by the decode engine (SGLang T11), or a retracted room got its
// pages back (Resumed, T20). DecodePrefixLen is the tokens of the engine's
// decode prefix before the destination's pages. Staged: the staging
// handler takes the room (its success waits for the scatters). The slices
// are copied.
type Admitted struct {
	Now             time.Time
	Pages           []int32
	FillLen         int
	MetadataSlot    int32
	State           []kvlayout.StateIndices
	DecodePrefixLen int
	Resumed         bool
	Staged          bool
	// Layouts are the decode engine's buffer layouts of the shard (index =
	// decode TP rank), kept by the room for its hand-off; nil: none.
	Layouts []*kvlayout.BufferLayout
}

// Attach: a prefill rank's claim stream attached to the room
// (AwaitDestination). Registered: the rank is registered with this daemon.
// The stream is refused (Err, Reply), ended at once with the room's end
// (Reply), or attached and offered the destination (Offer).
type Attach struct {
	Rank       ranks.RankID
	Registered bool
	// Set is where the room keeps its attached ranks, given by the caller
	// with the first Attach (the storage of the caller's own claim table);
	// nil: the room makes its own.
	Set *Attachments
}

// Detach: rank's claim stream ended (claims already made stand).
type Detach struct{ Rank ranks.RankKey }

// Delivered: rank's claim stream wrote the destination of Attempt: the rank
// claimed it.
type Delivered struct {
	Now     time.Time
	Rank    ranks.RankKey
	Attempt uint32
}

// Transferring: every rank claimed after chunks had landed.
type Transferring struct{ Now time.Time }

// Retract: a running room gave its pages back (RetractRoom): RETRACT
// (T20, Held false) or REBOOTSTRAP (T21, Held true). The allocator took
// them back first.
type Retract struct {
	Now  time.Time
	Held bool
}

// Grow: a running room's allocation grew by Pages (ReportRunning).
type Grow struct{ Pages []int32 }

// Rebootstrap starts a held room's next attempt (ContinueGeneration,
// SGLang T22): it forgets its destination, claims and per-attempt progress
// and bootstraps again, bounded by Params.Bootstrap from Now.
type Rebootstrap struct{ Now time.Time }

// Adopt makes a zero Room a running room the decode engine still decodes
// after a daemon restart (Resync): it holds exactly Pages (FillLen tokens)
// and State and never was admitted here.
type Adopt struct {
	Now       time.Time
	ID        uint64
	Addr      string
	DecodeDP  int
	PrefillDP int
	Request   Request
	ReqSlot   int32
	Pages     []int32
	FillLen   int
	State     []kvlayout.StateIndices
	Params    *Params
	// InFlight: a hand-off the decode engine still had in flight when the
	// previous daemon stopped (kv_pool.owner: engine): the room starts
	// failed (its claims died with that daemon) with its declared pages,
	// row and slots held, draining, until Owing (the prefill ranks that may
	// still write, when known) acknowledge, or release.deferred_timeout
	// from now passes — whichever ends the hold first for known ranks, the
	// timeout alone otherwise. DecodePrefixLen is the declaration's.
	InFlight        bool
	Owing           []ranks.RankID
	DecodePrefixLen int
}

// Gate holds (Hold) or lifts a named condition the room's success waits
// for; lifting it with Failure fails the room.
type Gate struct {
	Now        time.Time
	Name       string
	Hold       bool
	Failure    *Failure
	SelfWriter bool
}

func (Open) event()             {}
func (PrefillKnown) event()     {}
func (Bound) event()            {}
func (Admitted) event()         {}
func (Attach) event()           {}
func (Detach) event()           {}
func (Delivered) event()        {}
func (Transferring) event()     {}
func (Retract) event()          {}
func (Grow) event()             {}
func (Rebootstrap) event()      {}
func (Adopt) event()            {}
func (Gate) event()             {}
func (ChunkBegin) event()       {}
func (ChunkEnd) event()         {}
func (ChunkDropped) event()     {}
func (StagingWrite) event()     {}
func (StagingAllocated) event() {}
func (ScatterBegin) event()     {}
func (ScatterEnd) event()       {}
func (CheckSuccess) event()     {}
func (Fail) event()             {}
func (Release) event()          {}
func (Ack) event()              {}
func (Deadline) event()         {}
func (Close) event()            {}

func (r *Room) open(o Open, e *Effects) {
	*r = Room{
		id: o.ID, addr: o.Addr, decodeDP: int32(o.DecodeDP), hintDP: int32(o.HintDP), prefillDP: -1,
		attempt: 1, openedAt: stampOf(o.Now), updatedAt: stampOf(o.Now), metaSlot: -1,
		bootstrapAt: stampOf(o.Now.Add(o.Params.Bootstrap)), cfg: o.Params, inLedger: true, owner: o.Params.Owner,
	}
	r.setRequest(o.Request)
	r.timeoutMS = uint32(min(max(o.Timeout, 0), MaxTimeout) / time.Millisecond)
	if o.IdempotencyKey != "" {
		r.x().idemKey = o.IdempotencyKey
	}
	r.move(o.Now, PhaseWaitingPrefill, "T1", numNote(noteOpened, int64(o.DecodeDP), 0), e)
}

func (r *Room) adopt(a Adopt, e *Effects) {
	*r = Room{
		id: a.ID, addr: a.Addr, decodeDP: int32(a.DecodeDP), hintDP: -1, prefillDP: -1,
		attempt: 1, openedAt: stampOf(a.Now), updatedAt: stampOf(a.Now), metaSlot: -1, cfg: a.Params, inLedger: true,
	}
	r.setRequest(a.Request)
	if a.PrefillDP >= 0 {
		r.prefillDP = int32(a.PrefillDP)
	}
	r.admittedOnce()
	r.pages = slices.Clone(a.Pages)
	r.fillLen = a.FillLen
	r.state = cloneState(a.State)
	if a.InFlight {
		r.inherit(a, e)
		return
	}
	r.move(a.Now, PhaseSucceeded, "", textNote(fmt.Sprintf(
		"adopted at the engine's resync: %d pages, req slot %d (prompt %d + output %d tokens)", len(a.Pages), a.ReqSlot, a.Request.PromptLen, a.Request.OutputLen)), e)
}

// inherit makes an adopted room a hand-off that was in flight when the
// previous daemon stopped: failed at once, its resources held (draining)
// until its owing ranks acknowledge or release.deferred_timeout passes.
func (r *Room) inherit(a Adopt, e *Effects) {
	r.owner, r.decodePrefix = OwnerEngine, a.DecodePrefixLen
	until := stampOf(a.Now.Add(r.cfg.DeferredTimeout))
	fc := Failure{Code: FailureShutdown, Message: fmt.Sprintf(
		"the daemon restarted while room %d's hand-off was in flight: inherited at the decode engine's resync with %d pages held until its prefill ranks acknowledge (AckRoomEnd) or release.deferred_timeout passes", r.id, len(a.Pages))}
	x := r.x()
	x.failure, x.inherited = &fc, true
	r.move(a.Now, PhaseFailed, "", textNote(fc.Message), e)
	e.Failure = &fc
	if len(a.Owing) > 0 && r.cfg.DeferredTimeout > 0 {
		r.drain = &drainState{attempt: r.attempt, owing: slices.Clone(a.Owing), started: true, until: until}
		e.DrainStarted, e.Drain = true, DrainNote{Attempt: r.attempt, Ranks: r.drain.owing, Until: until.time()}
	} else if r.cfg.DeferredTimeout > 0 {
		r.handoff.quarantine = until // which ranks still write is not known: the bound alone ends the hold
	}
	e.Ledger |= LedgerDrain
	r.end(a.Now, e)
}

func (r *Room) prefillKnown(p PrefillKnown, e *Effects) {
	if r.phase != PhaseWaitingPrefill {
		return
	}
	e.Unwait = true
	topo := p.Topology
	r.plan = p.Plan
	r.staging = p.Plan.Staging()
	r.topo = topology{dp: int32(topo.DP), attnTP: int32(topo.AttnTP), pp: int32(topo.PP), follow: topo.FollowBootstrapRoom}
	if r.handoff != nil { // a rebootstrap's new attempt starts its rank progress empty
		r.ranks, r.claimedN, r.doneN = nil, 0, 0
	}
	switch {
	case int(r.hintDP) >= topo.DP:
		r.fail(Fail{Now: p.Now, Failure: Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf("disagg_prefill_dp_rank %d is out of range for %s (dp_size %d)", r.hintDP, r.addr, topo.DP)}}, e)
	case r.prefillDP >= 0: // rebootstrap: stay on the bound DP rank (SGLang #40730)
		if int(r.prefillDP) >= topo.DP {
			r.fail(Fail{Now: p.Now, Failure: Failure{Code: FailureDPRankUnresolved, Message: fmt.Sprintf(
				"rebootstrap of room %d: its prefill DP rank %d no longer exists at %s (dp_size is now %d)", r.id, r.prefillDP, r.addr, topo.DP)}}, e)
			return
		}
		r.dpResolved(p.Now, int(r.prefillDP), r.dpRule, e)
	case p.Resolved:
		r.dpResolved(p.Now, p.DP, p.Rule, e)
	default:
		r.x().dpAt = stampOf(p.Now.Add(r.cfg.DPRankResolution))
		r.move(p.Now, PhaseResolvingDP, "", numNote(noteResolvingDP, int64(topo.DP), b2i(topo.FollowBootstrapRoom)), e)
	}
}

// NeedsDPRule reports whether the registry's rules are to be asked for the
// room's DP rank when its prefill is known (topology dp): it has no pinned
// rank (a rebootstrap keeps its own) and its hint is in range.
func (r *Room) NeedsDPRule(dp int) bool { return r.prefillDP < 0 && int(r.hintDP) < dp }

// dpResolved records the room's prefill DP rank and queues it for
// admission (T2/T4/T8: the handshake is done); claims of ranks of another
// DP rank are refused.
func (r *Room) dpResolved(now time.Time, dp int, rule ranks.DPRule, e *Effects) {
	for _, rk := range r.attached.removeIf(func(rk ranks.RankID) bool { return rk.DP != dp }) {
		e.Refuse = append(e.Refuse, Refused{Rank: rk.Key(), Event: DestinationEvent{Failure: &Failure{Code: FailureDPRankConflict,
			Message: fmt.Sprintf("rank %s is not a source of room %d: the room's prefill DP rank is %d (%s)", rk, r.id, dp, rule)}}})
	}
	r.prefillDP, r.dpRule = int32(dp), rule
	if r.extra != nil {
		r.extra.dpAt = 0
	}
	r.move(now, PhaseQueued, "T2/T4/T8", numNote(noteDPResolved, int64(dp), int64(rule)), e)
	e.Resolved, e.Rule, e.DP = true, rule, dp
	e.Ledger |= LedgerReady
	e.AdmitNow = true
}

func (r *Room) bound(b Bound, e *Effects) {
	if r.addr != b.Addr {
		return
	}
	switch {
	case r.phase == PhaseResolvingDP:
		r.dpResolved(b.Now, b.DP, ranks.DPRuleBinding, e)
	case r.prefillDP >= 0 && int(r.prefillDP) != b.DP && r.HandingOff():
		msg := fmt.Sprintf("prefill DP rank %d reported holding room %d, but the room was resolved to dp_rank %d (%s); the destination would go to the wrong ranks", b.DP, r.id, r.prefillDP, r.dpRule)
		r.fail(Fail{Now: b.Now, Failure: Failure{Code: FailureDPRankConflict, Message: msg}, SelfWriter: b.SelfWriter}, e)
		e.Err = fmt.Errorf("%w: %s", ranks.ErrDPRankConflict, msg)
	}
}

func (r *Room) admitted(a Admitted, e *Effects) {
	r.admittedOnce()
	r.pages = slices.Clone(a.Pages)
	r.fillLen = a.FillLen
	r.metaSlot = a.MetadataSlot
	r.state = cloneState(a.State)
	r.decodePrefix = a.DecodePrefixLen
	r.layouts = a.Layouts
	if a.Resumed {
		// The engine reloads the room's KV from its CPU copy: the room runs
		// again, so that it can grow, be retracted again and be released.
		e.Ledger |= LedgerRunning
		r.parkedAt = 0
		r.move(a.Now, PhaseSucceeded, "T20", numNote(noteResumed, int64(len(r.pages)), 0), e)
		return
	}
	r.admittedAt = stampOf(a.Now)
	r.claimBy = 0
	if r.cfg.ClaimTimeout > 0 {
		r.claimBy = stampOf(a.Now.Add(r.cfg.ClaimTimeout))
	}
	r.move(a.Now, PhaseAdmitted, "T11", numNote(noteAdmitted, int64(len(r.pages)), int64(r.metaSlot)), e)
	e.Admission, e.AdmittedAfter = true, a.Now.Sub(r.openedAt.time())
	if a.Staged {
		// Registered before the destination goes out (SGLang's
		// register_decode_req before send_metadata).
		r.hold(StagingGate)
		e.StagingOpen = true
	}
	e.Offer = OfferAll
}

func cloneState(in []kvlayout.StateIndices) []kvlayout.StateIndices {
	out := make([]kvlayout.StateIndices, len(in))
	for i, s := range in {
		out[i] = kvlayout.StateIndices{Type: s.Type, Indices: slices.Clone(s.Indices)}
	}
	return out
}

// attach decides what a claim stream of an open room gets: refused (not
// the room's prefill instance, not its DP rank, not registered), the room's
// end at once, or its destination (now or at admission).
func (r *Room) attach(a Attach, e *Effects) {
	refuse := func(code FailureCode, err error) {
		e.Err = err
		e.Reply = &DestinationEvent{Failure: &Failure{Code: code, Message: err.Error()}, Refused: err}
	}
	rank := a.Rank
	switch {
	case rank.Addr != r.addr:
		refuse(FailureUnspecified, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr))
		return
	case r.prefillDP >= 0 && rank.DP != int(r.prefillDP):
		refuse(FailureDPRankConflict, invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", rank.DP, r.id, r.prefillDP, r.dpRule))
		return
	case !a.Registered:
		refuse(FailureUnspecified, ErrRankNotRegistered(r.id, rank))
		return
	}
	switch {
	case r.phase == PhaseFailed:
		e.Reply = &DestinationEvent{Failure: r.Failure()}
		return
	case r.phase.Poll() == PollSuccess || r.phase == PhaseReleased:
		e.Reply = &DestinationEvent{Done: donePhase(r.phase)}
		return
	}
	if r.attached == nil {
		r.attached = a.Set
		if r.attached == nil {
			r.attached = &Attachments{}
		}
	}
	r.attached.add(rank)
	if r.hasDestination() {
		e.Offer, e.OfferTo = OfferOne, rank.Key()
	}
}

// ErrRankNotRegistered refuses a claim of a rank that its registered
// instance lacks.
func ErrRankNotRegistered(room uint64, rank ranks.RankID) error {
	return fmt.Errorf("await destination of room %d: %w: rank %s is not registered with this daemon (RegisterPrefill first)", room, ranks.ErrPrefillNotFound, rank)
}

// donePhase is a shared, read-only pointer to phase p (DestinationEvent.Done).
func donePhase(p Phase) *Phase {
	if int(p) < len(phases) {
		return &phases[p]
	}
	q := p // not &p: that moves p to the heap on every call, the shared path included
	return &q
}

var phases = [...]Phase{PhaseUnspecified, PhaseWaitingPrefill, PhaseResolvingDP, PhaseQueued, PhaseAdmitted, PhaseClaimed,
	PhaseTransferring, PhaseSucceeded, PhaseReleased, PhaseFailed, PhaseRetracted, PhaseHeld}

func (r *Room) delivered(d Delivered, e *Effects) {
	if d.Attempt != r.attempt || r.phase != PhaseAdmitted {
		return
	}
	if rp := r.progress(d.Rank); rp != nil {
		r.claimRank(d.Now, rp, e)
	}
}

// claimRank records one required rank's claim on this attempt; the room is
// claimed when every required rank has one: the claim timeout stops and
// SGLang's waiting timeout starts (T11).
func (r *Room) claimRank(now time.Time, rp *rankProgress, e *Effects) {
	if rp.claimed {
		return
	}
	rp.claimed = true
	r.claimedN++
	if r.claimedN < len(r.plan.Required()) || r.phase != PhaseAdmitted {
		return
	}
	e.Ledger |= LedgerClaim
	r.claimedAt = stampOf(now)
	r.waitingAt = stampOf(now.Add(r.cfg.Waiting))
	r.claimBy = 0
	r.move(now, PhaseClaimed, "T11", numNote(noteClaimed, int64(len(r.plan.Required())), int64(r.cfg.Waiting)), e)
	if r.chunksDone > 0 {
		e.Then = ThenTransferring
	}
}

// CanRetract refuses a retraction of a room that is not running.
func (r *Room) CanRetract() error {
	if r.phase != PhaseSucceeded {
		return fmt.Errorf("retract room %d: %w: only a running (succeeded) room can be retracted (phase %s)", r.id, ErrWrongState, r.phase)
	}
	return nil
}

func (r *Room) retract(rt Retract, e *Effects) {
	if r.phase != PhaseSucceeded {
		e.Err = r.CanRetract()
		return
	}
	bound := r.cfg.Retracted
	if rt.Held {
		bound = r.cfg.Held
	}
	if bound <= 0 {
		bound = DefaultParkedTimeout
	}
	r.admittedOnce() // a running room has one (admitted, or adopted)
	r.parkedAt = stampOf(rt.Now.Add(bound))
	r.pages = nil
	if rt.Held {
		r.move(rt.Now, PhaseHeld, "T21", textNote("held for rebootstrap until ContinueGeneration"), e)
		e.AdmitNow = true
		return
	}
	r.move(rt.Now, PhaseRetracted, "T20", textNote("retracted: pages returned; resumes after the next ReportRunning, before new admissions"), e)
}

func (r *Room) rebootstrap(rb Rebootstrap, e *Effects) {
	if r.phase != PhaseHeld {
		return
	}
	r.attempt++
	if r.handoff != nil {
		r.pages, r.state, r.fillLen, r.marker = nil, nil, 0, 0
		r.chunksDone, r.bytes = 0, 0
		r.ranks = nil
		r.waitingAt, r.claimedAt, r.admittedAt, r.claimBy, r.stagingBy, r.parkedAt = 0, 0, 0, 0, 0, 0
	}
	r.metaSlot = -1
	r.attached.clear()
	r.plan = nil // set again once the prefill is known
	if r.extra != nil {
		r.extra.gates = nil
	}
	r.bootstrapAt = stampOf(rb.Now.Add(r.cfg.Bootstrap))
	r.move(rb.Now, PhaseWaitingPrefill, "T22", numNote(noteRebootstrap, int64(r.attempt), 0), e)
}

func (r *Room) gateEvent(g Gate, e *Effects) {
	if g.Hold {
		if r.phase.Terminal() || r.phase.Poll() == PollSuccess {
			e.Err = fmt.Errorf("hold success of room %d: %w (phase %s)", r.id, ErrWrongState, r.phase)
			return
		}
		r.hold(g.Name)
		return
	}
	if r.phase.Terminal() {
		return
	}
	r.unhold(g.Name)
	if g.Failure != nil {
		r.fail(Fail{Now: g.Now, Failure: *g.Failure, SelfWriter: g.SelfWriter}, e)
		return
	}
	e.Then = ThenCheckSuccess
}

// clear forgets every attached rank (the claims ended).
func (s *Attachments) clear() {
	if s != nil {
		*s = Attachments{}
	}
}

// Attachments is the room's attached claim streams by rank (the streams are
// its caller's). Most rooms have one required rank, so the first is kept
// inline and a map is made only for a second rank.
type Attachments struct {
	r1   ranks.RankID
	has1 bool
	more map[ranks.RankKey]ranks.RankID
}

func (s *Attachments) has(k ranks.RankKey) bool {
	if s == nil {
		return false
	}
	if s.has1 && s.r1.Key() == k {
		return true
	}
	_, ok := s.more[k]
	return ok
}

func (s *Attachments) add(rk ranks.RankID) {
	k := rk.Key()
	switch {
	case s.has1 && s.r1.Key() == k, !s.has1 && !s.hasMore(k):
		s.r1, s.has1 = rk, true
	default:
		if s.more == nil {
			s.more = make(map[ranks.RankKey]ranks.RankID)
		}
		s.more[k] = rk
	}
}

func (s *Attachments) hasMore(k ranks.RankKey) bool {
	_, ok := s.more[k]
	return ok
}

func (s *Attachments) remove(k ranks.RankKey) {
	if s == nil {
		return
	}
	if s.has1 && s.r1.Key() == k {
		s.r1, s.has1 = ranks.RankID{}, false
		return
	}
	delete(s.more, k)
}

// removeIf removes (and returns, in no order) the ranks drop selects.
func (s *Attachments) removeIf(drop func(ranks.RankID) bool) []ranks.RankID {
	if s == nil {
		return nil
	}
	var out []ranks.RankID
	if s.has1 && drop(s.r1) {
		out = append(out, s.r1)
		s.r1, s.has1 = ranks.RankID{}, false
	}
	for k, rk := range s.more {
		if drop(rk) {
			out = append(out, rk)
			delete(s.more, k)
		}
	}
	return out
}

// each calls f for every attached rank.
func (s *Attachments) each(f func(ranks.RankID)) {
	if s == nil {
		return
	}
	if s.has1 {
		f(s.r1)
	}
	for _, rk := range s.more {
		f(rk)
	}
}

// Ranks lists the room's attached claim streams' ranks (in no order).
func (r *Room) Ranks() []ranks.RankID {
	var out []ranks.RankID
	r.attached.each(func(rk ranks.RankID) { out = append(out, rk) })
	return out
}

// CheckDeclaration is the room's side of a destination the decode engine
// declares (kv_pool.owner: engine): the room must wait for it (its prefill
// known and its DP rank resolved: KVPoll WaitingForInput, phase queued);
// the decode prefix is page-aligned and shorter than the tokens prefill
// holds; the pages are exactly those of the tokens beyond the prefix. It
// returns the tokens prefill writes into the pages (the destination's fill
// length), or already for a room that holds this very destination (a
// retried declaration). It changes nothing.
func (r *Room) CheckDeclaration(pages []int32, metaSlot int32, prefix int) (fill int, already bool, err error) {
	switch {
	case r.owner != OwnerEngine:
		return 0, false, fmt.Errorf("declare destination of room %d: %w: kv_pool.owner is daemon: the daemon admits rooms and chooses their pages (set kv_pool.owner: engine for an engine that allocates them)", r.id, ErrWrongState)
	case r.phase.Terminal():
		return 0, false, fmt.Errorf("declare destination of room %d: %w: the room ended (phase %s)", r.id, ErrWrongState, r.phase)
	case r.phase == PhaseWaitingPrefill || r.phase == PhaseResolvingDP:
		return 0, false, fmt.Errorf("declare destination of room %d: %w: the room is still bootstrapping (phase %s, KVPoll.Bootstrapping): declare its destination once it waits for input (phase queued, KVPoll.WaitingForInput)", r.id, ErrWrongState, r.phase)
	case r.phase != PhaseQueued:
		if r.handoff != nil && r.metaSlot == metaSlot && r.decodePrefix == prefix && slices.Equal(r.pages, pages) {
			return r.fillLen, true, nil
		}
		return 0, false, fmt.Errorf("declare destination of room %d: %w: the room already has its destination (phase %s); a declaration is made once", r.id, ErrWrongState, r.phase)
	}
	origin := int(r.promptLen)
	if r.rebootstrapReq {
		origin += int(r.outputLen)
	}
	fill, err = DeclaredFill(r.cfg.Layout.PageSize, origin, prefix, len(pages), "")
	return fill, false, err
}

// DeclaredFill checks the size of a declared destination: a decode prefix
// that is page-aligned and shorter than the origin tokens prefill holds,
// and exactly the pages of the tokens beyond it. It returns those tokens
// (the destination's fill length); errors name the field under at ("" or
// "rooms[3].").
func DeclaredFill(pageSize, origin, prefix, pages int, at string) (int, error) {
	ps := pageSize
	if prefix < 0 || prefix%ps != 0 || prefix >= origin {
		return 0, invalid(at+"decode_prefix_len", "%d must be a multiple of the page size %d, at least 0 and below the %d tokens prefill holds", prefix, ps, origin)
	}
	fill := origin - prefix
	if want := (fill + ps - 1) / ps; pages != want {
		return 0, invalid(at+"page_indices", "has %d pages; the %d tokens beyond the decode prefix (%d of %d) at page size %d take %d", pages, fill, prefix, origin, ps, want)
	}
	return fill, nil
}
