package room

import (
	"slices"
	"strconv"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
	"github.com/decodeplane/decodeplane/transfer"
)

// Room is one request's KV hand-off: its identity, phase, attempt, rank
// plan, claims, page coverage, success gates, deadlines, drain and
// timeline. It holds no lock, clock, channel, ledger or registry: its
// caller (the shard that owns it) serializes every call, gives it the time
// and every other input in the event it applies, and carries out the
// effects Apply returns. A room that was never admitted is only what it
// needs while it waits (identity, request, DP rank, phase, deadlines,
// timeline); what admission and the transfer add lives in its handoff,
// made at the first admission, so that a queued room stays small.
type Room struct {
	id   uint64
	addr string
	rid  string
	// The request's lengths and priority, and the room's DP ranks (hintDP
	// -1: no hint; prefillDP -1: unresolved), in 4 bytes each.
	promptLen, outputLen, maxNewTokens, priority int32
	decodeDP, hintDP, prefillDP                  int32
	// timeoutMS is the request's time budget in milliseconds (0: none),
	// from openedAt: its deadline bounds the first attempt's hand-off.
	timeoutMS uint32

	openedAt  stamp
	updatedAt stamp
	// transitions is the timeline after OpenRoom's step (which is derived
	// from the room: opened).
	transitions []transition

	// timeouts.bootstrap's deadline, zero when not armed (the others are
	// the handoff's, and the DP-rank bound the extra's).
	bootstrapAt stamp

	cfg  *Params
	plan *ranks.Plan
	topo topology // of the prefill instance, once known

	attached *Attachments // the ranks whose claim stream is attached
	extra    *extra       // what few rooms have

	*handoff

	// Small fields together (no padding between them).
	attempt        uint32
	metaSlot       int32
	phase          Phase
	dpRule         ranks.DPRule
	owner          Owner
	inLedger       bool // the allocator holds the room's record
	releasePending bool
	staging        bool
	closed         bool // Close: nothing is waited for any more
	rebootstrapReq bool // the request is a rebootstrap's
}

// Owner is who chooses a room's destination pages (kv_pool.owner): the
// daemon's allocator, or the decode engine that declares them.
type Owner = kvlayout.Owner

// Page owners.
const (
	OwnerDaemon = kvlayout.OwnerDaemon
	OwnerEngine = kvlayout.OwnerEngine
)

// Params are the settings every room of a manager reads; they never change
// once the manager runs, so rooms share one value.
type Params struct {
	Layout kvlayout.Layout
	// Owner is kv_pool.owner: who chooses every room's pages.
	Owner Owner
	// Bootstrap is timeouts.bootstrap, Waiting timeouts.waiting,
	// DPRankResolution timeouts.dp_rank_resolution, Retracted and Held
	// timeouts.retracted and timeouts.held, ClaimTimeout
	// admission.claim_timeout (0: none), DeferredTimeout
	// release.deferred_timeout (0: no deferral).
	Bootstrap        time.Duration
	Waiting          time.Duration
	DPRankResolution time.Duration
	Retracted        time.Duration
	Held             time.Duration
	ClaimTimeout     time.Duration
	DeferredTimeout  time.Duration
}

// DefaultParkedTimeout bounds a retracted or held room when its setting is
// 0 (timeouts.retracted, timeouts.held).
const DefaultParkedTimeout = 300 * time.Second

// Request is what the room knows of its request (the fields of SGLang's
// Req that messages and snapshots name).
type Request struct {
	RID          string
	PromptLen    int
	OutputLen    int
	MaxNewTokens int
	Priority     int
	Rebootstrap  bool
}

// topology is what the room reads of its prefill instance's layout.
type topology struct {
	dp, attnTP, pp int32
	follow         bool
}

func (r *Room) setRequest(q Request) {
	r.rid, r.rebootstrapReq = q.RID, q.Rebootstrap
	r.promptLen, r.outputLen, r.maxNewTokens, r.priority = int32(q.PromptLen), int32(q.OutputLen), int32(q.MaxNewTokens), int32(q.Priority)
}

