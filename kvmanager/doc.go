// Package kvmanager is decodeplane's room manager: the decode side of a
// prefill/decode KV hand-off, as a pure domain package (no gRPC). It owns
// room → prefill DP-rank resolution, the transfer state machine of every
// room, the room-facing side of staging for heterogeneous TP (the rings and
// regions are package kvmanager/staging, whose doc says what it owns). It
// moves KV through the transfer engine it is given, through package
// transfer's contract only (transfer.Engine, transfer.Scatterer for staged
// rooms, the optional transfer.ChunkChecker); the engines (transfer/sim,
// transfer/delegate) are the composition root's choice. The KV pages, slots
// and admission decisions belong to the prealloc ledgers, one per decode DP
// shard (*prealloc.Ledger); a room's ledger record lives inside the room
// (prealloc.Entry). The prefill registry (registrations, heartbeats and
// liveness, DP-rank rules and bindings, SGLang's rank mapping and the
// per-instance rank plan) is kvmanager/registry, with its own lock: its
// calls return events (an instance complete, lost or replaced, a rank
// replaced, a room bound) that the manager applies to rooms shard by shard,
// under each shard's lock in turn; which rooms wait for which address, and
// their registration retry schedule, stay here as room state. Its types (RankID, Registration,
// PrefillTopology, DPRule, ...) are re-exported here as aliases.
//
// # A room's lifecycle
//
// OpenRoom creates the room (SGLang T1) in PhaseWaitingPrefill and enqueues
// it in its shard's ledger, which checks the capacity first. The room then
// waits for its prefill instance to be fully registered (SGLang's 15
// attempts with back-off 1, 1, 2, 4, 4, ... s; T3 when they run out) and
// for its prefill DP rank (hint, dp_size == 1, room % dp_size under
// follow_bootstrap_room, BindRoom; T2), and becomes PhaseQueued (T4/T8). The
// ledger's admission pass pre-allocates pages and slots (T11) and the
// destination is offered to every prefill rank holding a claim
// (AwaitDestination); when every required rank received it the room is
// PhaseClaimed and SGLang's waiting timeout starts. Chunks moved by the
// engine (Transfer) or by the prefill itself (ReportTransfer), or staged
// through a ring (StagingChunkReady), advance each rank's page coverage: a
// bitmap over the destination's pages per required rank (coverage.go).
// Success is a proof, not a count of chunks: the room succeeds (T12/T17) only
// when every page has landed from every required rank, each rank's last
// chunk (which must carry the room marker and complete the rank's coverage)
// landed, every staged region is scattered and the metadata slot holds the
// room's marker (T19 when it holds another room). A chunk whose pages fall
// outside the destination or overlap pages its rank already sent, a retry
// with another page range, and a reported byte count that is not what the
// layout says the pages weigh (transfer.RankWeights) are refused before anything
// changes. GetRoom shows the coverage and what the room waits for. The
// decode engine releases a succeeded room (ReleaseRoom); AbortRoom fails a
// room in any phase (T16). While it runs, ReportRunning grows it (the
// engine's decode step, after which each reported shard runs an admission
// pass) and RetractRoom takes its pages back at once: a RETRACT room is
// PhaseRetracted and resumes (T20) at a pass after the next ReportRunning of
// its shard, or RetractResumeAfter (1 s) after the call when nothing else runs there — never
// inside RetractRoom. A REBOOTSTRAP room is PhaseHeld (T21) until
// ContinueGeneration starts its next attempt on its pinned prefill DP rank
// (T22); ContinueGenerationResumed gives the decode engine the prefill's
// /generate (bootstrap host + prefill_http_port) and that rank, and the
// engine's recompute request makes the prefill claim and send (T23;
// rebootstrap.go). A retracted room is bounded by timeouts.retracted and a
// held one by timeouts.held from the retraction (FailureRetractTimeout).
// A room's KVPoll
// is derived from its phase with SGLang's numbers and only moves forward.
//
// # The room is the state machine
//
// One type, room, owns a room's phase, attempt, claims, page coverage,
// watchers, gates, staging hold and deadlines. Its event methods
// (effects.go: transition, prefillKnown, resolvingDP, dpResolved,
// allocated/admitted/resumed, claimRank/claimed, chunkLanded, markerLanded,
// successCheck/successReady, succeeded, retracted, held, fail, released,
// rebootstrap, release, nextDeadline, expired)
// change only the room — no clock (the
// time is an argument), no lock, no ledger, no channel — and return an
// effects value (no slice of its own) that the manager applies right after,
// under the room's shard lock (Manager.applyLocked): claims to end, watcher
// events, the deadline to re-arm, transfers to cancel, the ledger's record
// and end hooks to give back (exactly once: room.release), the admission to
// mark due, observer calls, spans and log lines. Each transition is tested
// on a bare room (effects_test.go). What needs the registry, the ledger or
// the staging handler to decide (DP-rank resolution, the admission pass,
// the success check's staging gate, chunk validation) stays in the
// manager's methods, which call the room's.
//
// # Bounded waits
//
// Every wait has a deadline on the injected Clock: the prefill registration
// budget, the DP-rank resolution bound, timeouts.bootstrap until the
// destination is claimed (SGLang has no decode-side deadline there), the
// ledger's claim timeout, the waiting timeout after the claim, and the
// staging completion timeout, and release.deferred_timeout while a failed
// room's pages drain; heartbeats declare a silent prefill instance
// dead (T15). Liveness is per rank: every registered rank must heartbeat,
// and one rank silent for max_failures intervals kills its instance; the
// rooms' failure and the log line name the silent ranks and their silence.
// OpenRoom may carry the request's time budget (OpenRequest.Timeout): it
// caps every bound of the first attempt's hand-off at what is left of it,
// and a room whose budget ends first fails with FailureDeadlineExceeded,
// naming its phase and the time each phase took (GetRoom's PhaseTimes, the
// room span's decodeplane.phase_ms.* attributes; room/budget.go).
// Tests drive all of them with testing/synctest.
//
// # Quiet under storms
//
// What can happen to many rooms at once is logged through one
// internal/stormlog logger (logs.go): room failures (per failure code and
// bootstrap address), drains, quarantines and internal errors write one
// line per cause per interval, the first at once and then a summary with
// the count and a few room ids, so that a prefill lost with a million rooms
// queued writes a handful of lines. Each room's own account stays in its
// events, its trace and GetRoom.
//
// # Nothing sized by a client's numbers
//
// A prefill's parallel sizes are client-chosen; the registry's bounds (lazy
// rank tables, saturating counts, closed-form plans, the mapping-list
// budget) are in kvmanager/registry's package comment. A room creates a
// rank's progress when that rank first claims or sends and counts claimed
// and done ranks instead of scanning them.
//
// # One deadline heap
//
// Every one of these deadlines — a room's phase deadline, a shard's next
// ledger claim deadline, a claim waiting for OpenRoom, an address's next
// registration check, a staged room's completion timeout, a quarantine's end,
// a draining room's release.deferred_timeout, the admission pass due right
// after a retraction and the end of the engine resync wait — is an entry of one
// min-heap keyed by time (deadline.go; etcd's lessor is the model), driven by
// one timer on the injected Clock armed at the heap's minimum. An entry is a
// value inside what it bounds (arming one allocates nothing) and carries its
// kind and the attempt it was armed for; when it fires it is checked against
// the current state. An entry that no longer applies is taken off the heap
// at once (O(log n), it keeps its heap index) — a room's when it ends or
// changes phase, a claim's when it attaches or closes, a staged room's when
// its regions go back; the few left (a registration check whose rooms all
// ended, an admission pass another pass already ran) fire once and find
// nothing to do. So the heap holds at most one entry per room, claim,
// address and shard, and the timer stops once nothing waits. The timer's
// callback is the loop: it handles every entry due, then re-arms.
//
// # Admission runs once per change
//
// A call that ends rooms (ReleaseRoom, AbortRoom, a failure, a timeout, a
// prefill lost) does not run admission inside itself for each room it frees:
// it marks the room's shard "admission due", and the shard's pass runs once
// when the call is done with its own rooms, just before it releases the
// shard's lock (Manager.unlockShard; the deadline loop unlocks each shard it
// handled an entry of the same way).
// The calls that make a room admissible (OpenRoom, BindRoom, a completed
// registration, ReportRunning's decode step) run their shard's pass
// directly, so that their answer shows the admission.
//
// # Resources come back exactly once
//
// A room that ends (released, failed, aborted, timed out, shut down) gives
// its resources back through Ledger.Release and its OnRoomEnd hooks (staging
// regions), exactly once, and only after every transfer the engine runs into
// its pages has returned — and, when the engine cannot rule out late writes
// (a transfer agent lost with a batch it may have accepted,
// transfer.WritesMayContinueError), only after that batch's deadline. Writes a prefill
// performs itself (ReportTransfer, its own writes into a staging region) are
// beyond the daemon's sight, so a room that fails while a rank that received
// its destination may still write that way (it holds a staging region it
// has not reported ready; or its last chunk has not landed, its chunks are
// not moved by the daemon's engine and its instance is known to report
// chunks it moved itself) enters the draining state
// (drain.go; SGLang's deferred release behind ABORT_ACK): that rank's claim
// ends with AckRequired, and once nothing is in flight the room's ledger
// record goes to prealloc's DrainRoom — its pages, slots and metadata slot
// stay held, not free, counted in Stats.Draining — and its end hooks
// (staging regions) wait. They come back, through the same single release,
// when every owing rank called AckRoomEnd for the room's attempt (an ack for
// another attempt is ErrStaleAttempt and changes nothing; one from a rank
// that owes nothing is a no-op), or when release.deferred_timeout (the
// heap's dlDrain entry) expires, with a warning naming the ranks that never
// acked. release.deferred_timeout 0 (kvmanager's zero Config) keeps the
// earlier rule: resources go back when the room ends. Shutdown asks for no
// acknowledgement and waits for none: the ledgers go away with the process.
//
// The ledgers' decisions are checked independently (reach.go): each shard
// records the indices a writer may still reach — a destination from when it
// goes out to a prefill rank until the room's writers are known to have
// stopped (success, or its resources back) and the engine calls the
// executor started into it have returned — and every hand-out (admission,
// resumption, growth, a declaration, a resync) is checked against it. An
// index handed out while reachable is counted (PageReuseViolations, the
// metric decodeplane_page_reuse_violations_total) and logged, and panics
// under this package's tests.
//
// # Engine resync after a restart
//
// With a resync wait (HoldForResync, engine.resync_timeout) the manager
// starts without admitting: rooms open and queue, admitLocked returns at
// once, nothing is pre-allocated. Resync adopts the rooms the decode engine
// still runs (prealloc.Ledger.AdoptEntry: exactly the req slot, pages, SWA
// pages and Mamba slots it names, or nothing); each is a room in
// PhaseSucceeded, never admitted here, that ReportRunning, RetractRoom,
// ReleaseRoom and AbortRoom treat as any running room. The wait ends with
// the engine's done or at its deadline (dlResync on the one heap), after
// which every shard runs an admission pass and Resync is ErrResyncClosed
// (resync.go). Its lock (Manager.rs.mu) is taken before a shard's: Resync
// adopts under it so that the wait cannot end half-way through a call.
//
// # Concurrency
//
// A Manager is safe for concurrent use, and its decode DP shards are the
// unit of concurrency (shard.go). A shard's mutex guards its rooms (every
// field of every room on it), its retained terminal rooms, its staged
// rooms, its admission-due flag and the state its deadline entries bound;
// a call that names a room takes only that room's shard lock, and no lock
// but that one is held across room work. Engine calls run outside every
// lock. The other locks are leaves, held only for their own data:
//
//   - the room directory: each shard's map of its rooms, written with the
//     shard's lock and its directory lock (shard.dirMu) held, read by a
//     lookup that holds no shard lock under dirMu alone (the room's home
//     shard, room % dp, first, then the others); after taking the found
//     room's shard lock the caller checks the room is still there;
//   - openMu: OpenRoom's look-again-and-insert, so that a room id is unique
//     across the shards;
//   - the claims for rooms not opened yet (Manager.pend) and the rooms
//     waiting for a prefill's registration with their retry schedule
//     (Manager.wait): OpenRoom inserts the room before it takes its
//     pending claims, and AwaitDestination looks the room up again under
//     the pending claims' lock, so that a claim is never lost between them;
//   - the deadline heap (deadlines.mu): it guards every entry's fields and
//     heap index; the timer's callback pops the due entries under it,
//     releases it, then handles each under the lock of what it bounds,
//     re-checking (kind, id, generation);
//   - the Shutdown progress signal and summary; draining and closed are
//     atomics;
//   - the ranks subscribed to their rooms (Manager.offers, offers.go):
//     read under a room's shard lock when its DP rank resolves, written
//     by OfferRooms and a subscription's stop under no other lock; the
//     claims it makes are attached under the shard lock already held,
//     and the registry is read under it.
//
// Lock order: the resync wait's lock → shard → offers → openMu → pending claims → waiting addresses → the
// directory, the registry, the staging handler, the ledger, the deadline
// heap. No two shard locks are ever held at once: whatever concerns every
// room (registry events, Status, ListRooms, InFlight, Shutdown,
// ContinueGeneration, the retention sweep) visits the shards one at a time,
// and nothing calls back up. Heartbeat, TouchPrefill, LookupDPRanks,
// PrefillInfo and RankEndpoint take the registry's lock only; ShardStats
// and Capacity (capacity.go: each shard's figures for routers, polled by
// the capacity stream) take each ledger's lock in turn and no shard lock; a registry
// call's events are applied after it returned. A room opened meanwhile reads
// the registry's new state itself (and looks again after parking for a
// registration); one whose OpenRoom read an instance just before it was
// declared lost or replaced, and joined its shard just after the event
// visited that shard, is not failed by the event: its own deadlines end it. rooms.max_retained is split
// evenly across the shards (each keeps its share of the most recent
// terminal rooms). The room path is cheap: without a tracer (the no-op
// provider, detected once in New) or when the room's span does not record,
// no span or attribute is built; a room keeps its timeline as compact
// transitions (a note code and numbers, 32 bytes each; OpenRoom's is derived
// from the room, not kept) whose text is rendered only for a snapshot, an
// event or a debug log; claims, watchers
// and chunk maps are made on first use; an engine Transfer's cancel lives
// in its chunk, called when the room fails. Run runs the periodic checks (heartbeat liveness,
// binding expiry, retention); Shutdown ends every room and leaves every
// ledger full.
//
// # Shutdown
//
// Shutdown drains (no new rooms, no admission), fails at once the rooms not
// admitted yet and the claims on rooms never opened, gives the admitted
// rooms until its context is done to finish, then fails the rest with
// FailureShutdown ("… Request {rid} aborted: decode server shutting down")
// and releases the Succeeded ones (a success is never turned into a
// failure). Each end is queued on every claim stream and watcher before
// Shutdown returns; the caller (internal/daemon) keeps part of its deadline
// so that the gRPC handlers send them before the server stops, and reads
// ShutdownSummary for the exit status. Releases wait for the engine's
// in-flight transfers as always; a quarantine for writes that may continue
// (transfer.WritesMayContinueError) is not waited out, since the ledgers go away with
// the process.
package kvmanager
