package room

import (
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/ranks"
	"github.com/decodeplane/decodeplane/transfer"
)

// Event is one input to a room: everything the room needs to decide what
// happens to it (the time included). The concrete types are listed in
// Apply.
type Event interface{ event() }

// Apply applies one event to the room and returns what its caller must do
// now that the room changed: the effects, applied once, in the order
// Effects documents. An event the room refuses changes nothing and returns
// the reason in Effects.Err. An event moves the room through at most one
// phase; one whose consequence is another step asks for it in
// Effects.Then, which the caller builds (with what it must read for it)
// and applies next, under the same lock.
func (r *Room) Apply(ev Event) Effects {
	var e Effects
	switch ev := ev.(type) {
	case Open:
		r.open(ev, &e)
	case Adopt:
		r.adopt(ev, &e)
	case PrefillKnown:
		r.prefillKnown(ev, &e)
	case Bound:
		r.bound(ev, &e)
	case Admitted:
		r.admitted(ev, &e)
	case Attach:
		r.attach(ev, &e)
	case Detach:
		r.attached.remove(ev.Rank)
	case Delivered:
		r.delivered(ev, &e)
	case ChunkBegin:
		r.chunkBegin(ev, &e)
	case ChunkEnd:
		r.chunkEnd(ev, &e)
	case ChunkDropped:
		r.chunkDropped(ev)
	case StagingWrite:
		r.stagingWrite(ev, &e)
	case StagingAllocated:
		if rp := r.progress(ev.Rank); rp != nil {
			rp.stagingOpen++
		}
	case ScatterBegin:
		r.inflight++
		r.wroteBeforeClaim(&e)
	case ScatterEnd:
		r.scatterEnd(ev, &e)
	case Gate:
		r.gateEvent(ev, &e)
	case CheckSuccess:
		r.checkSuccess(ev, &e)
	case Transferring:
		r.move(ev.Now, PhaseTransferring, "", textNote("chunks landed before every rank claimed"), &e)
		e.Then = ThenCheckSuccess
	case Fail:
		r.fail(ev, &e)
	case Release:
		r.release(ev, &e)
	case Retract:
		r.retract(ev, &e)
	case Grow:
		if r.handoff != nil {
			r.pages = append(r.pages, ev.Pages...)
		}
	case Rebootstrap:
		r.rebootstrap(ev, &e)
	case Ack:
		r.ack(ev, &e)
	case Deadline:
		r.deadline(ev, &e)
	case Close:
		r.close(ev, &e)
	}
	return e
}

// Effects is what one event applied to a room asks of its caller, applied
// in this order: the registration wait left (Unwait), engine calls
// cancelled (Cancel), claim streams refused or ended (Refuse, EndClaims),
// observations (Admission, Resolved, Finished, Chunk), the failure
// logged, the phase move (Move: observers, counts, spans, watchers, the
// debug log), destinations offered (Offer), allocator operations (Ledger),
// staging (StagingOpen), drain notes, the room's end (End: retained) and
// its resources back (Release). The room's deadline is re-read after every
// event (NextDeadline). Effects are a value with no slice of their own on
// the common path, so that applying an event allocates nothing the room
// did not.
type Effects struct {
	// Err: the event was refused and nothing changed; the caller answers
	// with it.
	Err error

	// Move: the room changed phase.
	Move Move

	// Begin is ChunkBegin's answer; AckResult Ack's.
	Begin     ChunkStart
	AckResult AckResult

	// Then asks the caller for the next step of this event's consequence.
	Then Then

	// Unwait: the room no longer waits for its prefill's registration.
	Unwait bool
	// Cancel: end the engine calls running into the room (it failed).
	Cancel bool

	// Reply, when set, ends the claim stream the event was about (Attach)
	// with this event.
	Reply *DestinationEvent
	// Refuse ends the listed claim streams (each with its event): claims
	// of ranks the room's resolved DP rank rules out.
	Refuse []Refused
	// EndClaims ends every claim stream of the room with ClaimEnd; ranks in
	// Owing get it with AckRequired.
	EndClaims bool
	ClaimEnd  DestinationEvent
	Owing     []ranks.RankID
	// Offer queues the destination on claim streams: every attached rank
	// (OfferAll) or OfferTo (OfferOne).
	Offer   Offer
	OfferTo ranks.RankKey

	// Failure: the room failed with it (logged as a warning naming the
	// phase it failed in, Move.From).
	Failure *Failure
	// Finished: the hand-off's outcome (an observer's RoomFinished), the
	// time since OpenRoom and, on success, since admission and the KV bytes
	// the room's chunks landed (TransferredBytes; 0 when none reported
	// bytes).
	Finished         bool
	Outcome          Phase
	Code             FailureCode
	SinceOpen        time.Duration
	Transferred      time.Duration
	TransferredBytes uint64
	// Chunk: a chunk ended (landed when ChunkOK).
	Chunk    bool
	ChunkOK  bool
	ChunkRes transfer.ChunkResult
	// Admission: the destination is ready, AdmittedAfter after OpenRoom.
	Admission     bool
	AdmittedAfter time.Duration
	// Resolved: the prefill DP rank was resolved to DP by Rule.
	Resolved bool
	Rule     ranks.DPRule
	DP       int

	// Ledger are the allocator's operations on the room's record.
	Ledger LedgerOp
	// AdmitNow: run the shard's admission pass before the call returns (the
	// room became admissible); resources that went back (Release) make it
	// due instead.
	AdmitNow bool
	// StagingOpen: register the staged room's regions with the staging
	// handler (its admission; a previous attempt's are released first).
	StagingOpen bool

	// DrainStarted: the room's resources stay held until its owing ranks
	// acknowledge (Drain's ranks and bound); DrainExpired: the bound passed
	// with ranks still owing; Acked: one rank acknowledged.
	DrainStarted bool
	DrainExpired bool
	Acked        bool
	Drain        DrainNote
	// QuarantineUntil: an engine failure could not rule out writes into the
	// pages until then (logged).
	QuarantineUntil time.Time

	// End: the room ended; it is retained for its retention.
	End bool
	// Release: the room's resources go back now, exactly once: its
	// allocator record (when Ledger has LedgerRelease), its staging
	// regions, and the shard's admission is due.
	Release bool
}

