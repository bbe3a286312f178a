"""The decode engine's multiplexed stream (:class:`EngineSession`), opened
with :meth:`decodeplane.engine.EngineAPI.session`.

An EngineSession.Session stream carries batches of opens, releases, aborts,
resumes, declarations (DeclareDestination) and capacity reports
(ReportCapacity) as ops on one stream, and the events of every room it
subscribed. Each op gets exactly one reply (matched by its seq); each
room's events come in order, up to the room's last event: the one with
``pages_reusable`` set (its terminal event, or, for a room that failed
while a prefill rank could still write into its pages, the event after it
once they are reusable), or, with ENGINE_EVENTS_OUTCOME, a succeeded
room's outcome. The session has one writer (gRPC's sending thread consumes
its send queue: the ops queued while a message was being written go out
packed in the next one, ``EngineRequest.more``, once the daemon's response
header said it reads them) and one reader thread, which resolves the ops'
futures and hands each room's events to its subscriber
(:meth:`EngineSession.subscribe`) or, for rooms without one, to
:meth:`EngineSession.next`. Read the events: a session whose events are
left unread stops reading the stream, and the daemon cuts it past 4,096
queued messages (ResourceExhaustedError "slow consumer"). Its rooms go on:
open a new session and ``resume(old.cursors())``. A session opened this way
is not re-opened by itself.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

import grpc

from decodeplane._core import MAX_REQUESTS_PER_MESSAGE, PACK_KEY, PACK_MORE, ClosableQueue, Outbox, log
from decodeplane.errors import (
    DecodeplaneError,
    from_rpc_error,
    local_error,
    make_error,
    status_code,
    with_op,
)
from decodeplane.v1 import capacity_pb2, common_pb2, engine_session_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["EngineSession", "SessionResult", "RoomSubscription", "ENGINE_EVENTS_ALL", "ENGINE_EVENTS_OUTCOME",
           "MAX_ENGINE_OPEN_ROOMS", "MAX_ENGINE_WATCH_ROOMS", "SESSION_EVENTS", "last_event"]

ENGINE_EVENTS_ALL = engine_session_pb2.ENGINE_EVENTS_ALL
ENGINE_EVENTS_OUTCOME = engine_session_pb2.ENGINE_EVENTS_OUTCOME
#: Rooms per Open op.
MAX_ENGINE_OPEN_ROOMS = 256
#: Rooms per Watch op.
MAX_ENGINE_WATCH_ROOMS = 4096
#: Room events a session holds that nobody read; beyond, it stops reading the stream.
SESSION_EVENTS = 256

_SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED


def last_event(ev: rooms_pb2.RoomEvent, events: "engine_session_pb2.EngineEvents.ValueType" = ENGINE_EVENTS_ALL) -> bool:
    """Whether ``ev`` is its room's last event on a stream subscribed with
    ``events``: the event with ``pages_reusable`` (after it no prefill rank
    writes into the room's pages), or, with ENGINE_EVENTS_OUTCOME, a
    succeeded room's outcome."""
    if ev.pages_reusable:
        return True
    return events == ENGINE_EVENTS_OUTCOME and ev.transition.phase == _SUCCEEDED


_OK_END = object()  # the stream ended OK


@dataclass
class SessionResult:
    """One room's answer to a session op: what its unary RPC would have
    answered (``open``, ``release``, ``abort``, ``declare`` or ``capacity``,
    by the op; ``room`` is 0 for a capacity report), or ``error``,
    a typed error with the unary RPC's code and message (the field names
    prefixed with the op's path, ``"open.rooms[3].prompt_len"``;
    ``retry_after`` set when the daemon gave a delay)."""

    room: int
    open: Optional[rooms_pb2.OpenRoomResponse] = None
    release: Optional[rooms_pb2.ReleaseRoomResponse] = None
    abort: Optional[rooms_pb2.AbortRoomResponse] = None
    declare: Optional[rooms_pb2.DeclareDestinationResponse] = None
    capacity: Optional[capacity_pb2.ReportCapacityResponse] = None
    error: Optional[DecodeplaneError] = None
    #: The daemon's incarnation as the op's reply gave it.
    incarnation: int = 0


class _Sink:
    """A room's subscriber on a session (called from its reader thread)."""

    def deliver(self, session: "EngineSession", ev: engine_session_pb2.EngineRoomEvent) -> None:  # pragma: no cover
        raise NotImplementedError

    def lost(self, session: "EngineSession", err: BaseException) -> None:  # pragma: no cover
        raise NotImplementedError


class RoomSubscription(_Sink):
    """The events of one room of an :class:`EngineSession`, in order
    (:meth:`EngineSession.subscribe`). Read it from one thread."""

    def __init__(self, session: "EngineSession", room: int) -> None:
        self.room = room
        self._s = session
        self._q: ClosableQueue[engine_session_pb2.EngineRoomEvent] = ClosableQueue()
        self._end: Optional[BaseException] = None
        self._finished = False

    def deliver(self, session: "EngineSession", ev: engine_session_pb2.EngineRoomEvent) -> None:
        self._q.put(ev)

    def lost(self, session: "EngineSession", err: BaseException) -> None:
        self._end = err
        self._q.close()

    def next(self, timeout: Optional[float] = None) -> Optional[engine_session_pb2.EngineRoomEvent]:
        """The room's next event; None after its last (the one with
        ``pages_reusable``, or a succeeded room's outcome with
        ENGINE_EVENTS_OUTCOME: :func:`last_event`). Raises the session's end when
        it ended before, TimeoutError when ``timeout`` passes first."""
        if self._finished:
            return None
        try:
            ev = self._q.get(timeout)
        except ClosableQueue.Closed:
            if self._end is None or self._end is _OK_END:
                return None
            raise self._end from None
        if self._s._consumed(ev):
            self._finished = True
            self._s._unsubscribe(self.room, self)
        return ev

    def __iter__(self) -> Iterator[engine_session_pb2.EngineRoomEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev


class _FuncSink(_Sink):
    """A room's events handed to a function on the reader thread."""

    def __init__(self, room: int, on_event: Callable[[engine_session_pb2.EngineRoomEvent], None],
                 on_lost: Optional[Callable[[Optional[BaseException]], None]]) -> None:
        self.room = room
        self._on_event = on_event
        self._on_lost = on_lost

    def deliver(self, session: "EngineSession", ev: engine_session_pb2.EngineRoomEvent) -> None:
        if session._consumed(ev):
            session._unsubscribe(self.room, self)
        self._on_event(ev)

    def lost(self, session: "EngineSession", err: BaseException) -> None:
        if self._on_lost is not None:
            self._on_lost(None if err is _OK_END else err)


class EngineSession:
    """The decode engine's multiplexed stream (EngineSession.Session); see
    the module documentation. Build it with :meth:`EngineAPI.session`.

    Ops (:meth:`open`, :meth:`release`, :meth:`abort`, :meth:`resume`,
    :meth:`declare`, :meth:`capacity` and their ``*_async`` forms, which return a :class:`concurrent.futures.Future`
    resolved by the reader thread) may be called from any thread;
    :meth:`next` from one. Futures' callbacks run on the reader thread:
    keep them short. A request handed to an op must not be modified until
    the op was answered.
    """

    def __init__(self, client: "Client", *, events: "engine_session_pb2.EngineEvents.ValueType" = ENGINE_EVENTS_ALL,
                 timeout: Optional[float] = None) -> None:
        self.op = "EngineSession"
        client._check_open(self.op)
        self._c = client
        self.events = events
        self._lock = threading.Lock()
        self._seq = 0
        self._pending: dict[int, tuple[Future[Any], Callable[[engine_session_pb2.EngineReply], Any]]] = {}
        self._cursors: dict[int, int] = {}
        self._subs: dict[int, _Sink] = {}
        self._queue: ClosableQueue[engine_session_pb2.EngineRoomEvent] = ClosableQueue(SESSION_EVENTS)
        self._end: Optional[BaseException] = None  # _OK_END, or the stream's error; None while live
        self._done = threading.Event()
        self._closing = False
        self.incarnation = 0
        self._outbox: Outbox[engine_session_pb2.EngineRequest] = Outbox()
        self._call = client._engine_session_stub.Session(iter(self._outbox), metadata=client._metadata(pack=True),
                                                         timeout=timeout)
        self._reader = threading.Thread(target=self._read, name="decodeplane-engine-session", daemon=True)
        self._reader.start()

    # ---- reader ----

    def _read(self) -> None:
        end: BaseException = _OK_END  # type: ignore[assignment]
        try:
            md = self._call.initial_metadata() or ()
            if any(k == PACK_KEY and v == PACK_MORE for k, v in md):
                self._outbox.set_max(1 + MAX_REQUESTS_PER_MESSAGE)
            for ev in self._call:
                self._dispatch(ev)
                for m in ev.more:
                    self._dispatch(m)
        except grpc.RpcError as e:
            end = from_rpc_error(self.op, e)
            if self._closing:
                end = local_error(self.op, grpc.StatusCode.CANCELLED, "the session is closed")
        except BaseException as e:  # noqa: BLE001 - a bug in a callback must not leave ops hanging
            log.exception("engine session reader failed")
            end = local_error(self.op, grpc.StatusCode.INTERNAL, f"the session's reader failed: {e!r}")
            self._call.cancel()
        self._finish(end)

    def _finish(self, end: BaseException) -> None:
        with self._lock:
            self._end = end
            pending = list(self._pending.values())
            self._pending.clear()
            subs = list(self._subs.values())
            self._subs.clear()
        self._outbox.abort()
        for fut, _ in pending:
            fut.set_exception(self._ended_error(self.op))
        for s in subs:
            s.lost(self, end)
        self._queue.close()
        self._done.set()

    def _dispatch(self, ev: engine_session_pb2.EngineEvent) -> None:
        which = ev.WhichOneof("event")
        if which == "reply":
            r = ev.reply
            with self._lock:
                entry = self._pending.pop(r.seq, None)
                if r.incarnation:
                    self.incarnation = r.incarnation
                # A room an Open subscribed has a cursor from now on (0: no
                # event seen), so that resume(cursors()) on another session
                # watches it even before an event.
                for res in r.results:
                    if res.HasField("open") and res.code == 0:
                        self._cursors.setdefault(res.room, 0)
            if entry is not None:
                fut, convert = entry
                try:
                    fut.set_result(convert(r))
                except DecodeplaneError as e:
                    fut.set_exception(e)
        elif which == "room":
            rev = ev.room
            with self._lock:
                sink = self._subs.get(rev.room)
            if sink is not None:
                sink.deliver(self, rev)
            else:
                self._queue.put(rev)

    def _consumed(self, ev: engine_session_pb2.EngineRoomEvent) -> bool:
        """Records what a reader took; True when it is the room's last event."""
        last = last_event(ev.event, self.events)
        with self._lock:
            if last:
                self._cursors.pop(ev.room, None)
            else:
                self._cursors[ev.room] = ev.seq
        return last

    def _ended_error(self, op: str) -> DecodeplaneError:
        end = self._end
        if end is _OK_END or end is None:
            e = local_error(op, grpc.StatusCode.UNAVAILABLE, "the engine session ended")
        else:
            assert isinstance(end, DecodeplaneError)
            e = with_op(op, end) if end.op != op else make_error(op, end.code(), end.message, reason=end.reason,
                                                                  domain=end.domain, error_metadata=end.error_metadata,
                                                                  retry_after=end.retry_after)
        e._stream_end = True
        return e

    # ---- subscriptions ----

    def subscribe(self, room: int) -> RoomSubscription:
        """Hands the room's events to a :class:`RoomSubscription` instead of
        :meth:`next`. Subscribe before the op that subscribes the room on
        the stream (open, resume), or events may already have gone to
        :meth:`next`."""
        sub = RoomSubscription(self, room)
        self._subscribe(room, sub)
        return sub

    def listen(self, room: int, on_event: Callable[[engine_session_pb2.EngineRoomEvent], None],
               on_lost: Optional[Callable[[Optional[BaseException]], None]] = None) -> Callable[[], None]:
        """Hands the room's events to ``on_event``, called on the session's
        reader thread in order up to the room's last event (then the room is
        unsubscribed), and the session's end before that to ``on_lost`` (the
        stream's error; None when it ended OK). Keep both short: they hold up
        every room's events. Listen before the op that subscribes the room on the
        stream (open, resume). Returns the function that stops listening."""
        sink = _FuncSink(room, on_event, on_lost)
        self._subscribe(room, sink)
        return lambda: self._unsubscribe(room, sink)

    def _subscribe(self, room: int, sink: _Sink) -> None:
        with self._lock:
            end = self._end
            if end is None:
                self._subs[room] = sink
        if end is not None:
            sink.lost(self, end)

    def _unsubscribe(self, room: int, sink: _Sink) -> None:
        with self._lock:
            if self._subs.get(room) is sink:
                del self._subs[room]

    # ---- ops ----

    def _submit(self, op: str, req: engine_session_pb2.EngineRequest,
                convert: Callable[[engine_session_pb2.EngineReply], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        ended: list[BaseException] = []

        def add() -> bool:
            with self._lock:
                if self._end is not None:
                    ended.append(self._end)
                    return False
                self._seq += 1
                req.seq = self._seq
                self._pending[req.seq] = (fut, convert)
                setattr(fut, "_decodeplane_seq", req.seq)
                return True

        if not self._outbox.push(req, add):
            if not ended and self._end is None:
                raise local_error(op, grpc.StatusCode.FAILED_PRECONDITION,
                                  "the session's sending side is closed (close_send)")
            raise self._ended_error(op)
        return fut

    def _results(self, op: str) -> Callable[[engine_session_pb2.EngineReply], list[SessionResult]]:
        def convert(reply: engine_session_pb2.EngineReply) -> list[SessionResult]:
            if reply.code != 0:
                raise make_error(op, status_code(reply.code), reply.message)
            out = []
            for r in reply.results:
                res = SessionResult(room=r.room, incarnation=reply.incarnation)
                which = r.WhichOneof("answer")
                if which == "open":
                    res.open = r.open
                elif which == "release":
                    res.release = r.release
                elif which == "abort":
                    res.abort = r.abort
                elif which == "declare":
                    res.declare = r.declare
                elif which == "capacity":
                    res.capacity = r.capacity
                if r.code != 0:
                    retry = None
                    if r.HasField("retry_after"):
                        retry = max(r.retry_after.seconds + r.retry_after.nanos / 1e9, 0.0)
                    res.error = make_error(op, status_code(r.code), r.message, retry_after=retry)
                out.append(res)
            return out
        return convert

    def _wait(self, op: str, fut: Future[Any], timeout: Optional[float]) -> Any:
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED,
                              "deadline exceeded waiting for the session's reply") from None

    def open_async(self, requests: Sequence[rooms_pb2.OpenRoomRequest],
                   traceparents: Sequence[str] = ()) -> Future[list[SessionResult]]:
        """Opens a batch of rooms (1..256), each as OpenRoom, and subscribes
        them: their events come until each one's terminal event (with
        ENGINE_EVENTS_OUTCOME, its outcome). ``traceparents`` are the rooms'
        W3C trace contexts (empty, or one per room). The future's result is
        one SessionResult per request, in order; its exception is the op's
        refusal as a whole (InvalidArgumentError) or the session's end."""
        o = engine_session_pb2.EngineOpen(rooms=list(requests), events=self.events, traceparents=list(traceparents))
        return self._submit("EngineSession.Open", engine_session_pb2.EngineRequest(open=o),
                            self._results("EngineSession.Open"))

    def open(self, requests: Sequence[rooms_pb2.OpenRoomRequest], *, traceparents: Sequence[str] = (),
             timeout: Optional[float] = None) -> list[SessionResult]:
        """:meth:`open_async`, waiting for the reply (at most ``timeout``)."""
        return self._wait("EngineSession.Open", self.open_async(requests, traceparents), timeout)

    def _one(self, op: str, req: engine_session_pb2.EngineRequest) -> Future[SessionResult]:
        many = self._results(op)

        def convert(reply: engine_session_pb2.EngineReply) -> SessionResult:
            res = many(reply)
            if len(res) != 1:
                raise local_error(op, grpc.StatusCode.INTERNAL, f"the daemon answered {len(res)} results for one room")
            return res[0]
        return self._submit(op, req, convert)

    def release_async(self, room: int) -> Future[SessionResult]:
        """ReleaseRoom on the session; the future's result is the room's SessionResult."""
        return self._one("EngineSession.Release",
                         engine_session_pb2.EngineRequest(release=rooms_pb2.ReleaseRoomRequest(room=room)))

    def release(self, room: int, *, timeout: Optional[float] = None) -> rooms_pb2.ReleaseRoomResponse:
        """ReleaseRoom on the session: its answer, or its typed error."""
        res = self._wait("EngineSession.Release", self.release_async(room), timeout)
        if res.error is not None:
            raise res.error
        return res.release

    def abort_async(self, room: int, reason: str = "") -> Future[SessionResult]:
        """AbortRoom on the session; the future's result is the room's SessionResult."""
        return self._one("EngineSession.Abort",
                         engine_session_pb2.EngineRequest(abort=rooms_pb2.AbortRoomRequest(room=room, reason=reason)))

    def abort(self, room: int, reason: str = "", *, timeout: Optional[float] = None) -> rooms_pb2.AbortRoomResponse:
        """AbortRoom on the session: its answer, or its typed error."""
        res = self._wait("EngineSession.Abort", self.abort_async(room, reason), timeout)
        if res.error is not None:
            raise res.error
        return res.abort

    def resume(self, cursors: Mapping[int, int], *, timeout: Optional[float] = None) -> list[SessionResult]:
        """Subscribes rooms on this session from the event after the given
        seq (another session's :meth:`cursors`, or 0 for a room's whole
        timeline): each room's missed events, then its live ones, none
        twice. Rooms go in order of their ids, at most 4,096 per op; one
        SessionResult per room (NotFoundError: the room is gone, e.g. the
        daemon restarted)."""
        rooms = sorted(cursors)
        out: list[SessionResult] = []
        for i in range(0, len(rooms), MAX_ENGINE_WATCH_ROOMS):
            fut = self.resume_async({r: cursors[r] for r in rooms[i:i + MAX_ENGINE_WATCH_ROOMS]})
            out.extend(self._wait("EngineSession.Resume", fut, timeout))
        return out

    def resume_async(self, cursors: Mapping[int, int]) -> Future[list[SessionResult]]:
        """One Watch op of :meth:`resume` (1..4,096 rooms, in order of their
        ids); the future's result is one SessionResult per room."""
        w = engine_session_pb2.EngineWatch(events=self.events, rooms=[
            engine_session_pb2.EngineWatchRoom(room=r, after=cursors[r]) for r in sorted(cursors)])
        return self._submit("EngineSession.Resume", engine_session_pb2.EngineRequest(watch=w),
                            self._results("EngineSession.Resume"))

    def declare_async(self, request: rooms_pb2.DeclareDestinationRequest) -> Future[SessionResult]:
        """DeclareDestination on the session (kv_pool.owner: engine); the
        future's result is the room's SessionResult (``declare``, or
        ``error``: a held page's refusal is a FailedPreconditionError whose
        message names the page and the holder; the session's result carries
        no ErrorInfo, so its ``reason`` is empty: the unary
        :meth:`decodeplane.engine.EngineAPI.declare_destination` gives the
        typed :class:`~decodeplane.PageHeldError`). The room is not
        subscribed by it."""
        return self._one("EngineSession.Declare", engine_session_pb2.EngineRequest(declare=request))

    def declare(self, request: rooms_pb2.DeclareDestinationRequest, *,
                timeout: Optional[float] = None) -> rooms_pb2.DeclareDestinationResponse:
        """DeclareDestination on the session: its answer, or its typed error."""
        res = self._wait("EngineSession.Declare", self.declare_async(request), timeout)
        if res.error is not None:
            raise res.error
        assert res.declare is not None
        return res.declare

    def capacity_async(self, request: capacity_pb2.ReportCapacityRequest) -> Future[SessionResult]:
        """ReportCapacity on the session (kv_pool.owner: engine); the future's
        result is a SessionResult for room 0 (``capacity`` or ``error``)."""
        return self._one("EngineSession.Capacity", engine_session_pb2.EngineRequest(capacity=request))

    def capacity(self, request: capacity_pb2.ReportCapacityRequest, *,
                 timeout: Optional[float] = None) -> capacity_pb2.ReportCapacityResponse:
        """ReportCapacity on the session: its answer, or its typed error."""
        res = self._wait("EngineSession.Capacity", self.capacity_async(request), timeout)
        if res.error is not None:
            raise res.error
        assert res.capacity is not None
        return res.capacity

    # ---- events ----

    def next(self, timeout: Optional[float] = None) -> Optional[engine_session_pb2.EngineRoomEvent]:
        """The next event of a room without a subscriber, in order per room.
        After the stream ended it returns the events still held, then None
        (the stream ended OK: half-closed with every room ended, or the
        daemon stopped) or raises the stream's error. TimeoutError when
        ``timeout`` passes first."""
        try:
            ev = self._queue.get(timeout)
        except ClosableQueue.Closed:
            self._done.wait()
            if self._end is _OK_END:
                return None
            assert self._end is not None
            raise self._end from None
        self._consumed(ev)
        return ev

    def __iter__(self) -> Iterator[engine_session_pb2.EngineRoomEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def cursors(self) -> dict[int, int]:
        """For every room opened or resumed here that has not ended, the last
        event seq read: what :meth:`resume` on a new session needs to send
        only what was missed."""
        with self._lock:
            return dict(self._cursors)

    # ---- lifecycle ----

    @property
    def done(self) -> bool:
        """Whether the stream ended."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for the stream's end; False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    @property
    def error(self) -> Optional[BaseException]:
        """Why the stream ended (None while it lives or after an OK end)."""
        end = self._end
        return None if end is None or end is _OK_END else end

    def close_send(self) -> None:
        """No more ops: the daemon ends the stream OK once every subscribed
        room ended (:meth:`next` then returns None)."""
        self._outbox.close()

    def close(self) -> None:
        """Ends the stream at once (the rooms go on) and waits for the reader."""
        self._closing = True
        self._call.cancel()
        self._outbox.abort()
        self._queue.close()
        if threading.current_thread() is not self._reader:
            self._reader.join()

    def __enter__(self) -> "EngineSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