// handoff is what a room holds from its first admission on: its
// destination, its transfer's progress and what its release waits for.
type handoff struct {
	admittedAt stamp
	claimedAt  stamp
	waitingAt  stamp
	// claimBy is admission.claim_timeout's deadline while the destination
	// is offered and not every rank has it (zero: none).
	claimBy stamp
	// stagingBy is a staged room's scatter completion deadline once every
	// rank reported (zero: none); stagingSaved is the waiting deadline it
	// replaced, restored when the scatters finish.
	stagingBy    stamp
	stagingSaved stamp
	// quarantine: writes into the pages may continue until then (an engine
	// failure could not rule them out); the release waits for it.
	quarantine stamp
	// parkedAt bounds a retracted or held room.
	parkedAt stamp

	// The destination (copies: the room hands them out): its pages, the
	// tokens prefill writes into them, its state slots, and the tokens of
	// the decode prefix already in the engine's cache before them.
	pages        []int32
	fillLen      int
	state        []kvlayout.StateIndices
	decodePrefix int
	// layouts are the decode engine's buffer layouts of the room's shard
	// when it was admitted (index = decode TP rank; nil: decodeplane's own
	// buffers). A layout cannot change while a hand-off holds pages.
	layouts []*kvlayout.BufferLayout

	ranks *rankSet // required ranks seen this attempt, made on first use
	// claimedN, doneN count required ranks claimed / done this attempt.
	claimedN, doneN int

	// inflight counts the transfers and scatters running into the pages;
	// the resources go back only when none remain.
	inflight int
	// drain: the acknowledgements a failed room's prefill ranks owe.
	drain *drainState

	marker     uint64
	bytes      uint64
	chunksDone int
}

// extra is what most rooms never have, made on first use.
type extra struct {
	failure *Failure // why the room failed
	dpAt    stamp    // the DP-rank resolution bound while resolving
	idemKey string
	gates   map[string]bool // conditions success waits for (the staging gate)
	texts   []string        // the timeline's notes of text of their own
	// inherited: a hand-off in flight when the previous daemon stopped
	// (Adopt.InFlight): its prefill ranks' acknowledgements name the
	// attempt they knew, whatever it was.
	inherited bool
}

// rankProgress is one required prefill rank's transfer of one attempt.
type rankProgress struct {
	claimed bool
	chunks  map[int]*chunkState
	cov     coverage
	bytes   uint64
	last    int // index of the last chunk sent (landed or in flight), -1 until seen
	// lastLanded: the last chunk landed.
	lastLanded bool
	// engine: the daemon's engine moved this rank's chunks (Transfer).
	engine bool
	// stagingOpen: staging allocations this rank has not reported ready
	// (it may be writing into those regions).
	stagingOpen int32
	// done: every page of the destination landed from this rank and its
	// last chunk (with the metadata) landed; counted once in doneN.
	done bool
}

// chunkState is one chunk of a rank: its identity beyond its index (a
// retry must match it) and its outcome.
type chunkState struct {
	done   bool
	busy   bool // an attempt is in flight
	result transfer.ChunkResult
	err    error
	off, n int
	last   bool
}

// stamp is a time as Unix nanoseconds, 0 for none: a room keeps its times
// in 8 bytes each instead of time.Time's 24.
type stamp int64

func stampOf(t time.Time) stamp {
	if t.IsZero() {
		return 0
	}
	return stamp(t.UnixNano())
}

// time is the stamp as a time.Time (the zero time for none).
func (s stamp) time() time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(s))
}

// ID is the room's id (SGLang's bootstrap room).
func (r *Room) ID() uint64 { return r.id }

// Addr is the room's prefill bootstrap address.
func (r *Room) Addr() string { return r.addr }

// DecodeDP is the room's decode DP shard.
func (r *Room) DecodeDP() int { return int(r.decodeDP) }

