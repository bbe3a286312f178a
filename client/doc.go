// Package client is the Go client of decodeplane, the decode-side control
// plane for prefill/decode disaggregated LLM serving. It wraps the
// decodeplane.v1 services (Admin, Bootstrap, Rooms, Fleet, Capacity) with
// one method per RPC, typed errors, per-RPC retries and trace propagation,
// grouped by who calls them, and adds the helpers those callers need:
// OpenAndWait (the decode engine: open a room and wait for its KV) and
// SendRoom and ReportRoom (a prefill rank: deliver a room's KV).
//
// # One Client, three roles
//
// A Client is one daemon's connection, and it owns every stream the package
// keeps open on it. What is called through it depends on the caller's
// role, and each role has a view that holds no connection of its own:
//
//   - Client.Engine, the decode engine (and a router that opens rooms):
//     OpenRoom, OpenAndWait, WaitRoom, WatchRoom, ReleaseRoom, AbortRoom,
//     ReportRunning, RetractRoom, ContinueGeneration, Resync and
//     LookupDPRanks; for an engine that owns its pages (kv_pool.owner:
//     engine) OpenDeclareAndWait, DeclareDestination and ReportCapacity
//     (PageHeld reads a refusal of a page another hand-off still holds).
//   - Client.Prefill(reg), one prefill scheduler rank: Register,
//     Heartbeat, RunHeartbeat, BindRoom, SendRoom, ReportRoom, the steps of
//     a hand-off (AwaitDestination, Transfer, ReportTransfer, AckRoomEnd)
//     for a prefill that drives them itself, and the rank's state
//     (Registration, Incarnation, Rank). RunHeartbeatFailover beats one
//     rank's Prefills on several daemons of a fleet.
//   - Client.Admin, an operator (decodectl) or an observer: Status, Drain,
//     GetRoom, ListRooms, GetFleet and WatchCapacity (what a router follows
//     to pick a decode instance).
//
// Each operation has one method, on one view. The views are cheap (Engine
// and Admin are the Client's own; a Prefill holds the rank's registration
// and the daemon incarnation it knows), and calls through any of them share
// the Client's retry policy, token, transport and Close:
//
//	c, err := client.New(addr)
//	if err != nil { ... }
//	defer c.Close()
//	engine := c.Engine()
//	room, err := engine.OpenAndWait(ctx, req) // the decode engine
//	...
//	p := c.Prefill(reg) // a prefill rank, in another process in real life
//	go p.RunHeartbeat(ctx)
//	dest, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 4})
//	...
//	st, err := c.Admin().Status(ctx) // an operator
//
// The streams a Client keeps open are what its roles ride under
// TransportStreams (the default; see Transports): the decode engine's
// shared EngineSession stream (OpenAndWait, and ReleaseRoom and AbortRoom
// while it is up) and each prefill rank's shared PrefillSession stream
// (SendRoom, ReportRoom, RunHeartbeat), opened when first needed, re-opened
// after they ended, and ended by Close. They are an internal detail of the
// roles: no method hands one out.
//
// # Construction and Close
//
// New builds a client for a target ("127.0.0.1:7600",
// "unix:///run/decodeplane.sock", "dns:///decodeplane:7600"):
//
//	c, err := client.New("127.0.0.1:7600", client.WithToken(token))
//	if err != nil { ... }
//	defer c.Close()
//
// The connection is insecure unless WithTLS is given. WithToken sends the
// daemon's bootstrap token (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN) as
// "authorization: Bearer <token>", which mutating RPCs need when the daemon
// has one; it is allowed on an insecure connection so that a daemon on
// loopback can require it without TLS, and is then sent in clear text. New
// does not connect: the first RPC does, and an unreachable daemon is
// ErrUnavailable there. NewFromConn wraps a connection the caller made (tests
// over bufconn, programs sharing a connection); Close then leaves the
// connection to its owner. Close must be called; it is idempotent, and calls
// after it fail with ErrCanceled.
//
// A Client is safe for concurrent use by any number of goroutines, and so
// are its views: build one client per daemon and share it. A stream
// (DestinationStream, RoomWatch, CapacityStream) belongs to the goroutine
// that calls its Next; Close may be called from any goroutine.
//
// # Timeouts
//
// There are no hidden timeouts: every method takes a context, and its
// deadline bounds the call, its retries included (a retry that could not
// start before the deadline is not attempted, and the last error is returned
// instead of a bare deadline error). Streams and the helpers (SendRoom,
// OpenAndWait, WaitRoom) wait as long as their context allows; the daemon's
// own timeouts (bootstrap, waiting, claim) bound a room's life in any case.
//
//	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
//	defer cancel()
//	room, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 42})
//
// # Errors
//
// Every error returned by an RPC is a *Error: it carries the gRPC status
// (status.Code(err) and status.FromError(err) work, also through wrapping)
// and matches one family with errors.Is: ErrNotFound, ErrAlreadyExists,
// ErrInvalidArgument, ErrFailedPrecondition, ErrResourceExhausted,
// ErrUnavailable, ErrUnauthenticated, ErrPermissionDenied, ErrAborted,
// ErrDeadlineExceeded, ErrCanceled, ErrUnimplemented and ErrInternal.
// ErrDeadlineExceeded and ErrCanceled also match context.DeadlineExceeded and
// context.Canceled. A room that fails, seen on a stream or by a helper, is a
// *RoomFailedError (errors.Is(err, ErrRoomFailed)) with the room's
// FailureCode and SGLang's message; when a Transfer revealed it, it also
// matches ErrAborted. Tell them apart with errors.Is and errors.As, never
// with the message text:
//
//	room, err := engine.OpenAndWait(ctx, req)
//	var failed *client.RoomFailedError
//	switch {
//	case err == nil:
//		// KV landed: decode, then engine.ReleaseRoom.
//	case errors.As(err, &failed):
//		log.Printf("room %d failed: %s: %s", failed.Room, failed.Code, failed.Message)
//	case errors.Is(err, client.ErrResourceExhausted):
//		d, _ := client.RetryAfter(err) // the daemon's hint
//		retryLater(d)
//	case errors.Is(err, client.ErrUnavailable):
//		// draining or unreachable: use another decode instance
//	case errors.Is(err, client.ErrInvalidArgument), errors.Is(err, client.ErrFailedPrecondition):
//		// a bug or a misconfiguration: the message names the field or
//		// uses SGLang's wording ("Page size mismatch: ...")
//	}
//
// A hand-off (SendRoom, ReportRoom) or a DestinationStream whose
// destination belongs to an earlier incarnation of the daemon is an
// *IncarnationChangedError (errors.Is(err, ErrIncarnationChanged)); see
// Incarnations. StaleIncarnation reads the daemon's STALE_INCARNATION
// refusal from an *Error.
//
// # Incarnations
//
// The daemon draws a new incarnation at every start and refuses requests
// about destinations of another one (FAILED_PRECONDITION,
// STALE_INCARNATION). A Prefill records the incarnation from each
// registration and heartbeat answer and names it in every request about a
// destination. When it learns a new one, every destination of the old one is
// void: the hand-offs holding one stop before their next write or report,
// RunHeartbeat registers again on its next beat (or call Register), and
// OnIncarnationChange is told; hand the rooms off again after that.
//
// On the decode side, a RoomWatch (WaitRoom, OpenAndWait) learns the
// incarnation from its events (RoomEvent.incarnation). When the daemon
// restarted under it, the room died with the old process: the re-opened
// watch ends with the same *IncarnationChangedError (Watch set, naming the
// room), not with the new daemon's NOT_FOUND; open the room again.
//
// # A prefill in a fleet
//
// Decode daemons that share their registry through etcd
// (registry.backend etcd) form a fleet: a prefill rank registers through
// any of them and every one sees it, and the instance stays alive while
// its ranks heartbeat to any of them (an etcd lease the receiving daemon
// keeps alive, for registry.etcd.lease_ttl).
//
// A prefill that is told only each room, not which daemon opened it (as
// SGLang's), is a FleetPrefill: it registers through one daemon (the
// seed), keeps a PrefillSession with offers with every daemon of the fleet
// (GetFleet), and each daemon offers the rank every room it holds for it,
// so that SendRoom and ReportRoom take the room alone and hand it off on
// the daemon that holds it; the sessions are its heartbeats to every
// daemon. See FleetPrefill for the failure bounds.
//
//	f, err := client.NewFleetPrefill("10.0.0.5:7600", reg, client.FleetClientOptions(client.WithToken(token)))
//	if err != nil { ... }
//	defer f.Close()
//	go f.Run(ctx)
//	dest, err := f.SendRoom(ctx, room, client.SendOptions{ChunkPages: 4})
//
// A prefill that knows each room's daemon hands it off through that
// daemon's Prefill instead. If the daemon it heartbeats to dies, the rank
// must heartbeat to another before the lease runs out. Build the rank's
// Prefill once per daemon, from the same registration, one Client each,
// and run RunHeartbeatFailover over them instead of RunHeartbeat:
//
//	var ps []*client.Prefill
//	for _, c := range clients { // one Client per daemon of the fleet
//		ps = append(ps, c.Prefill(reg))
//	}
//	go client.RunHeartbeatFailover(ctx, ps...)
//
// It beats through one daemon at a time and moves to the next at once when
// a beat fails for the daemon (ErrUnavailable, ErrDeadlineExceeded, or the
// daemon's incarnation changed: it restarted), registering there first if
// that Prefill has not registered, and again when the daemon answers
// ErrNotFound; when every daemon failed in a row it waits one cadence.
// Admin.GetFleet lists the fleet's daemons to build the clients from.
//
// Each Prefill learns only its own daemon's incarnation, and a room is
// handed off through the Prefill of the daemon that holds it (the one the
// decode engine opened it on): that Prefill's destinations name that
// daemon's incarnation, whichever daemon the heartbeats go to. With the
// memory registry a daemon knows the rank only once it registered there,
// so the fail-over's registration is what lets the other daemon's rooms
// for the rank proceed.
//
// # Room ends and acknowledgements
//
// A hand-off reads its claim stream while it writes. When the room fails
// and the stream says ack_required (this rank may still be writing into
// the destination by itself), the hand-off stops writing at once (the
// context of ReportRoom's Move in flight is cancelled, nothing more is
// moved or reported), then sends AckRoomEnd for the destination's attempt
// and incarnation (best effort, bounded by AckTimeout), so that the
// daemon's draining pages go back without waiting for its
// release.deferred_timeout; it does the same when a chunk of its own
// revealed the failure. The error is the room's failure
// (RoomFailedError.AckRequired tells). Prefill.AckRoomEnd sends one by hand.
//
// # Transports: streams by default
//
// A Client carries the hand-offs on long-lived multiplexed streams by
// default (TransportStreams); WithTransport(TransportUnary) opts out, for
// peers that cannot hold a stream open and for comparison. On the prefill
// side, every SendRoom and ReportRoom of a Prefill then goes on the rank's
// one shared PrefillSession stream (prefill_session.proto), opened by the
// first hand-off (or by RunHeartbeat) and re-opened after it ended, under
// the retry policy's backoff; same results and errors as the unary path
// (RoomFailedError, IncarnationChangedError, ErrAborted, ...), one state
// machine on the daemon. A session that ends under a hand-off in flight
// is replaced and the hand-off goes on, as the unary path goes on after a
// lost answer: it claims again on the new session (the destination is not
// returned twice) and sends again the op whose answer was lost, which the
// daemon's idempotency rules make safe ((room, rank, chunk_index) keys a
// chunk and its report; ReportRoom's Move is not run again); when the
// sessions keep ending (MaxAttempts in a row) the hand-off fails with the
// session's end, ErrUnavailable for a cut stream. A daemon that does not
// serve PrefillSession (ErrUnimplemented) gets the unary API instead.
//
// The shared session is also the rank's heartbeat (it pings every half
// heartbeat interval, and the daemon counts the session's messages as the
// rank's beats, at most one per quarter interval):
// under TransportStreams RunHeartbeat keeps it open instead of sending
// unary Heartbeat calls, registers again when the daemon ends it NOT_FOUND
// or refuses its re-open as of an earlier incarnation (a restart), and
// sends unary beats only while no session can be opened (then tries again
// every beat). The session is open while RunHeartbeat runs or a hand-off
// is in flight, and closed when neither is (an idle rank does not beat:
// stopping RunHeartbeat stops the beats once the hand-offs in flight are
// done; a hand-off's own session beats while it runs). Client.Close ends
// it for good. RunHeartbeatFailover beats unary whatever the transport.
//
// # Retries
//
// Retries are declared per RPC, in one table (retry.go), from the contract
// in each RPC's proto comment. Only two answers are retried: Unavailable, and
// ResourceExhausted carrying an errdetails.RetryInfo (the daemon's admission
// queue is full). The wait honours the daemon's RetryInfo delay when it gives
// one, else it backs off exponentially with jitter (DefaultRetryPolicy: 4
// attempts, 50ms doubling to 1s; see WithRetry). InvalidArgument,
// FailedPrecondition, NotFound, AlreadyExists and every other code are never
// retried.
//
//   - Retried: GetStatus, GetFleet, RegisterPrefill, Heartbeat, BindRoom, LookupDPRanks,
//     GetRoom, ListRooms, AbortRoom, ReleaseRoom, and Transfer and
//     ReportTransfer ((room, rank, chunk_index) is the daemon's idempotency
//     key). The streams AwaitDestination and WatchRoom are re-opened when
//     they break: the daemon re-delivers the destination or the room's
//     timeline, and Next does not return an event twice.
//   - OpenRoom: retried only when the request carries an idempotency_key; the
//     answer's existing field then tells whether an earlier attempt opened the
//     room. WithAutoIdempotencyKey fills in a key for every call.
//   - Never retried: Drain, ReportRunning, RetractRoom, ContinueGeneration,
//     Resync. Decide yourself (ReportRunning reports absolute lengths: send
//     the next report instead).
//   - The shared sessions are re-opened when they end, and what rode them
//     goes on: OpenAndWait's (below: The engine session) and each rank's
//     (above: Transports).
//   - WatchCapacity is safe to repeat but not re-opened by the client: the
//     end of a CapacityStream is how a router learns that the daemon
//     stopped or is unreachable; open it again (each stream starts with the
//     current figures). ExampleAdmin_WatchCapacity shows a router picking
//     a decode instance from the streams.
//
// gRPC's own transparent retry still resends any call that never reached the
// daemon. A prefill may send its first chunk as soon as it has the
// destination: the daemon takes that chunk as the rank's claim.
//
// # The engine session
//
// Under TransportStreams OpenAndWait rides one EngineSession stream
// (engine_session.proto), shared by every OpenAndWait of the Client and
// opened at the first: the opens of concurrent calls go in batches (one
// opener sends every open queued while the previous batch was in flight,
// at most 256 a batch; each room carries its caller's trace context, so its
// span joins that caller's trace), the session subscribes each room's
// outcome, and a demultiplexer hands each room's event to its call. It
// returns what the unary path returns: the room at ROOM_PHASE_SUCCEEDED, a
// *RoomFailedError, or a refused open as OpenRoom's *Error (same code,
// message and RetryAfter; the field names without the batch's prefix).
// ReleaseRoom and AbortRoom ride the session while it is up, with the
// unary RPC's answers; no session is opened for them alone.
//
// The session's events are read as they come; a daemon that cuts the
// session anyway (past 4,096 queued events: ErrResourceExhausted, "slow
// consumer"), a daemon restart or the network end it. The waiting calls
// then back off under the RetryPolicy and the next attempt opens a new
// session and resumes their rooms from the last event each saw (nothing
// twice, nothing missed). A call fails when its room cannot be resumed
// (after a restart: the *IncarnationChangedError of WaitRoom), when the
// session's end is permanent (ErrUnauthenticated, ErrPermissionDenied,
// ErrUnimplemented, ...), or after MaxAttempts consecutive failed attempts
// (a daemon that is gone: ErrUnavailable, within the caller's context). An
// open whose answer the session's end lost is resent only with an
// idempotency key (or WithAutoIdempotencyKey), as OpenRoom is retried;
// without one the call fails with ErrUnavailable and the room may be open:
// it is never opened twice. A call whose context ended leaves its room as
// it is; the session drops its later events. The daemon holds at most
// 16,384 rooms (pb.MaxEngineSessionRooms) per session until their end:
// beyond, an open is refused with the daemon's ErrResourceExhausted (no
// second session is opened). Toward a daemon that does not serve
// EngineSession (ErrUnimplemented), OpenAndWait takes the unary path for a
// minute, then tries the session again. Close ends the session.
// WithTransport(TransportUnary) keeps OpenAndWait on OpenRoom and WaitRoom
// (a WatchRoom stream per room).
//
// OpenRoom and OpenAndWait pass their context's deadline to the daemon as
// the request's timeout (OpenRoomRequest.timeout), on either transport: what
// the deadline leaves when the open is sent, less a reserve for the answer's
// way back (a twentieth of it, at most 100 ms); a shorter timeout the
// request carries is kept. The daemon caps every bound of the room's
// hand-off with it, and a room it cannot hand off in time fails before the
// context ends, with a *RoomFailedError (FAILURE_CODE_DEADLINE_EXCEEDED)
// naming the phase that used the budget.
//
// Both sessions pack the ops queued while a message is being written into
// it (EngineRequest.more, PrefillRequest.more) once the daemon's response
// header said it reads them ("decodeplane-pack: more"), and ask the daemon
// to pack its events the same way.
//
// # Tracing
//
// New installs the otelgrpc client handler: each RPC is a client span of the
// provider given with WithTracerProvider (default: the global provider), and
// the caller's trace context travels to the daemon in W3C traceparent and
// baggage headers (WithPropagator replaces them), so the daemon's spans, and
// its room spans, join the caller's trace.
//
// # Services to come
//
// Conn exposes the connection for services this package does not wrap yet
// (a Staging service will be added); their methods belong in this package,
// on the view of the role that calls them, with a row per RPC in the retry
// table.
package client
