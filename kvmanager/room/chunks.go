package room

import (
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
	"github.com/decodeplane/decodeplane/transfer"
)

// The events of a room's transfer: chunks (moved by the daemon's engine,
// reported by the prefill, or staged through a ring), scatters of staged
// regions, and the success proof.

// ChunkRequest is one chunk for the daemon's transfer engine (Transfer), a
// chunk the prefill moved itself (ReportTransfer), or a staged chunk
// (ChunkReady).
type ChunkRequest struct {
	Room       uint64
	Rank       ranks.RankID
	Index      int
	PageOffset int
	NumPages   int
	Last       bool
	// Transfer only.
	SrcBuffer string
	SrcPages  []int32
	// SrcAuxRow (source.aux_row; -1: not given) and SrcState
	// (source.state) locate the last chunk's aux rows and state items on
	// the prefill side, with the decode engine's buffer layout.
	SrcAuxRow int32
	SrcState  []kvlayout.StateIndices
	Marker    uint64
	OutputIDs []int32
	// Attempt is the destination's attempt; 0 is not checked.
	Attempt uint32
	// ReportTransfer only.
	Failed bool
	Reason string
	Bytes  int64
}

// Via says how a chunk's bytes move.
type Via uint8

const (
	// ViaEngine: the daemon's transfer engine moves it (Transfer).
	ViaEngine Via = iota
	// ViaReport: the prefill moved it and reports it (ReportTransfer): its
	// byte count is checked against the layout.
	ViaReport
	// ViaStaging: the prefill wrote it into staging regions (ChunkReady).
	ViaStaging
)

// ChunkBegin validates a chunk and registers it in flight (the
// idempotency key is (room, rank, index)). Nothing changes when it is
// refused (Effects.Err). Effects.Begin says whether it is new or a retry.
type ChunkBegin struct {
	Now time.Time
	Req ChunkRequest
	Via Via
	// Check is the engine's check of a chunk of a room with the decode
	// engine's buffer layouts (transfer.OpChecker), called on the chunk's
	// operation once the room validated it; nil: none.
	Check func(transfer.ChunkOp) error
}

// ChunkStart is ChunkBegin's answer.
type ChunkStart struct {
	// Fresh: the chunk is new and registered in flight: run it, then apply
	// ChunkEnd.
	Fresh bool
	// Otherwise it was sent before: Busy while its first attempt is in
	// flight (wait for it), else Done with Result (landed) or Err.
	Busy   bool
	Done   bool
	Result transfer.ChunkResult
	Err    error
}

// ChunkEnd is the outcome of a chunk ChunkBegin registered: landed (Err
// nil, Result), failed (the room fails), or Retryable (nothing landed, it
// may be sent again: the engine was unavailable or the caller went away).
// WritesUntil: the engine could not rule out writes into the pages until
// then (a quarantine on the release).
type ChunkEnd struct {
	Now         time.Time
	Req         ChunkRequest
	Via         Via
	Result      transfer.ChunkResult
	Err         error
	Retryable   bool
	WritesUntil time.Time
	SelfWriter  bool
}

// ChunkDropped forgets a registered chunk that was never started (the
// room's claim failed it before its engine call).
type ChunkDropped struct {
	Rank  ranks.RankKey
	Index int
}

// StagingWrite: rank is about to write the room through staging
// (AllocateStaging, ChunkReady): it must be a source that holds the
// destination; its claim is recorded. Staged: the staging handler holds
// the room's current attempt.
type StagingWrite struct {
	Now    time.Time
	Rank   ranks.RankID
	What   string
	Staged bool
}

// StagingAllocated: rank allocated staging regions of the room it has not
// reported ready yet (it may be writing into them).
type StagingAllocated struct{ Rank ranks.RankKey }

// ScatterBegin: a staged region's scatter into the room's pages starts.
type ScatterBegin struct{}

