// Package fleet is the prefill registry shared by the decode daemons of a
// fleet through etcd (registry.backend etcd); the default, memory, keeps
// the registry in the room manager of one daemon and needs nothing else.
// It is an outbound adapter: it calls the room manager (kvmanager, through
// Rooms) and etcd's client, and the server calls it as its Registrar and
// its FleetView; the domain never imports it.
//
// # Keys
//
// Under the prefix P (registry.etcd.prefix, default /decodeplane/), with
// addresses path-escaped and values JSON (records.go):
//
//	P daemons/<advertise_address>          a decode daemon: incarnation, version, start, KV layout     (its own lease)
//	P capacity/<advertise_address>         its capacity (CapacityUpdate, protobuf JSON)               (its own lease)
//	P prefills/<addr>/instance             a prefill instance: instance_id (its incarnation), lease,   (the instance's lease)
//	                                       the daemon that created it
//	P prefills/<addr>/ranks/<dp>.<cp>.<tp>.<pp>  one rank's registration, as RegisterPrefill got it  (the instance's lease)
//
// Room → DP-rank bindings (BindRoom) are NOT in etcd: they are one write
// per request, and the measured and published etcd write rates
// (docs/sizing.md) are below what a fleet's requests would need. They stay in
// the daemon that owns the room, which is the daemon the prefill hands the
// room's KV to; a prefill that does not know that daemon sends its binding
// to every daemon (client.FleetPrefill.BindRoom). Neither is which daemon
// owns a room in etcd (# Claim routing).
//
// # Claim routing
//
// A prefill rank that registered through any daemon receives the
// destination of every room opened for it on any daemon, and its chunks,
// reports and acknowledgements reach the room's owner, without being told
// the owner (SGLang's prefill knows the room, its own bootstrap address and
// a DP hint). The owner tells it, as SGLang's decode side pushes its
// TransferInfo: the rank keeps a PrefillSession with every daemon of the
// fleet (found with Fleet.GetFleet, which this package answers from the
// view), its hello asking for offers, and each daemon claims for the rank
// every room it holds for the rank's instance and DP rank (those open at
// the hello, then each as its DP rank resolves: kvmanager.OfferRooms) and
// offers it on that session: an offer event, then the destination at
// admission, then the room's end (prefill_session.proto, Session: Offers).
// The rank hands the room off on the session the offer came on
// (client.FleetPrefill; the Python client's FleetPrefill).
//
// Why: the destination takes one message from the owner at admission, as
// for a claim that waited there, so the room path has no extra hop (a
// daemon forwarding claims to the owner would add one to every room, and
// need to know every room's owner); nothing is written to etcd per room (an
// owner record per room is the write rate that keeps bindings out of etcd);
// only the owner offers a room, and only to the ranks it is for (a claim
// broadcast to every daemon would cost each a pending claim per room); and
// the owner's death is the end of the rank's session with it, so the
// rank's hand-offs of its rooms fail once that session could not be opened
// again (the client's retry policy: under a second when the process died;
// the connection's keepalive when its host vanished), or with the new
// incarnation when it restarted. Each daemon is dialed with the rank's own
// credentials (token, TLS) and no daemon calls another; an offer starts no
// trace, the hand-off's ops carry the caller's.
//
// # Leases
//
// A daemon grants one lease for itself (TTL registry.etcd.lease_ttl), keeps
// it alive every second (which is also its probe of etcd), and revokes it
// when it stops, so that its record and capacity leave at once; killed, they
// leave when the lease expires.
//
// A prefill instance has one lease, granted by the daemon that first
// records one of its ranks (a transaction conditional on the instance key
// being absent, so concurrent registrations through several daemons agree
// on one lease); its other ranks are put under the same lease (conditional
// on the instance record read). Any daemon can keep any lease alive: the
// lease lives while the instance heartbeats to ANY daemon of the fleet, and
// the daemon that receives the heartbeats keeps it alive at most once per
// third of the TTL (and at once when an instance it did not keep alive
// recently starts heartbeating to it: a fail-over). A prefill whose daemon
// dies moves its heartbeats to another (client.RunHeartbeatFailover) and
// keeps its lease, and its rooms on every daemon go on, if it does so within
// the TTL. A new instance_id at the same address replaces the instance: its
// record and the new rank go under a new lease, then the old lease is
// revoked, which removes the old ranks.
//
// Liveness in this mode is per instance and is the lease: the room
// manager's own heartbeat count never declares an instance lost
// (kvmanager.Deps.LeaseLiveness), since its ranks may heartbeat to another
// daemon. Heartbeat RPCs, SGLang's HTTP health polls (Touch) and
// registrations all count as heard. One rank that dies while the others
// heartbeat keeps the lease alive: its rooms fail by their own timeouts
// (timeouts.bootstrap, timeouts.waiting), not by the lease — the memory
// registry's per-rank silence check has no fleet-wide equivalent here.
//
// # The view
//
// Each daemon reads the whole prefix once (a snapshot at revision R) and
// then watches it from R+1; the room path reads only the room manager's
// registry, which the view keeps current, so it never waits on etcd. A
// watch that fails, or a reconnect after etcd was unreachable, rebuilds the
// view from a fresh revision and applies the difference: new registrations
// are recorded; instances that left are lost, unless they heartbeat to this
// daemon, which then re-creates their records under a new lease
// (re-attach) and keeps their rooms.
//
// A registration reaches the other daemons through their watch, usually
// within milliseconds of the registering daemon's answer (BENCHMARKS.md),
// but a daemon whose watch lags may answer NotFound to a heartbeat or keep a
// room WAITING_PREFILL a little longer: the prefill registers again there
// (the Go client does), and the room goes on once the registration arrives.
//
// # Failure semantics
//
//   - etcd unreachable (the per-second probe, a keepalive of this daemon's
//     own lease, or the view's snapshot fails; a failed registration is
//     refused and counted but changes no state): the registry is degraded
//     (also from startup until the first view is built). Rooms keep flowing on the cached view;
//     RegisterPrefill is refused with UNAVAILABLE ("registry degraded ...;
//     retry"); heartbeats are still accepted (their keepalives fail until
//     etcd is back); GetStatus's and WatchCapacity's readiness ends with
//     "; registry degraded: <reason>" while gRPC health stays SERVING;
//     decodeplane_registry_degraded is 1. When etcd answers again the view
//     is rebuilt, then the state is ok. A restarted etcd (or a new leader)
//     renews its leases' TTL, so an etcd outage expires nothing; a network
//     partition between a daemon and a live etcd does not stop the leases'
//     clocks: instances that heartbeat only to the cut-off daemon expire
//     for the others, and are re-created by it when it reconnects (their
//     rooms on the other daemons failed meanwhile). A single-member etcd
//     that stops gracefully refuses requests for up to ~7 s while it still
//     expires leases (it drains its watches): with one member, keep
//     lease_ttl well above that (the default 30 s); a 3-member cluster has
//     no such window.
//   - A daemon dies: its rooms are gone (they were its own); its prefills
//     heartbeat elsewhere and keep their leases and their rooms on the
//     other daemons. A prefill rank's hand-offs of its rooms fail with its
//     session (# Claim routing).
//   - A prefill instance heartbeats to no daemon for lease_ttl: its lease
//     expires (between lease_ttl and lease_ttl + lease_ttl/3 + 1 s after its
//     last heartbeat, since keepalives go at most once per third of the TTL), every daemon forgets it and fails its rooms still handing off
//     with FAILURE_CODE_PREFILL_LOST, "... its fleet registry lease expired:
//     no rank heartbeated to any decode daemon of the fleet within
//     registry.etcd.lease_ttl 30s".
//   - A registration this daemon does not accept (a different decode layout
//     in the same fleet) is skipped here with a warning and
//     decodeplane_registry_rejected_total.
package fleet
