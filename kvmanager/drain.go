package kvmanager

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Deferred release. A prefill rank that received a room's
// destination and writes into its pages by itself (ReportTransfer, or its
// own writes into a staging region) may still be writing when the room
// ends: the daemon cannot see those writes. When a room fails (abort,
// failure, timeout, prefill lost, a rebootstrapped attempt's end) the room
// records, for its current attempt, the ranks that owe an acknowledgement:
// every required rank that received the destination (claimed it, or holds
// a claim stream it was queued on) and that may still write by itself:
// it holds a staging region it allocated and has not reported ready
// (ChunkReady), or its last chunk has not landed and its instance is known
// to write by itself (one of its ranks reported a chunk with
// ReportTransfer, selfWriters) while the daemon's engine does not move this
// rank's chunks (Transfer: those writes keep the engine's rule, release
// after the engine returns). A rank that never received the destination,
// whose writes are all reported, or whose instance has only ever used the
// daemon's engine owes nothing.
//
// The owing ranks' claims end with AckRequired. Once nothing is in flight,
// the room's ledger record goes to prealloc's DrainRoom (its pages, slots
// and metadata slot stay held, not free, visible in Stats.Draining) and its
// end hooks (staging regions) wait. AckRoomEnd removes one rank from the
// owing set; when the last one acked, or when release.deferred_timeout
// (a dlDrain entry on the deadline heap) expires — then with a warning
// naming the ranks that never acked — the room's resources go back through
// the usual path (room.release: Ledger.Release, end hooks, the shard's
// admission due). release.deferred_timeout 0 disables all of it. Shutdown
// does not wait for acknowledgements: rooms it fails are released at once
// (the manager is closed) and rooms already draining stay draining, since
// the ledgers go away with the process.

// ReleaseConfig is the deferred release (release).
type ReleaseConfig struct {
	// DeferredTimeout bounds how long a room's pages stay draining, waiting
	// for the acknowledgements of the prefill ranks that may still write
	// into them (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE style).
	// 0: no deferral, the pages go back when the room ends.
	DeferredTimeout time.Duration `yaml:"deferred_timeout"`
}

// MaxDeferredTimeout is release.deferred_timeout's upper bound.
const MaxDeferredTimeout = 10 * time.Minute

// DefaultDeferredTimeout is the daemon's default release.deferred_timeout.
const DefaultDeferredTimeout = 30 * time.Second

func (c ReleaseConfig) validate(add func(key string, val any, problem, fix string)) {
	if c.DeferredTimeout < 0 || c.DeferredTimeout > MaxDeferredTimeout {
		add("release.deferred_timeout", c.DeferredTimeout, fmt.Sprintf("must be between 0 and %s.", MaxDeferredTimeout),
			"set a duration such as 30s (SGLang's deferred release), or 0 to release a room's pages as soon as it ends.")
	}
}

// ErrStaleAttempt: an acknowledgement names an attempt (generation) that is
// not the room's current one; it changes nothing.
var ErrStaleAttempt = errors.New("stale attempt")

// drainState is a failed room's acknowledgements still owed, for its
// attempt. It lives in the room's handoff (only an admitted room can owe).
type drainState struct {
	attempt uint32
	owing   []RankID
	acked   int
	until   time.Time // zero until the room's record drains
	started bool      // the ledger's record is draining
	dl      deadline
}

// owesAck: rank rp may still write into the room's memory by itself: it
// holds a staging region of the room it has not reported ready, or its
// last chunk has not landed, its chunks are not moved by the daemon's
// engine and its instance is known to write by itself (selfWriters).
func (m *Manager) owesAck(r *room, rp *rankProgress) bool {
	if rp == nil {
		return false
	}
	return (r.staging && rp.stagingOpen > 0) || (!rp.lastLanded && !rp.engine && m.selfWriters.known(r.addr))
}

// maxSelfWriters bounds selfWriters (addresses are client-chosen); past it
// every instance is treated as one that writes by itself.
const maxSelfWriters = 4096

// selfWriters are the prefill addresses whose ranks reported a chunk they
// moved themselves (ReportTransfer): a rank of such an instance that
// received a destination and has not sent its last chunk may be writing.
// A rank of an instance that only ever asked the daemon's engine (Transfer)
// owes nothing until it reports a chunk itself. A leaf: its own lock.
type selfWriters struct {
	mu    sync.Mutex
	addrs map[string]struct{}
	full  bool
}