// PrefillDP is the room's prefill DP rank, -1 until resolved.
func (r *Room) PrefillDP() int { return int(r.prefillDP) }

// HintDP is the router's prefill DP rank hint, -1 if none.
func (r *Room) HintDP() int { return int(r.hintDP) }

// Phase is where the room is.
func (r *Room) Phase() Phase { return r.phase }

// Attempt is the room's attempt (1, then one more per rebootstrap).
func (r *Room) Attempt() uint32 { return r.attempt }

// Request is the room's request.
func (r *Room) Request() Request {
	return Request{RID: r.rid, PromptLen: int(r.promptLen), OutputLen: int(r.outputLen), MaxNewTokens: int(r.maxNewTokens),
		Priority: int(r.priority), Rebootstrap: r.rebootstrapReq}
}

// Failure is why the room failed (nil unless it did).
func (r *Room) Failure() *Failure {
	if r.extra == nil {
		return nil
	}
	return r.extra.failure
}

// dpBound is the DP-rank resolution bound (zero: none).
func (r *Room) dpBound() stamp {
	if r.extra == nil {
		return 0
	}
	return r.extra.dpAt
}

// Owner is who chose the room's pages.
func (r *Room) Owner() Owner { return r.owner }

// Staging reports whether the room's KV goes through staging rings.
func (r *Room) Staging() bool { return r.staging }

// Plan is the room's rank plan (nil until its prefill is known).
func (r *Room) Plan() *ranks.Plan { return r.plan }

// Pages is the room's destination (nil before admission); do not modify.
func (r *Room) Pages() []int32 {
	if r.handoff == nil {
		return nil
	}
	return r.pages
}

// MetadataSlot is the room's metadata slot, -1 when it holds none.
func (r *Room) MetadataSlot() int32 { return r.metaSlot }

// IdempotencyKey is OpenRoom's idempotency key ("" if none).
func (r *Room) IdempotencyKey() string {
	if r.extra == nil {
		return ""
	}
	return r.extra.idemKey
}

// HandingOff reports whether the room's KV is still on its way: it has
// not ended and has not succeeded.
func (r *Room) HandingOff() bool {
	return !r.phase.Terminal() && r.phase.Poll() != PollSuccess
}

// ReleasePending reports whether the room ended and its resources have
// not gone back yet.
func (r *Room) ReleasePending() bool { return r.releasePending }

// InLedger reports whether the allocator still holds the room's record.
func (r *Room) InLedger() bool { return r.inLedger }

// Inflight counts the transfers and scatters running into the room's pages.
func (r *Room) Inflight() int {
	if r.handoff == nil {
		return 0
	}
	return r.inflight
}

// RanksSeen counts the required ranks the room has heard from on this
// attempt (a rank's progress is made when it first claims or sends).
func (r *Room) RanksSeen() int {
	if r.handoff == nil {
		return 0
	}
	return r.ranks.len()
}

// UpdatedAt is the time of the room's last transition.
func (r *Room) UpdatedAt() time.Time { return r.updatedAt.time() }

// OpenedAt is when the room was opened.
func (r *Room) OpenedAt() time.Time { return r.openedAt.time() }

// Opened is the room's open time as Unix nanoseconds (for ordering).
func (r *Room) Opened() int64 { return int64(r.openedAt) }

// Attached reports whether rank k's claim stream is attached to the room.
func (r *Room) Attached(k ranks.RankKey) bool { return r.attached.has(k) }

// Claimed reports whether rank k claimed the current attempt's destination.
func (r *Room) Claimed(k ranks.RankKey) bool {
	rp := r.ranksOf(k)
	return rp != nil && rp.claimed
}

// RequestName is how failure messages name the request: its rid, else the
// bootstrap room.
func (r *Room) RequestName() string {
	if r.rid != "" {
		return r.rid
	}
	return strconv.FormatUint(r.id, 10)
}

