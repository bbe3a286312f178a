"""The decode engine's view (:attr:`decodeplane.Client.engine`): rooms
(OpenRoom, WatchRoom, ReleaseRoom, AbortRoom, ReportRunning, RetractRoom,
ContinueGeneration, Resync, DeclareDestination, GetRoom, ListRooms),
ReportCapacity, LookupDPRanks, the engine's multiplexed stream
(:class:`~decodeplane.engine_session.EngineSession`) and
:meth:`EngineAPI.open_and_wait`.

An engine that owns its pages (the daemon's ``kv_pool.owner: engine``, as
SGLang's and vLLM's schedulers do) opens each room, declares the pages it
allocated for it (:meth:`EngineAPI.declare_destination`), reuses a failed
room's pages only after the room's last event (``pages_reusable``: see
:meth:`EngineAPI.watch_room`), reports what it has free
(:meth:`EngineAPI.report_capacity`), and after a daemon restart re-declares
the hand-offs it still had in flight (:meth:`EngineAPI.resync` with
:func:`in_flight`).

The shared session
------------------

:meth:`EngineAPI.open_and_wait` uses one EngineSession, shared by every call
of the client (Transport.STREAMS, the default), with
ENGINE_EVENTS_OUTCOME: each call opens its room as an op on it (concurrent
calls' opens are packed into one message) and waits for its room's outcome
event. When the session ends (a slow consumer cut, a daemon restart, the
network) the waiting calls back off under the retry policy and the next
attempt opens a new session and resumes their rooms from the last event
each saw. A daemon that does not serve EngineSession (UNIMPLEMENTED) gets
the unary path (OpenRoom, then WatchRoom) for a minute, then the session is
tried again. ReleaseRoom, AbortRoom and DeclareDestination ride that
session when it is up.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import grpc

from decodeplane._core import Deadline, Resumable, wait_retry, with_deadline
from decodeplane._engine_mux import UNARY_FALLBACK, _EngineMux, _op_seq, _transient_end, _Waiter, _wait_step
from decodeplane.admin import RoomReads
from decodeplane.client import Transport, build, copy_of
from decodeplane.engine_session import (
    _OK_END,
    ENGINE_EVENTS_ALL,
    ENGINE_EVENTS_OUTCOME,
    MAX_ENGINE_OPEN_ROOMS,
    MAX_ENGINE_WATCH_ROOMS,
    EngineSession,
    RoomSubscription,
    SessionResult,
)
from decodeplane.errors import (
    DecodeplaneError,
    FailedPreconditionError,
    IncarnationChangedError,
    NotFoundError,
    UnimplementedError,
    local_error,
    unprefix,
    with_op,
)
from decodeplane.retry import retryable
from decodeplane.streams import RoomWatch
from decodeplane.v1 import bootstrap_pb2, capacity_pb2, common_pb2, engine_layout_pb2, engine_session_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["EngineAPI", "EngineSession", "SessionResult", "RoomSubscription", "ENGINE_EVENTS_ALL",
           "ENGINE_EVENTS_OUTCOME", "MAX_ENGINE_OPEN_ROOMS", "MAX_ENGINE_WATCH_ROOMS", "MAX_RESYNC_ROOMS",
           "in_flight"]

#: Rooms per Resync call.
MAX_RESYNC_ROOMS = 4096

_SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED

_OPEN_ROOM = "/decodeplane.v1.Rooms/OpenRoom"
_WATCH_ROOM = "/decodeplane.v1.Rooms/WatchRoom"
_RELEASE_ROOM = "/decodeplane.v1.Rooms/ReleaseRoom"
_ABORT_ROOM = "/decodeplane.v1.Rooms/AbortRoom"
_REPORT_RUNNING = "/decodeplane.v1.Rooms/ReportRunning"
_RETRACT_ROOM = "/decodeplane.v1.Rooms/RetractRoom"
_CONTINUE_GENERATION = "/decodeplane.v1.Rooms/ContinueGeneration"
_RESYNC = "/decodeplane.v1.Rooms/Resync"
_DECLARE = "/decodeplane.v1.Rooms/DeclareDestination"
_REPORT_CAPACITY = "/decodeplane.v1.Capacity/ReportCapacity"
_REGISTER_LAYOUT = "/decodeplane.v1.Rooms/RegisterEngineLayout"
_LOOKUP_DP_RANKS = "/decodeplane.v1.Bootstrap/LookupDPRanks"


def in_flight(declared: rooms_pb2.DeclareDestinationRequest, *, rid: str, prompt_len: int, max_new_tokens: int,
              decode_dp_rank: int = 0, bootstrap_addr: str = "",
              prefill_dp_rank: Optional[int] = None) -> rooms_pb2.ResyncRoom:
    """The ResyncRoom that re-declares, after a daemon restart, a hand-off
    the engine still had in flight (declared, neither succeeded nor
    reusable): ``in_flight`` set, the declared pages, metadata row, state
    indices and decode prefix length, and the room's request facts. The new
    daemon holds its pages as draining until the room's prefill ranks
    acknowledge (AckRoomEnd) or release.deferred_timeout passes; the room's
    WatchRoom then ends with ``pages_reusable``."""
    r = rooms_pb2.ResyncRoom(room=declared.room, rid=rid, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                             decode_dp_rank=decode_dp_rank, page_indices=list(declared.page_indices),
                             bootstrap_addr=bootstrap_addr, in_flight=True, metadata_slot=declared.metadata_slot,
                             state=list(declared.state), decode_prefix_len=declared.decode_prefix_len)
    if prefill_dp_rank is not None:
        r.prefill_dp_rank = prefill_dp_rank
    return r


RunningRooms = Union[rooms_pb2.ReportRunningRequest, Mapping[int, int], Iterable[rooms_pb2.RunningUsage]]


class EngineAPI(RoomReads):
    """The decode engine's calls. Get it from :attr:`decodeplane.Client.engine`."""

    def __init__(self, client: "Client") -> None:
        self._c = client
        self._mux = _EngineMux(client)
        client._on_close(self._mux.close)

    # ---- unary ----

    def _keyed(self, req: rooms_pb2.OpenRoomRequest) -> rooms_pb2.OpenRoomRequest:
        if self._c._auto_key and not req.idempotency_key:
            req = copy_of(req)
            req.idempotency_key = "auto-" + uuid.uuid4().hex
        return req

    def open_room(self, request: Optional[rooms_pb2.OpenRoomRequest] = None, *, timeout: Optional[float] = None,
                  **fields: Any) -> rooms_pb2.OpenRoomResponse:
        """OpenRoom: admits a request to the decode side and returns at once
        with the room's state (an OpenRoomRequest, or its fields as keywords:
        ``rid``, ``bootstrap_addr``, ``room``, ``prompt_len``,
        ``max_new_tokens``, ...). Errors: InvalidArgumentError (a field,
        named; a request that can never fit), AlreadyExistsError,
        ResourceExhaustedError (admission queue full: ``retry_after``),
        UnavailableError (draining). Retried on UNAVAILABLE only with an
        ``idempotency_key`` (see ``Client(auto_idempotency_key=True)``).
        A ``timeout`` given here is also the request's time budget
        (``OpenRoomRequest.timeout``, less a reserve for the answer): see
        open_and_wait."""
        req = self._keyed(build(rooms_pb2.OpenRoomRequest, request, fields))
        if timeout is not None:
            req = with_deadline(req, Deadline(timeout))
        return self._c._invoke(_OPEN_ROOM, self._c._rooms_stub.OpenRoom, req, timeout)

    def watch_room(self, room: int, *, history: bool = False, timeout: Optional[float] = None) -> RoomWatch:
        """WatchRoom: the room's current state (and every earlier transition
        with ``history``), then each transition until its last event (the
        one with ``pages_reusable``: the terminal event, or, for a room that
        failed while a prefill rank could still write into its pages, the
        event after it once they are reusable). A broken stream is re-opened; see :class:`RoomWatch`. NotFoundError
        comes from its ``next``. ``timeout`` bounds the whole watch."""
        self._c._check_open("WatchRoom")
        req = rooms_pb2.WatchRoomRequest(room=room, history=history)
        dl = Deadline(timeout)

        def open_call(reopen: bool, remaining: Optional[float]) -> Any:
            # A re-open asks for the whole timeline: RoomWatch skips what it
            # returned and misses nothing that happened meanwhile.
            r = rooms_pb2.WatchRoomRequest(room=room, history=True) if reopen else req
            return self._c._rooms_stub.WatchRoom(r, metadata=self._c._md, timeout=remaining)

        s: Resumable[rooms_pb2.RoomEvent] = Resumable(self._c, _WATCH_ROOM, retryable(_WATCH_ROOM, req), dl, open_call)
        return RoomWatch(self._c, s, room, timeout)

    def wait_room(self, room: int, *phases: "common_pb2.RoomPhase.ValueType", timeout: Optional[float] = None) -> rooms_pb2.Room:
        """Watches a room until it reached one of ``phases`` (a phase it went
        through before the call counts: the watch replays the timeline) and
        returns its state as of that event. With no phases it waits for the
        room's end. A room that fails first raises RoomFailedError (unless
        ROOM_PHASE_FAILED is among phases); one released first
        FailedPreconditionError; after a daemon restart,
        IncarnationChangedError."""
        op = "WaitRoom"
        with self.watch_room(room, history=True, timeout=timeout) as w:
            while True:
                ev = w.next()
                if ev is None:
                    raise local_error(op, grpc.StatusCode.INTERNAL, f"room {room}: the watch ended without a terminal event")
                done, r = _wait_step(room, ev, phases)
                if done:
                    assert r is not None
                    return r

    def release_room(self, room: int, *, timeout: Optional[float] = None) -> rooms_pb2.ReleaseRoomResponse:
        """ReleaseRoom: a succeeded room's pages and slots go back;
        idempotent (``already_released``). FailedPreconditionError: the room
        has not succeeded (abort it instead). Under Transport.STREAMS it
        rides open_and_wait's shared session when one is up, with the same
        answers. Retried on UNAVAILABLE."""
        got = self._on_session("ReleaseRoom", "release.", timeout, lambda s: s.release_async(room))
        if got is not None:
            return got.release
        return self._c._invoke(_RELEASE_ROOM, self._c._rooms_stub.ReleaseRoom, rooms_pb2.ReleaseRoomRequest(room=room), timeout)

    def abort_room(self, room: int, reason: str = "", *, timeout: Optional[float] = None) -> rooms_pb2.AbortRoomResponse:
        """AbortRoom: fails a room in any phase with "Aborted by AbortReq."
        (or ``reason``) and returns its resources; aborting an ended room is
        OK (``already_terminal``). NotFoundError for an unknown room. Rides
        the shared session as release_room does. Retried on UNAVAILABLE."""
        got = self._on_session("AbortRoom", "abort.", timeout, lambda s: s.abort_async(room, reason))
        if got is not None:
            return got.abort
        req = rooms_pb2.AbortRoomRequest(room=room, reason=reason)
        return self._c._invoke(_ABORT_ROOM, self._c._rooms_stub.AbortRoom, req, timeout)

    def _on_session(self, op: str, prefix: str, timeout: Optional[float],
                    send: Callable[[EngineSession], Future[SessionResult]]) -> Optional[SessionResult]:
        """A one-room op on the shared session if one is up; None when there
        is none or it ended before the answer (the caller goes unary: both
        ops are idempotent)."""
        if self._c._transport is not Transport.STREAMS or self._c.closed:
            return None
        s = self._mux.live()
        if s is None:
            return None
        try:
            res = s._wait(op, send(s), self._c._deadline(timeout).remaining())
        except DecodeplaneError as e:
            if e._stream_end:
                return None
            raise with_op(op, e) from None
        if res.error is not None:
            raise with_op(op, unprefix(res.error, prefix))
        return res

    def report_running(self, rooms: RunningRooms, *, timeout: Optional[float] = None) -> rooms_pb2.ReportRunningResponse:
        """ReportRunning: the running rooms' output lengths (a mapping room ->
        output_len, RunningUsage messages, or the request); the ledger grows
        their allocations and returns the new pages, and lists the rooms that
        could not grow. Never retried: report absolute lengths again on the
        engine's next step instead."""
        if isinstance(rooms, rooms_pb2.ReportRunningRequest):
            req = rooms
        elif isinstance(rooms, Mapping):
            req = rooms_pb2.ReportRunningRequest(
                rooms=[rooms_pb2.RunningUsage(room=r, output_len=n) for r, n in rooms.items()])
        else:
            req = rooms_pb2.ReportRunningRequest(rooms=list(rooms))
        return self._c._invoke(_REPORT_RUNNING, self._c._rooms_stub.ReportRunning, req, timeout)

    def retract_room(self, room: int, mode: "rooms_pb2.RetractMode.ValueType" = rooms_pb2.RETRACT_MODE_RETRACT, *,
                     timeout: Optional[float] = None) -> rooms_pb2.RetractRoomResponse:
        """RetractRoom: takes a running room's pages back (RETRACT_MODE_RETRACT:
        the engine keeps a CPU copy; RETRACT_MODE_REBOOTSTRAP: held until
        continue_generation). FailedPreconditionError: the room is not
        running. Never retried."""
        req = rooms_pb2.RetractRoomRequest(room=room, mode=mode)
        return self._c._invoke(_RETRACT_ROOM, self._c._rooms_stub.RetractRoom, req, timeout)

    def continue_generation(self, *, timeout: Optional[float] = None) -> rooms_pb2.ContinueGenerationResponse:
        """ContinueGeneration: re-enqueues every held (REBOOTSTRAP) room as a
        new attempt; ``resumed`` gives, per room, the prefill's generate_url
        and pinned DP rank for the recompute. Never retried."""
        return self._c._invoke(_CONTINUE_GENERATION, self._c._rooms_stub.ContinueGeneration,
                               rooms_pb2.ContinueGenerationRequest(), timeout)

    def resync(self, rooms: Sequence[rooms_pb2.ResyncRoom], *, done: bool = True,
               timeout: Optional[float] = None) -> rooms_pb2.ResyncResponse:
        """Resync: after a daemon restart, re-declares the rooms the engine
        still runs (with kv_pool.owner: engine, the hand-offs still in
        flight: :func:`in_flight`), in calls of at most 4,096 rooms, the last
        with ``done`` (then the daemon admits); returns the last answer.
        ``done=False`` leaves the wait open: when several engines share the
        daemon (decode DP shards in their own processes) none of them knows
        it is the last, and the daemon's engine.resync_timeout ends the wait.
        A call refused part-way (the error names ``rooms[i]`` of that call)
        stops it; the rooms before stay adopted. FailedPreconditionError:
        admission has already started. Never retried."""
        dl = self._c._deadline(timeout)
        start = 0
        while True:
            end = min(start + MAX_RESYNC_ROOMS, len(rooms))
            final = end == len(rooms)
            req = rooms_pb2.ResyncRequest(rooms=list(rooms[start:end]), done=final and done)
            resp = self._c._invoke(_RESYNC, self._c._rooms_stub.Resync, req, deadline=dl)
            if final:
                return resp
            start = end

    def declare_destination(self, request: Optional[rooms_pb2.DeclareDestinationRequest] = None, *,
                            timeout: Optional[float] = None, **fields: Any) -> rooms_pb2.DeclareDestinationResponse:
        """DeclareDestination (kv_pool.owner: engine): the destination the
        engine allocated for a room that waits in ROOM_PHASE_QUEUED — its
        pages beyond the decode prefix in token order (``page_indices``), its
        metadata row (``metadata_slot``), its state indices (``state``) and
        ``decode_prefix_len`` (a DeclareDestinationRequest, or its fields as
        keywords). The room is admitted into them. Errors:
        PageHeldError (a FailedPreconditionError: a page, row or slot is
        still held by another room's hand-off; ``what``, ``index``,
        ``holder``, ``draining`` name it: reuse it only once the holder's
        last event says its pages are reusable); FailedPreconditionError
        (the daemon owns the pages, the room does not wait for a
        destination); InvalidArgumentError naming the field; NotFoundError.
        A repeated declaration answers ``already``. Under Transport.STREAMS
        it rides open_and_wait's shared session when one is up (a refusal
        there carries no ErrorInfo: the call asks the unary RPC once more
        for the typed refusal; a refused declaration changed nothing).
        Retried on UNAVAILABLE."""
        req = build(rooms_pb2.DeclareDestinationRequest, request, fields)
        try:
            got = self._on_session("DeclareDestination", "declare.", timeout, lambda s: s.declare_async(req))
        except FailedPreconditionError:
            got = None
        if got is not None:
            assert got.declare is not None
            return got.declare
        return self._c._invoke(_DECLARE, self._c._rooms_stub.DeclareDestination, req, timeout)

    def report_capacity(self, request: Optional[capacity_pb2.ReportCapacityRequest] = None, *,
                        timeout: Optional[float] = None, **fields: Any) -> capacity_pb2.ReportCapacityResponse:
        """ReportCapacity (kv_pool.owner: engine): what the engine has free on
        one decode DP shard (a ReportCapacityRequest, or its fields:
        ``decode_dp_rank``, ``tokens_free``, ``pages_free``,
        ``req_slots_free``, ``metadata_slots_free``, ``state_slots_free``,
        ``queue_depth``, ``running``). Routers then read these figures from
        the daemon (WatchCapacity, etcd, metrics); each report replaces the
        last. FailedPreconditionError: the daemon owns the pages;
        InvalidArgumentError naming the field. Retried on UNAVAILABLE."""
        req = build(capacity_pb2.ReportCapacityRequest, request, fields)
        return self._c._invoke(_REPORT_CAPACITY, self._c._capacity_stub.ReportCapacity, req, timeout)

    def register_engine_layout(self, request: Optional[engine_layout_pb2.RegisterEngineLayoutRequest] = None, *,
                               timeout: Optional[float] = None,
                               **fields: Any) -> engine_layout_pb2.RegisterEngineLayoutResponse:
        """RegisterEngineLayout (kv_pool.owner: engine): the buffers the
        decode engine keeps one decode rank's rooms in — per layer its K and
        V buffers with their item lengths, its aux buffers with their row
        lengths and the marker column, its state buffers, and where each
        one's bytes live (a RegisterEngineLayoutRequest, or its fields).
        Register every TP rank's layout of a decode DP shard before declaring
        a destination there; the answer's ``layout_id`` names it in
        destinations, and the same layout again answers ``already``.
        InvalidArgumentError names the field (a buffer missing or of the
        wrong size for kv_pool); FailedPreconditionError: the daemon owns the
        pages, staging is on, a different layout while hand-offs of the
        shard hold pages, copies into the rank's old buffers still in flight
        (a restarted engine registering again: retry once they completed),
        or the transfer agent refused the buffers;
        UnavailableError: the agent is unreachable. Retried on UNAVAILABLE."""
        req = build(engine_layout_pb2.RegisterEngineLayoutRequest, request, fields)
        return self._c._invoke(_REGISTER_LAYOUT, self._c._rooms_stub.RegisterEngineLayout, req, timeout)

    def lookup_dp_ranks(self, bootstrap_addr: str, rooms: Iterable[int] = (),
                        hints: Union[Mapping[int, int], Iterable[bootstrap_pb2.RoomHint]] = (), *,
                        timeout: Optional[float] = None) -> bootstrap_pb2.LookupDPRanksResponse:
        """LookupDPRanks: resolves rooms to the prefill's DP ranks in SGLang's
        order (hint, dp_size == 1, room % dp_size under follow_bootstrap_room,
        binding); rooms it cannot resolve are listed as unresolved.
        ``hints`` maps room -> the router's DP rank hint. Retried on UNAVAILABLE."""
        hs = ([bootstrap_pb2.RoomHint(room=r, dp_rank=d) for r, d in hints.items()] if isinstance(hints, Mapping)
              else list(hints))
        req = bootstrap_pb2.LookupDPRanksRequest(bootstrap_addr=bootstrap_addr, rooms=list(rooms), hints=hs)
        return self._c._invoke(_LOOKUP_DP_RANKS, self._c._boot_stub.LookupDPRanks, req, timeout)

    # ---- the session ----

    def session(self, *, events: "engine_session_pb2.EngineEvents.ValueType" = ENGINE_EVENTS_ALL,
                timeout: Optional[float] = None) -> EngineSession:
        """Opens an :class:`EngineSession` (not re-opened by itself).
        ``events``: ENGINE_EVENTS_ALL (every event of each room) or
        ENGINE_EVENTS_OUTCOME (only its outcome: its SUCCEEDED event, or its
        terminal event if it fails first). ``timeout`` bounds the whole
        stream. Needs the token when the daemon has one."""
        return EngineSession(self._c, events=events, timeout=timeout)

    # ---- open_and_wait ----

    def open_and_wait(self, request: Optional[rooms_pb2.OpenRoomRequest] = None, *, timeout: Optional[float] = None,
                      **fields: Any) -> rooms_pb2.Room:
        """Opens a room and waits until its KV landed: returns the room at
        ROOM_PHASE_SUCCEEDED (the engine then owns its pages until
        release_room). A room that fails raises RoomFailedError; a refused
        open raises OpenRoom's typed error (code, message, retry_after, the
        field names without the session's prefix); after a daemon restart,
        IncarnationChangedError. ``timeout`` bounds the whole wait; when it
        passes the room is left as it is (abort it if it is not wanted). It
        is also the request's time budget: each open carries what it leaves
        (``OpenRoomRequest.timeout``, less a reserve for the answer's way
        back: a twentieth, at most 100 ms), so that a room the daemon cannot
        hand off in time raises RoomFailedError
        (FAILURE_CODE_DEADLINE_EXCEEDED, naming the phase that used the
        budget) before ``timeout`` passes; a shorter timeout of the request's
        own is kept.

        Under Transport.STREAMS the room travels on the client's shared
        engine session (see the module documentation). An open whose answer
        a session's end lost is sent again only with an idempotency key (or
        ``auto_idempotency_key``); without one the call raises
        UnavailableError (the room may be open), never opening it twice. A
        room another open_and_wait of this client waits on goes the unary
        way. Under Transport.UNARY: open_room, then wait_room."""
        req = self._keyed(build(rooms_pb2.OpenRoomRequest, request, fields))
        dl = Deadline(timeout)
        if self._c._transport is not Transport.STREAMS or time.monotonic() < self._mux.unary_until:
            return self._open_and_wait_unary(req, dl)
        return self._open_and_wait_stream(req, dl)

    def _open_and_wait_unary(self, req: rooms_pb2.OpenRoomRequest, dl: Deadline) -> rooms_pb2.Room:
        resp = self._c._invoke(_OPEN_ROOM, self._c._rooms_stub.OpenRoom, with_deadline(req, dl), deadline=dl)
        if resp.room.phase == _SUCCEEDED:
            return resp.room
        return self.wait_room(resp.room.room, _SUCCEEDED, timeout=dl.remaining())

    def _open_and_wait_stream(self, req: rooms_pb2.OpenRoomRequest, dl: Deadline) -> rooms_pb2.Room:
        op = "OpenRoom"
        self._c._check_open(op)
        m = self._mux
        w = m.join(req.room)
        if w is None:
            return self._open_and_wait_unary(req, dl)
        try:
            keyed = bool(req.idempotency_key)
            attempt = 1
            while True:
                try:
                    s = m.acquire(dl)
                except DecodeplaneError as e:
                    raise with_op(op, e) from None
                m.attach(w, s)
                fut: Optional[Future[Any]] = None
                res: Optional[SessionResult] = None
                err: Optional[DecodeplaneError] = None
                try:
                    fut = s.open_async([with_deadline(req, dl)])
                    res = s._wait(op, fut, dl.remaining())[0]
                except DecodeplaneError as e:
                    err = e
                if err is None and res is not None and res.error is None:
                    with w.cond:
                        w.opened, w.inc = True, res.incarnation
                    assert res.open is not None
                    room = res.open.room
                    break
                with w.cond:
                    if w.sess is s:
                        w.sess = None
                    s._unsubscribe(w.room, w)
                if err is None:
                    # The daemon's answer: retried as the unary OpenRoom would be.
                    assert res is not None and res.error is not None
                    e = with_op(op, unprefix(res.error, "open.rooms[0]."))
                    d = self._c._retry.retry_delay(e, attempt) if keyed and attempt < self._c._retry.max_attempts else None
                    if d is None:
                        raise e
                    wait_retry(op, d, e, dl, self._c._closed)
                    attempt += 1
                    continue
                if not err._stream_end:
                    raise with_op(op, err)  # the caller's deadline, the op refused as a whole
                if self._c.closed:
                    raise local_error(op, grpc.StatusCode.CANCELLED, "the client is closed")
                e = with_op(op, err)
                if isinstance(e, UnimplementedError):
                    # An older daemon: the stream was refused before any op ran.
                    m.unary_until = time.monotonic() + UNARY_FALLBACK
                    m.leave(w)
                    return self._open_and_wait_unary(req, dl)
                if not _transient_end(e):
                    raise e
                sent = fut is not None and 0 < _op_seq(fut) <= s._outbox.last_written
                if sent and not keyed:
                    raise local_error(op, grpc.StatusCode.UNAVAILABLE,
                                      f"the engine session ended before the open's answer ({e.message}): room {req.room} "
                                      "may be open; open_and_wait retries only an open with an idempotency key "
                                      "(or auto_idempotency_key)")
                if attempt >= self._c._retry.max_attempts:
                    raise e
                wait_retry(op, self._c._retry.backoff(attempt), e, dl, self._c._closed)
                attempt += 1
            if room.phase == _SUCCEEDED:
                return room
            return self._wait_stream(w, dl)
        finally:
            m.leave(w)

    def _wait_stream(self, w: _Waiter, dl: Deadline) -> rooms_pb2.Room:
        op = "WatchRoom"
        room = w.room
        with w.cond:
            inc = w.inc
        failures = 0
        while True:
            with w.cond:
                evs, w.evs = w.evs, []
                sess, lost, failed = w.sess, w.lost_err, w.failed
                if not evs and failed is None and not (sess is None and lost is not None):
                    rem = dl.remaining()
                    if rem is not None and rem <= 0:
                        raise local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED, f"room {room}: deadline exceeded waiting for its KV")
                    w.cond.wait(rem)
                    continue
            for ev in evs:
                e = ev.event
                if e.incarnation:
                    if not inc:
                        inc = e.incarnation
                    elif e.incarnation != inc:
                        raise IncarnationChangedError(room=room, old=inc, new=e.incarnation, watch=True, op=op)
                failures = 0
                done, r = _wait_step(room, e, (_SUCCEEDED,))
                if done:
                    assert r is not None
                    return r
            if failed is not None:
                # As RoomWatch: a room the daemon does not know after a
                # restart is the restart's loss.
                if inc and isinstance(failed, NotFoundError):
                    try:
                        st = self._c.admin.status(timeout=dl.cap(10.0))
                    except DecodeplaneError:
                        raise failed from None
                    if st.incarnation and st.incarnation != inc:
                        raise IncarnationChangedError(room=room, old=inc, new=st.incarnation, watch=True, op=op,
                                                      cause=failed)
                raise failed
            if sess is None and lost is not None:
                failures = self._reattach(w, lost, failures, dl)

    def _reattach(self, w: _Waiter, lost: BaseException, failures: int, dl: Deadline) -> int:
        """Gets a session again for a room whose session ended with ``lost``:
        after a backoff, acquire (whose dial resumes the room). Raises what
        ends the wait: a permanent end, the attempts exhausted, the deadline
        or the client's close."""
        op = "WatchRoom"
        while True:
            self._c._check_open(op)
            e = (local_error(op, grpc.StatusCode.UNAVAILABLE, "the engine session ended") if lost is _OK_END
                 else with_op(op, lost) if isinstance(lost, DecodeplaneError)
                 else local_error(op, grpc.StatusCode.UNAVAILABLE, str(lost)))
            failures += 1
            if not _transient_end(e) or failures >= self._c._retry.max_attempts:
                raise e
            d = e.retry_after if e.retry_after is not None else self._c._retry.backoff(failures)
            wait_retry(op, d, e, dl, self._c._closed)
            try:
                s = self._mux.acquire(dl)
            except DecodeplaneError as err:
                lost = err
                continue
            with w.cond:
                resumed = w.sess is not None or w.failed is not None
                cursor = w.seq
            if resumed:  # the dial (this call's or another's) resumed it
                return failures
            # Detached after the dial collected its rooms: resume it alone.
            self._mux.attach(w, s)
            if s.done:
                lost = s._end or _OK_END
                continue
            self._mux.resume(s, {w.room: cursor})
            return failures