// ScatterEnd: a scatter returned: landed (writing Marker), unavailable
// (nothing landed, a retried ChunkReady resubmits it), or failed.
type ScatterEnd struct {
	Now         time.Time
	Chunk       int
	DecodeTP    int
	Err         error
	Unavailable bool
	Marker      uint64
	WritesUntil time.Time
	SelfWriter  bool
}

// CheckSuccess runs the success proof (SGLang T12/T17): every page landed
// from every required rank, no gate holds it, the metadata slot holds the
// room's marker (T19 when it holds another room's). ScattersPending: staged
// regions of this attempt are still to be scattered.
type CheckSuccess struct {
	Now             time.Time
	ScattersPending bool
	SelfWriter      bool
}

// CheckChunk is the engine's own check of a chunk's source, made before the
// room sees it (transfer.ChunkChecker).

// sourceRank checks the required prefill rank of the room a chunk (or a
// failure report) comes from.
func (r *Room) sourceRank(req ChunkRequest) (*rankProgress, error) {
	if req.Rank.Addr != r.addr {
		return nil, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", req.Rank.Addr, r.id, r.addr)
	}
	if r.phase == PhaseFailed {
		return nil, fmt.Errorf("chunk %d of room %d: %w: the room failed: %s", req.Index, r.id, ErrWrongState, r.Failure().Message)
	}
	if req.Attempt != 0 && req.Attempt != r.attempt {
		return nil, fmt.Errorf("chunk %d of room %d: %w: it belongs to attempt %d, but the room was rebootstrapped (attempt %d)", req.Index, r.id, ErrWrongState, req.Attempt, r.attempt)
	}
	if r.plan == nil || r.prefillDP < 0 || r.handoff == nil {
		return nil, fmt.Errorf("chunk %d of room %d: %w: the room has no destination yet (phase %s)", req.Index, r.id, ErrWrongState, r.phase)
	}
	if req.Rank.DP != int(r.prefillDP) {
		return nil, invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", req.Rank.DP, r.id, r.prefillDP, r.dpRule)
	}
	rp := r.progress(req.Rank.Key())
	if rp == nil {
		return nil, invalid("rank", "%s sends no KV for room %d: it is a dummy target or not addressed by any decode rank", req.Rank, r.id)
	}
	return rp, nil
}

// CheckSource checks that a failure report (ReportTransfer with failed)
// comes from a source of the room; it changes nothing.
func (r *Room) CheckSource(req ChunkRequest) error {
	_, err := r.sourceRank(req)
	return err
}

// ChunkSent reports whether rank already sent chunk index (a retry of a
// staged chunk is answered from the staging regions).
func (r *Room) ChunkSent(rank ranks.RankID, index int) bool {
	rp := r.ranksOf(rank.Key())
	return rp != nil && rank.Addr == r.addr && rank.DP == int(r.prefillDP) && rp.chunks[index] != nil
}

// SameChunk checks that req is a retry of the chunk its rank sent with its
// index (ChunkSent).
func (r *Room) SameChunk(req ChunkRequest) error {
	if rp := r.ranksOf(req.Rank.Key()); rp != nil {
		if cs := rp.chunks[req.Index]; cs != nil {
			return cs.sameChunk(req)
		}
	}
	return nil
}