func (s *selfWriters) note(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.full {
		return
	}
	if _, ok := s.addrs[addr]; ok {
		return
	}
	if len(s.addrs) >= maxSelfWriters {
		s.full, s.addrs = true, nil
		return
	}
	if s.addrs == nil {
		s.addrs = map[string]struct{}{}
	}
	s.addrs[addr] = struct{}{}
}

func (s *selfWriters) known(addr string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.addrs[addr]
	return ok || s.full
}

// noteOwingLocked records, as a room fails, which ranks owe an
// acknowledgement (see the package's deferred release). claims are the
// claims moved out of the room; from is the phase it failed in.
func (m *Manager) noteOwingLocked(r *room, claims *claimSet, from Phase) {
	if !r.inLedger { // the ledger released it (a claim timeout it did not keep)
		return
	}
	if owing := m.owingRanks(r, claims, from); len(owing) > 0 {
		r.drain = &drainState{attempt: r.attempt, owing: owing}
	}
}

// owingRanks are the ranks of room r (failing from phase from, with claims)
// that owe an acknowledgement, sorted; none when deferral is off, at
// shutdown, or for a room with no destination.
func (m *Manager) owingRanks(r *room, claims *claimSet, from Phase) []RankID {
	if m.cfg.Release.DeferredTimeout <= 0 || m.closed.Load() || r.handoff == nil || r.pages == nil {
		return nil
	}
	switch from {
	case PhaseAdmitted, PhaseClaimed, PhaseTransferring:
	default:
		return nil
	}
	var owing []RankID
	seen := map[rankKey]bool{}
	add := func(k rankKey, rp *rankProgress) {
		if seen[k] || !m.owesAck(r, rp) {
			return
		}
		seen[k] = true
		owing = append(owing, RankID{Addr: r.addr, DP: r.prefillDP, CP: k.CP, TP: k.TP, PP: k.PP})
	}
	if s := r.ranks; s != nil {
		if s.has1 && s.rp1.claimed {
			add(s.k1, &s.rp1)
		}
		for k, rp := range s.more {
			if rp.claimed {
				add(k, rp)
			}
		}
	}
	claims.each(func(c *Claim) { // a claim queued the destination: it may have been sent
		k := c.rank.Key()
		add(k, r.progress(k))
	})
	slices.SortFunc(owing, func(a, b RankID) int { return strings.Compare(a.String(), b.String()) })
	return owing
}

// finishClaimsLocked ends the claims an event moved out of the room with
// its event, telling each owing rank to acknowledge.
func (m *Manager) finishClaimsLocked(r *room, e effects) {
	if e.failure != nil {
		m.noteOwingLocked(r, e.claims, e.from)
	}
	d := r.drainOf()
	e.claims.each(func(c *Claim) {
		ev := e.claimEv
		if d != nil && d.owes(c.rank) {
			ev.AckRequired = true
		}
		c.finish(ev)
	})
}

func (r *room) drainOf() *drainState {
	if r.handoff == nil {
		return nil
	}
	return r.drain
}

func (d *drainState) owes(k RankID) bool {
	for _, o := range d.owing {
		if o.Key() == k.Key() {
			return true
		}
	}
	return false
}

// holdForAcksLocked keeps a terminal room's resources while ranks owe an
// acknowledgement: the first time it may release (nothing in flight) its
// ledger record drains and the bound is armed. It reports whether the
// release must wait. Closed (shutdown): nothing is waited for.
func (m *Manager) holdForAcksLocked(r *room) bool {
	d := r.drainOf()
	if d == nil || len(d.owing) == 0 || !r.releasePending || r.inflight > 0 || m.closed.Load() {
		return false
	}
	if d.started {
		return true
	}
	if r.inLedger {
		if err := m.shards[r.decodeDP].led.DrainRoom(r.id); err != nil {
			m.log.Error("ledger refused to drain the room: released at once", "room", r.id, "err", err)
			d.owing = nil
			return false
		}
	}
	d.started = true
	d.until = m.clock.Now().Add(m.cfg.Release.DeferredTimeout)
	m.setDeadlineLocked(&d.dl, dlDrain, d.until, r.id, d.attempt, r)
	m.log.Info("room's pages draining until its prefill ranks acknowledge", "room", r.id, "attempt", d.attempt, "ranks", rankList(d.owing), "until", d.until)
	return true
}