// ranksOf is rank k's progress on this attempt, nil if none (or never
// admitted).
func (r *Room) ranksOf(k ranks.RankKey) *rankProgress {
	if r.handoff == nil {
		return nil
	}
	return r.ranks.get(k)
}

// progress returns a required rank's progress in this attempt, created on
// first use (a claim or a chunk from that rank); nil for a rank the room
// does not need. The table grows only with the calls received, never with
// the prefill's parallel sizes.
func (r *Room) progress(k ranks.RankKey) *rankProgress {
	if r.handoff == nil { // never admitted: no rank has anything to report yet
		return nil
	}
	if rp := r.ranks.get(k); rp != nil {
		return rp
	}
	if r.plan == nil || !r.plan.IsRequired(k) {
		return nil
	}
	if r.ranks == nil {
		r.ranks = &rankSet{}
	}
	return r.ranks.add(k)
}

// x is the room's extra, made on first use (to write to it).
func (r *Room) x() *extra {
	if r.extra == nil {
		r.extra = &extra{}
	}
	return r.extra
}

// gated reports whether a condition holds the room's success back.
func (r *Room) gated() bool { return r.extra != nil && len(r.extra.gates) > 0 }

// gate reports whether the named condition holds the room's success back.
func (r *Room) gate(name string) bool { return r.extra != nil && r.extra.gates[name] }

func (r *Room) hold(name string) {
	x := r.x()
	if x.gates == nil {
		x.gates = map[string]bool{}
	}
	x.gates[name] = true
}

func (r *Room) unhold(name string) {
	if r.extra != nil {
		delete(r.extra.gates, name)
	}
}

// Gated reports whether a condition holds the room's success back.
func (r *Room) Gated() bool { return r.gated() }

// HasGate reports whether the named condition holds the room's success back.
func (r *Room) HasGate(name string) bool { return r.gate(name) }

// StagingGate is the success gate of a staged room: held from admission
// until every staged region is scattered.
const StagingGate = "staging"

// admittedOnce gives the room its handoff state at its first admission.
func (r *Room) admittedOnce() {
	if r.handoff == nil {
		r.handoff = &handoff{}
	}
}

// Snapshot renders the room (withTransitions: its timeline; withPages: its
// destination pages).
func (r *Room) Snapshot(withTransitions, withPages bool) Snapshot {
	s := Snapshot{
		Room: r.id, RID: r.rid, Addr: r.addr, DecodeDP: int(r.decodeDP),
		PrefillDP: int(r.prefillDP), DPRule: r.dpRule, Poll: r.phase.Poll(), Phase: r.phase,
		PromptLen: int(r.promptLen), MaxNewTokens: int(r.maxNewTokens), Priority: int(r.priority),
		MetadataSlot: r.metaSlot, OpenedAt: r.openedAt.time(), UpdatedAt: r.updatedAt.time(),
		Attempt: r.attempt, Staging: r.staging,
	}
	if r.timeoutMS > 0 {
		s.Timeout = time.Duration(r.timeoutMS) * time.Millisecond
		s.Deadline = r.openedAt.time().Add(s.Timeout)
	}
	if h := r.handoff; h != nil {
		s.NumPages, s.BytesTransferred, s.ChunksDone = len(h.pages), h.bytes, h.chunksDone
	}
	if r.Failure() != nil {
		f := *r.Failure()
		s.Failure = &f
	}
	if withTransitions {
		s.Transitions = r.timeline()
	}
	if withPages && r.handoff != nil {
		s.Pages = slices.Clone(r.pages)
	}
	return s
}

// Coverage renders each required rank's progress on the current attempt.
func (r *Room) Coverage() []RankCoverage {
	if r.plan == nil || len(r.plan.Required()) == 0 || r.handoff == nil {
		return nil
	}
	out := make([]RankCoverage, 0, len(r.plan.Required()))
	for _, k := range r.plan.Required() {
		c := RankCoverage{CP: k.CP, TP: k.TP, PP: k.PP, PagesRequired: len(r.pages)}
		if rp := r.ranks.get(k); rp != nil {
			c.Claimed, c.PagesLanded, c.LastLanded, c.Bytes = rp.claimed, rp.cov.landed, rp.lastLanded, rp.bytes
		}
		out = append(out, c)
	}
	return out
}