func (r *Room) chunkBegin(c ChunkBegin, e *Effects) {
	req := c.Req
	rp, err := r.sourceRank(req)
	if err != nil {
		e.Err = err
		return
	}
	if cs := rp.chunks[req.Index]; cs != nil {
		if err := cs.sameChunk(req); err != nil {
			e.Err = err
			return
		}
		e.Begin = ChunkStart{Busy: cs.busy, Done: cs.done, Result: cs.result, Err: cs.err}
		return
	}
	switch r.phase {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		e.Err = fmt.Errorf("chunk %d of room %d: %w: phase %s", req.Index, r.id, ErrWrongState, r.phase)
		return
	}
	// A chunk from a rank whose claim stream was given the destination
	// proves it holds it: the stream's Send and this call race, and the
	// claim may not be recorded yet.
	if !rp.claimed && (!r.attached.has(req.Rank.Key()) || r.phase != PhaseAdmitted) {
		e.Err = fmt.Errorf("chunk %d of room %d from %s: %w: this rank has not claimed the destination (call AwaitDestination first)", req.Index, r.id, req.Rank, ErrWrongState)
		return
	}
	if e.Err = r.checkChunk(req, rp, c.Via == ViaReport, c.Check); e.Err != nil {
		return
	}
	if !rp.claimed {
		r.claimRank(c.Now, rp, e)
	}
	rp.cov.mark(req.PageOffset, req.NumPages, true)
	if req.Last {
		rp.last = req.Index
	}
	cs := &chunkState{busy: true, off: req.PageOffset, n: req.NumPages, last: req.Last}
	if rp.chunks == nil {
		rp.chunks = make(map[int]*chunkState, 1)
	}
	rp.chunks[req.Index] = cs
	switch c.Via {
	case ViaEngine:
		rp.engine = true // the daemon's engine writes this rank's chunks
		r.inflight++
		r.wroteBeforeClaim(e)
	case ViaStaging:
		if rp.stagingOpen > 0 {
			rp.stagingOpen-- // this chunk's writes into its regions are done
		}
	}
	e.Begin = ChunkStart{Fresh: true}
}

// wroteBeforeClaim: a rank writes into the destination before every rank
// claimed it: the claim timeout must not end the room (and hand out the
// pages) under the write; timeouts.bootstrap still bounds it.
func (r *Room) wroteBeforeClaim(e *Effects) {
	if r.phase == PhaseAdmitted {
		r.claimBy = 0
		e.Ledger |= LedgerClaim
	}
}

// checkChunk validates a new chunk of rank rp; it changes nothing.
func (r *Room) checkChunk(req ChunkRequest, rp *rankProgress, checkBytes bool, check func(transfer.ChunkOp) error) error {
	if req.NumPages < 0 || req.PageOffset < 0 || req.PageOffset+req.NumPages > len(r.pages) {
		return invalid("page_offset", "pages [%d, %d) are outside the destination's %d pages", req.PageOffset, req.PageOffset+req.NumPages, len(r.pages))
	}
	if req.NumPages == 0 && !req.Last {
		return invalid("num_pages", "must be > 0 (only the last chunk may carry no pages)")
	}
	if len(req.SrcPages) > 0 && len(req.SrcPages) != req.NumPages {
		return invalid("source.page_indices", "has %d entries for %d pages", len(req.SrcPages), req.NumPages)
	}
	if rp.last >= 0 {
		return invalid("chunk_index", "%d comes after this rank's last chunk %d: nothing may follow the last chunk", req.Index, rp.last)
	}
	rp.cov.init(len(r.pages))
	if p := rp.cov.overlap(req.PageOffset, req.NumPages); p >= 0 {
		return invalid("page_offset", "pages [%d, %d) overlap page %d, which %s already sent for room %d: each page is sent once per rank",
			req.PageOffset, req.PageOffset+req.NumPages, p, req.Rank, r.id)
	}
	if req.Last && rp.cov.nSent+req.NumPages != rp.cov.need {
		rp.cov.mark(req.PageOffset, req.NumPages, true)
		gap := rp.cov.firstGap()
		rp.cov.mark(req.PageOffset, req.NumPages, false)
		return invalid("last", "chunk %d is marked last, but pages %s of the destination's %d were never sent by %s: send every page before (or with) the last chunk",
			req.Index, gap, len(r.pages), req.Rank)
	}
	if req.Last && req.Marker == 0 {
		return invalid("aux", "the last chunk of every prefill rank carries the room marker (aux.room_marker / metadata_room_marker), and chunk %d has none", req.Index)
	}
	if check != nil && len(r.layouts) > 0 {
		if err := check(r.ChunkOp(req)); err != nil {
			return err
		}
	}
	if checkBytes {
		// The bytes a prefill reports are checked against what the layout
		// says the chunk's pages weigh for this rank (head slice included).
		if want := transfer.ChunkBytes(r.ChunkOp(req)); req.Bytes != want {
			return invalid("bytes", "%d is not what chunk %d of %s weighs: pages [%d, %d) carry %d bytes by the layout (Destination.token_bytes x tokens + state_bytes on the last chunk)",
				req.Bytes, req.Index, req.Rank, req.PageOffset, req.PageOffset+req.NumPages, want)
		}
	}
	return nil
}

