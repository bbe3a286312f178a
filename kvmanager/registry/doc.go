// Package registry is the prefill registry of one decode instance: the
// prefill instances that registered (RegisterPrefill's registrations, their
// per-rank tables, completeness and topology, and SGLang's compatibility
// checks against the decode layout), heartbeats and per-rank liveness, the
// DP-rank rules and the BindRoom bindings with their TTL, SGLang's rank
// mapping (_resolve_rank_mapping, compute_head_slice_params) and the
// per-instance rank plan — what a room on that instance requires from which
// prefill ranks. It is pure Go: no gRPC, no generated API, and it does not
// import the room manager (kvmanager); deps_test.go proves it.
//
// # Events, not calls
//
// Rooms are not the registry's. A mutating call does its own part under
// the registry's lock and returns what happened as Events, in order, for the
// caller to apply to rooms after that lock is released:
//
//   - Register (Check, which reads no state and takes no lock, then
//     Record): RankRegistered for every accepted registration; before it
//     InstanceReplaced (a new instance_id at a known address: the old
//     instance and its bindings are already forgotten) or RankReplaced (a
//     new endpoint for a known rank, naming the rank, whose DP group's rooms
//     fail); after it InstanceComplete, once, carrying the instance's
//     topology and its enumerated Plan.
//   - CheckLiveness: HeartbeatMissed (per address, one count per rank whose
//     missed intervals grew) and InstanceLost (the instance and its bindings
//     forgotten; the silent ranks listed, at most MaxListedRanks of them, and
//     LostMessage words the rooms' failure once the caller counted them).
//   - BindRoom: RoomBound when the binding is recorded, BindConflict (with
//     SGLang's follow_bootstrap_room message, nothing recorded) when the
//     room, if open, must fail.
//
// Failure messages use SGLang's wording and travel in the events; failure
// codes, room phases, the registration retry schedule and which rooms wait
// for which address are the room manager's. An error from a mutating call
// changes nothing and comes with no event. LookupDPRanks returns its counts
// by rule (Lookup.ByRule) for the caller's metrics; the registry observes
// and logs nothing itself.
//
// # Locks
//
// A Registry has its own mutex and calls nothing outside itself while
// holding it. kvmanager reads it on the room path while holding a decode
// shard's lock (a shard's lock is always taken first); the calls that
// change rooms — Record, CheckLiveness, BindRoom — return events that
// kvmanager applies after the call, shard by shard (a room opened in
// between reads the registry's new state itself); Heartbeat, Touch,
// LookupDPRanks, Info and RankEndpoint take the registry's lock only.
//
// # Nothing sized by a client's numbers
//
// A prefill's parallel sizes are client-chosen, so the registry never
// allocates or loops in proportion to them: an instance holds one entry per
// rank that registered (it is complete once dp × cp × tp × pp distinct
// in-layout ranks did, a count that saturates instead of overflowing); a
// rank's plan is computed in closed form from the topology, and the full
// plan is enumerated only once the instance is complete, when every entry
// stands for a registration already received; SGLang's mapping lists are
// built only when their total length is within a fixed budget
// (maxMappingEntries), and per call, never kept.
//
// # Liveness
//
// Liveness is per rank: every registered rank must heartbeat, and one rank
// silent for max_failures intervals kills its instance (SGLang T15); the
// event names the silent ranks and their silence. A Plan, once complete, is
// shared read-only by every room on the instance.
package registry
