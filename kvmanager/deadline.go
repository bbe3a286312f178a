package kvmanager

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// The manager's deadlines live in one min-heap keyed by time, driven by one
// timer on the injected Clock armed at the heap's minimum (etcd's lessor is
// the model: one heap, one loop). Each deadline is a value embedded in what
// it bounds (a room, a claim waiting for its room, an address waiting for
// its prefill's registration, a staged room, a shard), so arming one never
// allocates; it carries its kind and the generation (attempt) it was armed
// for, and what it bounds is checked against its current state when it
// fires. A deadline that no longer applies is removed at once (O(log n),
// its heap index is kept) where its owner knows it (a room ends, a claim
// attaches); the others fire once and find nothing to do. The heap holds at
// most one entry per owner, and the timer stops when it is empty.

// deadlineKind says what a deadline bounds.
type deadlineKind uint8

const (
	// dlRoom: a room's one deadline (room.Room.NextDeadline: its phase's
	// bound, its claim timeout, its staging completion, its drain or its
	// quarantine); ref is the *entry, gen its attempt.
	dlRoom deadlineKind = iota + 1
	// dlAdmit: an admission pass due on a shard right after a call (a
	// retraction with nothing else running there); ref is the *shard.
	dlAdmit
	// dlPendingClaim: a claim waiting for OpenRoom; ref is the *Claim.
	dlPendingClaim
	// dlPrefillAttempt: the next check of a prefill's registration; ref is
	// the *addrWait.
	dlPrefillAttempt
	// dlResync: the end of the engine resync wait (resync.go).
	dlResync
)

// deadline is one entry of the heap. Its zero value is not armed.
type deadline struct {
	at   int64 // Unix nanoseconds
	ref  any
	gen  uint32
	kind deadlineKind
	idx  int32 // position in the heap + 1; 0 when not armed
}

func (d *deadline) armed() bool { return d.idx > 0 }

// deadlines is the heap and its timer. mu is a leaf lock: it guards the
// heap, its timer and every field of every deadline entry (the heap index
// included), wherever the entry lives; it is taken under any other lock and
// nothing is called while it is held.
type deadlines struct {
	mu      sync.Mutex
	h       []*deadline
	timer   kvlayout.Stopper
	pending bool   // the timer is pending
	armedAt int64  // when it fires (Unix nanoseconds)
	fire    func() // m.fireDeadlines, built once
	clock   kvlayout.Clock
	closed  *atomic.Bool // the manager's: once closed nothing is armed
}

// resetter is a kvlayout.Stopper that can be re-armed in place (*time.Timer).
type resetter interface {
	Reset(d time.Duration) bool
}

func (q *deadlines) less(i, j int) bool { return q.h[i].at < q.h[j].at }

func (q *deadlines) swap(i, j int) {
	q.h[i], q.h[j] = q.h[j], q.h[i]
	q.h[i].idx = int32(i + 1)
	q.h[j].idx = int32(j + 1)
}

func (q *deadlines) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		j = i
	}
}

func (q *deadlines) down(i0 int) bool {
	i, n := i0, len(q.h)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && q.less(j2, j) {
			j = j2
		}
		if !q.less(j, i) {
			break
		}
		q.swap(i, j)
		i = j
	}
	return i > i0
}

func (q *deadlines) fix(i int) {
	if !q.down(i) {
		q.up(i)
	}
}

// put arms (or moves) d at at.
func (q *deadlines) put(d *deadline, at time.Time) {
	d.at = at.UnixNano()
	if d.armed() {
		q.fix(int(d.idx - 1))
		return
	}
	q.h = append(q.h, d)
	d.idx = int32(len(q.h))
	q.up(len(q.h) - 1)
}

// remove disarms d (a no-op when it is not armed).
func (q *deadlines) remove(d *deadline) {
	if !d.armed() {
		return
	}
	i, n := int(d.idx-1), len(q.h)-1
	if i != n {
		q.swap(i, n)
	}
	q.h[n] = nil
	q.h = q.h[:n]
	d.idx = 0
	if i != n {
		q.fix(i)
	}
	if len(q.h) == 0 && cap(q.h) > 1024 {
		q.h = nil // a burst is over: give its backing array back
	}
}

// popDue removes and returns the earliest deadline due at now, or nil.
func (q *deadlines) popDue(now time.Time) *deadline {
	if len(q.h) == 0 || q.h[0].at > now.UnixNano() {
		return nil
	}
	d := q.h[0]
	q.remove(d)
	return d
}