// sameChunk checks that req is a retry of cs: a chunk index names one page
// range and one last flag for the rank's attempt.
func (cs *chunkState) sameChunk(req ChunkRequest) error {
	if cs.off != req.PageOffset || cs.n != req.NumPages || cs.last != req.Last {
		return invalid("chunk_index", "%d was already sent with pages [%d, %d) and last=%v; a retry must carry the same page_offset, num_pages and last (got pages [%d, %d), last=%v)",
			req.Index, cs.off, cs.off+cs.n, cs.last, req.PageOffset, req.PageOffset+req.NumPages, req.Last)
	}
	return nil
}

func (r *Room) chunkDropped(d ChunkDropped) {
	rp := r.ranksOf(d.Rank)
	if rp == nil {
		return
	}
	if cs := rp.chunks[d.Index]; cs != nil {
		rp.drop(d.Index, cs)
	}
}

// drop forgets a chunk that did not land and may be sent again.
func (rp *rankProgress) drop(index int, cs *chunkState) {
	delete(rp.chunks, index)
	rp.cov.mark(cs.off, cs.n, false)
	if cs.last && rp.last == index {
		rp.last = -1
	}
}

func (r *Room) chunkEnd(c ChunkEnd, e *Effects) {
	req := c.Req
	if c.Via == ViaEngine && r.handoff != nil {
		r.inflight--
	}
	r.noteWrites(c.WritesUntil, e)
	var rp *rankProgress
	var cs *chunkState
	if h := r.handoff; h != nil {
		if rp = h.ranks.get(req.Rank.Key()); rp != nil {
			cs = rp.chunks[req.Index]
		}
	}
	settle := func(err error) {
		if cs != nil {
			cs.busy, cs.err = false, err
		}
		e.Err = err
		r.maybeRelease(c.Now, e)
	}
	switch {
	case r.phase.Terminal(): // failed, or released with the chunk in flight: nothing of it counts, the release may be due
		why := "the room ended"
		if f := r.Failure(); f != nil {
			why = "the room failed: " + f.Message
		}
		settle(fmt.Errorf("chunk %d of room %d: %w: %s", req.Index, r.id, ErrWrongState, why))
	case cs == nil:
		settle(fmt.Errorf("chunk %d of room %d: %w: the chunk is not the room's (a previous attempt's)", req.Index, r.id, ErrWrongState))
	case c.Err != nil && c.Retryable:
		rp.drop(req.Index, cs) // nothing landed: a retry may send it again
		settle(c.Err)
	case c.Err != nil:
		e.Chunk, e.ChunkRes = true, c.Result
		f := Failure{Code: FailureTransferFailed, Message: fmt.Sprintf("KVTransferError(bootstrap_room=%d): chunk %d from %s failed: %v", r.id, req.Index, req.Rank, c.Err)}
		r.fail(Fail{Now: c.Now, Failure: f, SelfWriter: c.SelfWriter}, e)
		settle(fmt.Errorf("%w: %s", transfer.ErrTransferFailed, f.Message))
	default:
		cs.busy, cs.done, cs.result = false, true, c.Result
		r.landed(c.Now, rp, req, c.Result, e)
	}
}