// Move is one phase change, recorded in the room's timeline as Step.
type Move struct {
	Moved    bool
	From, To Phase
	Step     Step
	SGLang   string
	note     note
}

// Note renders the move's note (addr is the room's prefill address).
func (m Move) Note(addr string) string { return m.note.render(addr) }

// Then is the next step of an event's consequence.
type Then uint8

const (
	// ThenNone: nothing follows.
	ThenNone Then = iota
	// ThenCheckSuccess: apply CheckSuccess (the room may have succeeded).
	ThenCheckSuccess
	// ThenTransferring: apply Transferring (every rank claimed after
	// chunks landed).
	ThenTransferring
)

// Offer says which claim streams get the room's destination.
type Offer uint8

const (
	OfferNone Offer = iota
	OfferAll
	OfferOne
)

// Refused is one claim stream to end, with its event.
type Refused struct {
	Rank  ranks.RankKey
	Event DestinationEvent
}

// LedgerOp is a set of allocator operations on the room's record, applied
// in this order.
type LedgerOp uint8

const (
	// LedgerReady: the room's handshake is done; it may be admitted.
	LedgerReady LedgerOp = 1 << iota
	// LedgerClaim: every required rank has the destination (or one wrote
	// into it).
	LedgerClaim
	// LedgerRunning: the transfer succeeded; the room runs.
	LedgerRunning
	// LedgerDrain: the room ended but keeps its pages until its ranks
	// acknowledge.
	LedgerDrain
	// LedgerRelease: give the record and everything it holds back.
	LedgerRelease
)

// DrainNote names a drain's ranks and bound, for logs.
type DrainNote struct {
	Attempt uint32
	Ranks   []ranks.RankID
	Until   time.Time
	Acks    int
}

// move records a phase change.
func (r *Room) move(now time.Time, to Phase, sglang string, n note, e *Effects) {
	from := r.phase
	r.phase = to
	r.updatedAt = stampOf(now)
	var texts *[]string
	if needsText(sglang, n) {
		texts = &r.x().texts
	}
	t := newTransition(now, to, sglang, n, r.attempt, texts)
	if sglang != "T1" { // OpenRoom's transition is not kept: the timeline derives it (opened)
		r.keep(t)
	}
	e.Move = Move{Moved: true, From: from, To: to, Step: Step{t}, SGLang: sglang, note: n}
}

// A room keeps its timeline after OpenRoom's transition, which is derived
// from the room (opened): a queued room keeps one transition (queued, 32
// bytes); the second grows the timeline straight to roomTransitions, which
// holds a whole hand-off (queued, admitted, claimed, transferring,
// succeeded, released), then append doubles it.
const roomTransitions = 8

// keep appends t to the room's timeline.
func (r *Room) keep(t transition) {
	switch {
	case r.transitions == nil:
		r.transitions = make([]transition, 0, 1)
	case len(r.transitions) == cap(r.transitions) && cap(r.transitions) < roomTransitions:
		grown := make([]transition, len(r.transitions), roomTransitions)
		copy(grown, r.transitions)
		r.transitions = grown
	}
	r.transitions = append(r.transitions, t)
}