// set arms d at at, for kind on (gen, ref), and keeps the timer at the
// heap's minimum. The caller holds the lock of what d bounds; the heap's
// own lock is taken here.
func (q *deadlines) set(d *deadline, kind deadlineKind, at time.Time, gen uint32, ref any) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		q.remove(d)
		q.rearm()
		return
	}
	if d.armed() && d.at == at.UnixNano() && d.kind == kind && d.gen == gen && d.ref == ref {
		return // already there
	}
	d.kind, d.gen, d.ref = kind, gen, ref
	q.put(d, at)
	q.rearm()
}

// clear disarms d.
func (q *deadlines) clear(d *deadline) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !d.armed() {
		return
	}
	q.remove(d)
	d.ref = nil
	q.rearm()
}

// armed reports whether d is on the heap.
func (q *deadlines) armed(d *deadline) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return d.armed()
}

// reset disarms every deadline (Shutdown: nothing is waited for any more).
func (q *deadlines) reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, d := range q.h {
		d.idx, d.ref = 0, nil
		q.h[i] = nil
	}
	q.h = nil
	q.rearm()
}

// rearm keeps the one timer at the heap's minimum: stopped when the heap is
// empty, moved earlier when an earlier deadline arrives. A timer that fires
// before the minimum (an earlier entry was removed) finds nothing due and
// re-arms itself. q.mu is held.
func (q *deadlines) rearm() {
	if len(q.h) == 0 || q.closed.Load() {
		if q.pending {
			q.timer.Stop()
			q.pending = false
		}
		return
	}
	next := q.h[0].at
	if q.pending && next >= q.armedAt {
		return
	}
	d := max(time.Unix(0, next).Sub(q.clock.Now()), 0)
	q.armedAt, q.pending = next, true
	if q.timer != nil {
		if rs, ok := q.timer.(resetter); ok {
			rs.Reset(d)
			return
		}
		q.timer.Stop()
	}
	q.timer = q.clock.AfterFunc(d, q.fire)
}

// firedDeadline is a due entry taken off the heap, copied under its lock.
type firedDeadline struct {
	ref  any
	gen  uint32
	kind deadlineKind
}

// fireDeadlines is the run loop's one step: it pops every deadline due now
// under the heap's lock, releases it, then handles each entry under the lock
// of what it bounds (the room's shard, the shard, the pending claims, the
// waiting addresses), each checked against the current state (kind, id,
// generation); unlocking a shard runs the admission passes the entries made
// due. Then it re-arms the timer.
func (m *Manager) fireDeadlines() {
	q := &m.dl
	q.mu.Lock()
	q.pending = false
	if m.closed.Load() {
		q.mu.Unlock()
		return
	}
	now := m.clock.Now()
	var due []firedDeadline
	for d := q.popDue(now); d != nil; d = q.popDue(now) {
		due = append(due, firedDeadline{ref: d.ref, gen: d.gen, kind: d.kind})
		d.ref = nil
	}
	q.mu.Unlock()
	for _, d := range due {
		switch d.kind {
		case dlRoom:
			e := d.ref.(*entry)
			sh := m.shards[e.DecodeDP()]
			sh.mu.Lock()
			if sh.rooms[e.ID()] == e {
				sh.deadline(e)
			}
			sh.unlock()
		case dlAdmit:
			sh := d.ref.(*shard)
			sh.mu.Lock()
			sh.admit()
			sh.unlock()
		case dlPendingClaim:
			m.pend.expire(d.ref.(*Claim))
		case dlPrefillAttempt:
			m.wait.attempt(d.ref.(*addrWait))
		case dlResync:
			m.resyncExpired()
		}
	}
	q.mu.Lock()
	q.rearm()
	q.mu.Unlock()
}

// deadline applies the room's deadline (mu held): what passed is the
// room's to decide, with what it may need to say why.
func (sh *shard) deadline(e *entry) {
	m := sh.m
	ev := room.Deadline{Now: m.clock.Now(), SelfWriter: m.selfWriters.known(e.Addr())}
	if e.Attempt() > 1 {
		_, _, ev.GenerateURL = prefillHTTP(m.reg, e.Addr())
	}
	if e.HasGate(room.StagingGate) {
		ev.ScattersPending, ev.ScatterMissing = sh.scattersPending(e), sh.scatterMissing(e)
	}
	sh.exec(e, ev)
}