// landed advances the room after one of rank rp's chunks landed: its bytes
// and pages, the rank's completion, the room marker; a claimed room is then
// Transferring, and the success check is due.
func (r *Room) landed(now time.Time, rp *rankProgress, req ChunkRequest, res transfer.ChunkResult, e *Effects) {
	r.bytes += uint64(max(res.Bytes, 0))
	rp.bytes += uint64(max(res.Bytes, 0))
	r.chunksDone++
	rp.cov.landed += req.NumPages
	if req.Last {
		rp.lastLanded = true
	}
	if !rp.done && rp.lastLanded && rp.cov.sent != nil && rp.cov.landed == rp.cov.need {
		rp.done = true
		r.doneN++
	}
	if r.phase == PhaseClaimed {
		r.move(now, PhaseTransferring, "", chunkLandedNote(req.Index, req.Rank), e)
	}
	e.Chunk, e.ChunkOK, e.ChunkRes = true, true, res
	r.markerLanded(res.MarkerWritten)
	e.Then = ThenCheckSuccess
}

// markerLanded records a room marker written into the metadata slot. A
// wrong marker sticks (the room fails as metadata corruption at the next
// success check, whatever other ranks wrote after it).
func (r *Room) markerLanded(marker uint64) {
	if marker == 0 || (r.marker != 0 && r.marker != r.id) {
		return
	}
	r.marker = marker
}

// noteWrites records how long an engine failure may still write into the
// room's pages.
func (r *Room) noteWrites(until time.Time, e *Effects) {
	if until.IsZero() || r.handoff == nil || stampOf(until) <= r.quarantine {
		return
	}
	r.quarantine = stampOf(until)
	e.QuarantineUntil = until
}

func (r *Room) stagingWrite(w StagingWrite, e *Effects) {
	rank := w.Rank
	switch {
	case rank.Addr != r.addr:
		e.Err = invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr)
		return
	case r.phase == PhaseFailed:
		e.Err = fmt.Errorf("%s of room %d: %w: the room failed: %s", w.What, r.id, ErrWrongState, r.Failure().Message)
		return
	case r.plan == nil || r.prefillDP < 0 || r.handoff == nil:
		e.Err = fmt.Errorf("%s of room %d: %w: the room has no destination yet (phase %s)", w.What, r.id, ErrWrongState, r.phase)
		return
	case rank.DP != int(r.prefillDP):
		e.Err = invalid("rank.dp_rank", "%d is not room %d's prefill DP rank %d (%s)", rank.DP, r.id, r.prefillDP, r.dpRule)
		return
	}
	rp := r.progress(rank.Key())
	if rp == nil {
		e.Err = invalid("rank", "%s sends no KV for room %d: it is a dummy target or not addressed by any decode rank", rank, r.id)
		return
	}
	switch r.phase {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		e.Err = fmt.Errorf("%s of room %d: %w: phase %s", w.What, r.id, ErrWrongState, r.phase)
		return
	}
	if !rp.claimed {
		// As for chunks: a rank whose claim stream was given the
		// destination holds it, even if the claim is not recorded yet.
		if !r.attached.has(rank.Key()) || r.phase != PhaseAdmitted {
			e.Err = fmt.Errorf("%s of room %d from %s: %w: this rank has not claimed the destination (call AwaitDestination first)", w.What, r.id, rank, ErrWrongState)
			return
		}
		r.claimRank(w.Now, rp, e)
	}
	if !r.staging || !w.Staged {
		e.Err = fmt.Errorf("%s of room %d: %w: the room is not staged (its destination has staging = false): send its KV with Rooms.Transfer or ReportTransfer", w.What, r.id, ErrWrongState)
	}
}