// endDrainLocked gives a draining room's resources back (every rank acked,
// or the bound expired) through the usual release.
func (m *Manager) endDrainLocked(r *room) {
	d := r.drainOf()
	if d == nil {
		return
	}
	m.clearDeadlineLocked(&d.dl)
	d.owing = nil
	m.releaseIfIdleLocked(r)
}

// drainDeadlineLocked is the dlDrain entry: the bound expired before every
// rank acknowledged; the pages go back with a warning naming those ranks.
func (m *Manager) drainDeadlineLocked(r *room, gen uint32) {
	d := r.drainOf()
	if d == nil || !d.started || d.attempt != gen || len(d.owing) == 0 {
		return
	}
	m.log.Warn("room's pages released without every prefill rank's acknowledgement: release.deferred_timeout expired",
		"room", r.id, "attempt", d.attempt, "ranks", rankList(d.owing), "deferred_timeout", m.cfg.Release.DeferredTimeout)
	m.obs.RoomEndAcks("expired", len(d.owing))
	m.endDrainLocked(r)
}

// AckResult is what AckRoomEnd did.
type AckResult struct {
	// Owed: the rank owed an acknowledgement for this attempt (false: a
	// no-op, accepted).
	Owed bool
	// Remaining is how many ranks still owe one; Released: this ack was the
	// last, and the room's resources went back.
	Remaining int
	Released  bool
}

// AckRoomEnd records that rank will write nothing more into the
// destination of the room's attempt. Idempotent per rank and attempt: a
// rank that owes nothing (never received the destination, its last chunk
// landed, it acked already, or the room is still live) is accepted as a
// no-op (Owed false). An attempt other than the room's current one is
// ErrStaleAttempt and changes nothing. When the last owing rank acked the
// room's pages and staging regions go back at once and its shard admits.
func (m *Manager) AckRoomEnd(room uint64, rank RankID, attempt uint32) (AckResult, error) {
	sh, r := m.lockRoom(room) // a draining room is not forgotten: its release is pending
	if r == nil {
		return AckResult{}, fmt.Errorf("ack end of room %d: %w", room, ErrRoomNotFound)
	}
	defer m.unlockShard(sh)
	if rank.Addr != r.addr {
		return AckResult{}, invalid("rank.bootstrap_addr", "%q is not room %d's prefill instance (%q)", rank.Addr, r.id, r.addr)
	}
	if attempt != r.attempt {
		return AckResult{}, fmt.Errorf("ack end of room %d: %w: attempt %d, the room's attempt is %d", room, ErrStaleAttempt, attempt, r.attempt)
	}
	d := r.drainOf()
	if d == nil || d.attempt != attempt {
		return AckResult{}, nil
	}
	i := slices.IndexFunc(d.owing, func(o RankID) bool { return o.DP == rank.DP && o.Key() == rank.Key() })
	if i < 0 {
		return AckResult{Remaining: len(d.owing)}, nil
	}
	d.owing = slices.Delete(d.owing, i, i+1)
	d.acked++
	m.obs.RoomEndAcks("acked", 1)
	res := AckResult{Owed: true, Remaining: len(d.owing)}
	if len(d.owing) == 0 {
		res.Released = d.started
		if d.started {
			m.log.Info("room's pages released: every prefill rank acknowledged", "room", r.id, "attempt", d.attempt, "acks", d.acked)
		}
		m.endDrainLocked(r)
	}
	return res, nil
}

// drainWaitingLocked is a draining room's waiting_for ("" when none).
func (m *Manager) drainWaitingLocked(r *room) string {
	d := r.drainOf()
	if d == nil || len(d.owing) == 0 {
		return ""
	}
	until := "once nothing is in flight, then bounded by release.deferred_timeout"
	if d.started {
		until = "bounded by release.deferred_timeout until " + d.until.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("AckRoomEnd (attempt %d) from prefill ranks %s: its pages are draining, not free; %s", d.attempt, rankList(d.owing), until)
}

func rankList(rs []RankID) string {
	parts := make([]string, 0, min(len(rs), maxListedRanks+1))
	for i, k := range rs {
		if i == maxListedRanks {
			parts = append(parts, fmt.Sprintf("and %d more", len(rs)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("cp %d tp %d pp %d", k.CP, k.TP, k.PP))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}