// Destination is what prefill rank k needs to write the room's KV.
func (r *Room) Destination(k ranks.RankKey) *Destination {
	d := &Destination{
		Room: r.id, DecodeDP: int(r.decodeDP), PageSize: r.cfg.Layout.PageSize, MetadataSlot: r.metaSlot,
		Staging: r.staging, Attempt: r.attempt, Dummy: true,
	}
	if h := r.handoff; h != nil {
		d.Pages, d.FillLen, d.State, d.DecodePrefixLen = h.pages, h.fillLen, h.state, h.decodePrefix
	}
	if rp := r.plan.Rank(k); rp != nil {
		d.Targets = rp.Targets()
		d.Dummy = rp.Dummy()
		d.RequiredDstInfoNum = rp.RequiredDstInfoNum()
		if h := r.handoff; h != nil && len(h.layouts) > 0 {
			d.Layouts = h.layouts
			d.PageBytes, d.AuxBytes, d.StateBytes = transfer.LayoutWeights(h.layouts, r.cfg.Layout, d.Targets, int(r.topo.pp), k.PP, h.state)
		} else {
			d.TokenBytes, d.StateBytes = transfer.RankWeights(r.cfg.Layout, rp.Targets(), int(r.topo.pp), k.PP)
		}
	}
	if d.Dummy {
		// Dummy targets get an empty destination, as SGLang sends empty
		// frames to MLA's extra ranks.
		d.Pages, d.State, d.MetadataSlot = nil, nil, -1
	}
	return d
}

// hasDestination reports whether the room's current attempt has a
// destination to offer (admitted, claimed or transferring).
func (r *Room) hasDestination() bool {
	return r.handoff != nil && r.pages != nil && (r.phase == PhaseAdmitted || r.phase == PhaseClaimed || r.phase == PhaseTransferring)
}

// ChunkOp is the engine's operation for a chunk of rank req.Rank (the room
// validated it: ChunkBegin).
func (r *Room) ChunkOp(req ChunkRequest) transfer.ChunkOp {
	ps := r.cfg.Layout.PageSize
	tokens := min((req.PageOffset+req.NumPages)*ps, r.fillLen) - req.PageOffset*ps
	op := transfer.ChunkOp{
		Room: r.id, RID: r.rid, Attempt: r.attempt, Rank: transfer.Rank(req.Rank), ChunkIndex: req.Index,
		DestPages: r.pages[req.PageOffset : req.PageOffset+req.NumPages], Tokens: max(tokens, 0),
		SrcBuffer: req.SrcBuffer, SrcPages: req.SrcPages, Layout: r.cfg.Layout, DecodeDP: int(r.decodeDP),
		Last: req.Last, MetadataSlot: r.metaSlot, Marker: req.Marker, OutputIDs: req.OutputIDs,
		PrefillTP: int(r.topo.attnTP), PrefillPP: int(r.topo.pp), SrcAuxRow: req.SrcAuxRow, SrcState: req.SrcState,
	}
	if r.handoff != nil {
		op.Engine = r.handoff.layouts
	}
	if rpl := r.plan.Rank(req.Rank.Key()); rpl != nil {
		op.Targets = rpl.Targets()
	}
	if req.Last {
		op.State = r.state
	}
	return op
}

// TargetsOf are the decode targets rank k writes in this room (nil when
// the plan is not known or k sends nothing).
func (r *Room) TargetsOf(k ranks.RankKey) []transfer.Target {
	if r.plan == nil {
		return nil
	}
	if rpl := r.plan.Rank(k); rpl != nil {
		return rpl.Targets()
	}
	return nil
}