// ScatterWritable reports whether a scatter may run into the room now (it
// has not ended); when it may not, the error says why.
func (r *Room) ScatterWritable(chunk int) error {
	if !r.phase.Terminal() {
		return nil
	}
	msg := "the room ended"
	if r.Failure() != nil {
		msg = "the room failed: " + r.Failure().Message
	}
	return fmt.Errorf("scatter chunk %d of room %d: %w: %s", chunk, r.id, ErrWrongState, msg)
}

func (r *Room) scatterEnd(s ScatterEnd, e *Effects) {
	if r.handoff != nil {
		r.inflight--
	}
	r.noteWrites(s.WritesUntil, e)
	switch {
	case s.Err == nil && !r.phase.Terminal():
		r.markerLanded(s.Marker)
		e.Then = ThenCheckSuccess
	case r.phase.Terminal():
		e.Err = r.ScatterWritable(s.Chunk)
	case s.Unavailable:
		e.Err = fmt.Errorf("scatter chunk %d of room %d into decode rank %d: %w", s.Chunk, r.id, s.DecodeTP, s.Err)
	default:
		f := Failure{Code: FailureStagingFailed, Message: fmt.Sprintf("KVTransferError(bootstrap_room=%d): scatter of staged chunk %d into decode rank dp %d tp %d failed: %v", r.id, s.Chunk, r.decodeDP, s.DecodeTP, s.Err)}
		r.fail(Fail{Now: s.Now, Failure: f, SelfWriter: s.SelfWriter}, e)
		e.Err = fmt.Errorf("%w: %s", transfer.ErrTransferFailed, f.Message)
	}
	r.maybeRelease(s.Now, e)
}

// checkSuccess declares Success (T12/T17) once every required rank's
// chunks landed, no success gate is pending and the metadata slot holds
// the room's marker (SGLang's metadata gate).
func (r *Room) checkSuccess(c CheckSuccess, e *Effects) {
	switch {
	case r.phase != PhaseTransferring:
		return
	case r.marker != 0 && r.marker != r.id:
		r.fail(Fail{Now: c.Now, SelfWriter: c.SelfWriter, Failure: Failure{Code: FailureMetadataCorruption, Message: fmt.Sprintf(
			"Metadata corruption detected - bootstrap_room mismatch: metadata slot %d holds room %d, expected %d", r.metaSlot, r.marker, r.id)}}, e)
		return
	case r.doneN < len(r.plan.Required()):
		return
	}
	if r.gate(StagingGate) {
		if !c.ScattersPending {
			// Every rank is done, so a region whose writers have not all
			// reported never will be (its pages are covered, and nothing
			// may follow a last chunk): it does not hold the room back; it
			// is freed with the room.
			r.unhold(StagingGate)
			if r.stagingBy != 0 {
				// The waiting deadline was lifted for the completion timeout:
				// restore it, so that a room that does not succeed now (the
				// metadata marker never came) is still failed in time.
				if r.waitingAt == 0 {
					r.waitingAt = r.stagingBy
				}
				r.stagingBy = 0
			}
		} else if r.stagingBy == 0 {
			// SGLang: completion_timeout after all-success; the waiting
			// timeout no longer applies.
			r.waitingAt = 0
			r.stagingBy = stampOf(c.Now.Add(r.cfg.Waiting))
		}
	}
	if r.gated() || r.marker == 0 {
		return // a gate holds it, or aux not landed yet: stay Transferring (the waiting timeout bounds it)
	}
	e.Ledger |= LedgerRunning
	r.move(c.Now, PhaseSucceeded, "T12/T17", numNote(noteSucceeded, int64(r.chunksDone), int64(r.bytes)), e)
	e.EndClaims, e.ClaimEnd = true, DestinationEvent{Done: donePhase(PhaseSucceeded)}
	r.attached.clear()
	e.Finished, e.Outcome, e.Code = true, PhaseSucceeded, FailureUnspecified
	e.SinceOpen, e.Transferred = c.Now.Sub(r.openedAt.time()), c.Now.Sub(r.admittedAt.time())
	e.TransferredBytes = r.bytes
}
