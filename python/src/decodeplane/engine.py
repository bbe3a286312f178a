"""The decode engine's view (:attr:`decodeplane.Client.engine`): rooms
(OpenRoom, WatchRoom, ReleaseRoom, AbortRoom, ReportRunning, RetractRoom,
ContinueGeneration, Resync, GetRoom, ListRooms), LookupDPRanks, the engine's
multiplexed stream (:class:`EngineSession`) and :meth:`EngineAPI.open_and_wait`.

The engine session
------------------

:meth:`EngineAPI.session` opens an EngineSession.Session stream: batches of
opens, releases, aborts and resumes as ops on one stream, and the events of
every room it subscribed. Each op gets exactly one reply (matched by its
seq); each room's events come in order. The session has one writer (gRPC's
sending thread consumes its send queue: the ops queued while a message was
being written go out packed in the next one, ``EngineRequest.more``, once
the daemon's response header said it reads them) and one reader thread,
which resolves the ops' futures and hands each room's events to its
subscriber (:meth:`EngineSession.subscribe`) or, for rooms without one, to
:meth:`EngineSession.next`. Read the events: a session whose events are
left unread stops reading the stream, and the daemon cuts it past 4,096
queued messages (ResourceExhaustedError "slow consumer"). Its rooms go on:
open a new session and ``resume(old.cursors())``. A session opened this way
is not re-opened by itself.

:meth:`EngineAPI.open_and_wait` uses one such session, shared by every call
of the client (Transport.STREAMS, the default), with
ENGINE_EVENTS_OUTCOME: each call opens its room as an op on it (concurrent
calls' opens are packed into one message) and waits for its room's outcome
event. When the session ends (a slow consumer cut, a daemon restart, the
network) the waiting calls back off under the retry policy and the next
attempt opens a new session and resumes their rooms from the last event
each saw. A daemon that does not serve EngineSession (UNIMPLEMENTED) gets
the unary path (OpenRoom, then WatchRoom) for a minute, then the session is
tried again.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import grpc

from decodeplane._core import (
    MAX_REQUESTS_PER_MESSAGE,
    PACK_KEY,
    PACK_MORE,
    ClosableQueue,
    Deadline,
    Outbox,
    Resumable,
    log,
    wait_retry,
    with_deadline,
)
from decodeplane.admin import RoomReads
from decodeplane.client import Transport, build, copy_of
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    InvalidArgumentError,
    NotFoundError,
    RoomFailedError,
    UnimplementedError,
    from_rpc_error,
    local_error,
    make_error,
    status_code,
    unprefix,
    with_op,
)
from decodeplane.retry import retryable
from decodeplane.streams import RoomWatch
from decodeplane.v1 import bootstrap_pb2, common_pb2, engine_session_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["EngineAPI", "EngineSession", "SessionResult", "RoomSubscription", "ENGINE_EVENTS_ALL",
           "ENGINE_EVENTS_OUTCOME", "MAX_ENGINE_OPEN_ROOMS", "MAX_ENGINE_WATCH_ROOMS", "MAX_RESYNC_ROOMS"]

ENGINE_EVENTS_ALL = engine_session_pb2.ENGINE_EVENTS_ALL
ENGINE_EVENTS_OUTCOME = engine_session_pb2.ENGINE_EVENTS_OUTCOME
#: Rooms per Open op.
MAX_ENGINE_OPEN_ROOMS = 256
#: Rooms per Watch op.
MAX_ENGINE_WATCH_ROOMS = 4096
#: Rooms per Resync call.
MAX_RESYNC_ROOMS = 4096
#: Room events a session holds that nobody read; beyond, it stops reading the stream.
SESSION_EVENTS = 256
#: How long open_and_wait stays on the unary path after an UNIMPLEMENTED EngineSession.
UNARY_FALLBACK = 60.0

_SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED
_FAILED = common_pb2.ROOM_PHASE_FAILED

_OPEN_ROOM = "/decodeplane.v1.Rooms/OpenRoom"
_WATCH_ROOM = "/decodeplane.v1.Rooms/WatchRoom"
_RELEASE_ROOM = "/decodeplane.v1.Rooms/ReleaseRoom"
_ABORT_ROOM = "/decodeplane.v1.Rooms/AbortRoom"
_REPORT_RUNNING = "/decodeplane.v1.Rooms/ReportRunning"
_RETRACT_ROOM = "/decodeplane.v1.Rooms/RetractRoom"
_CONTINUE_GENERATION = "/decodeplane.v1.Rooms/ContinueGeneration"
_RESYNC = "/decodeplane.v1.Rooms/Resync"
_LOOKUP_DP_RANKS = "/decodeplane.v1.Bootstrap/LookupDPRanks"

_OK_END = object()  # the stream ended OK


@dataclass
class SessionResult:
    """One room's answer to a session op: what its unary RPC would have
    answered (``open``, ``release`` or ``abort``, by the op), or ``error``,
    a typed error with the unary RPC's code and message (the field names
    prefixed with the op's path, ``"open.rooms[3].prompt_len"``;
    ``retry_after`` set when the daemon gave a delay)."""

    room: int
    open: Optional[rooms_pb2.OpenRoomResponse] = None
    release: Optional[rooms_pb2.ReleaseRoomResponse] = None
    abort: Optional[rooms_pb2.AbortRoomResponse] = None
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
        """The room's next event; None after its last (terminal, or its
        outcome with ENGINE_EVENTS_OUTCOME). Raises the session's end when
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


class EngineSession:
    """The decode engine's multiplexed stream (EngineSession.Session); see
    the module documentation. Build it with :meth:`EngineAPI.session`.

    Ops (:meth:`open`, :meth:`release`, :meth:`abort`, :meth:`resume` and
    their ``*_async`` forms, which return a :class:`concurrent.futures.Future`
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
        e = ev.event
        last = e.terminal or (self.events == ENGINE_EVENTS_OUTCOME and e.transition.phase == _SUCCEEDED)
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
            w = engine_session_pb2.EngineWatch(events=self.events, rooms=[
                engine_session_pb2.EngineWatchRoom(room=r, after=cursors[r]) for r in rooms[i:i + MAX_ENGINE_WATCH_ROOMS]])
            fut = self._submit("EngineSession.Resume", engine_session_pb2.EngineRequest(watch=w),
                               self._results("EngineSession.Resume"))
            out.extend(self._wait("EngineSession.Resume", fut, timeout))
        return out

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


def _wait_step(room: int, ev: rooms_pb2.RoomEvent, phases: Sequence[int]) -> tuple[bool, Optional[rooms_pb2.Room]]:
    """What one of a room's events means to a wait for ``phases``: (done,
    room); raises when the room ended without reaching one (RoomFailedError
    for a failure)."""
    r = ev.room
    ph = ev.transition.phase if ev.HasField("transition") else r.phase
    if ph in phases:
        return True, r
    if not ev.terminal:
        return False, None
    if ph == _FAILED:
        raise RoomFailedError(room, r.failure, op="WaitRoom")
    if not phases:
        return True, r
    want = ", ".join(common_pb2.RoomPhase.Name(p) for p in phases)
    raise local_error("WaitRoom", grpc.StatusCode.FAILED_PRECONDITION,
                      f"room {room} ended in {common_pb2.RoomPhase.Name(ph)} before reaching {want}")


def _transient_end(e: DecodeplaneError) -> bool:
    """A session's end after which a new session may work."""
    return e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED)


class _Waiter(_Sink):
    """One open_and_wait's room on the shared session."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.cond = threading.Condition()
        self.sess: Optional[EngineSession] = None  # None before the open and after that session ended
        self.opened = False
        self.inc = 0
        self.seq = 0
        self.evs: list[engine_session_pb2.EngineRoomEvent] = []
        self.lost_err: Optional[BaseException] = None
        self.failed: Optional[DecodeplaneError] = None

    def deliver(self, session: EngineSession, ev: engine_session_pb2.EngineRoomEvent) -> None:
        with self.cond:
            if self.sess is not session or ev.seq <= self.seq:
                return
            self.seq = ev.seq
            self.evs.append(ev)
            self.cond.notify_all()

    def lost(self, session: EngineSession, err: BaseException) -> None:
        with self.cond:
            if self.sess is session:
                self.sess, self.lost_err = None, err
                self.cond.notify_all()


class _EngineMux:
    """open_and_wait's shared EngineSession (ENGINE_EVENTS_OUTCOME), opened
    at the first call and again after it ended, resuming the rooms waited on."""

    def __init__(self, client: "Client") -> None:
        self._c = client
        self._lock = threading.Lock()
        self._dial_lock = threading.Lock()
        self._cur: Optional[EngineSession] = None
        self.rooms: dict[int, _Waiter] = {}
        self.unary_until = 0.0
        self._closed = False

    def live(self) -> Optional[EngineSession]:
        with self._lock:
            cur = self._cur
        return cur if cur is not None and not cur.done else None

    def acquire(self, deadline: Deadline) -> EngineSession:
        op = "EngineSession"
        if self._closed:
            raise local_error(op, grpc.StatusCode.CANCELLED, "the client is closed")
        s = self.live()
        if s is not None:
            return s
        rem = deadline.remaining()
        if not self._dial_lock.acquire(timeout=-1 if rem is None else rem):
            raise local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded waiting for the engine session")
        try:
            s = self.live()
            if s is not None:
                return s
            return self._dial()
        finally:
            self._dial_lock.release()

    def _dial(self) -> EngineSession:
        s = EngineSession(self._c, events=ENGINE_EVENTS_OUTCOME)
        cursors: dict[int, int] = {}
        with self._lock:
            if self._closed:
                s.close()
                raise local_error("EngineSession", grpc.StatusCode.CANCELLED, "the client is closed")
            self._cur = s
            # The rooms to resume are subscribed before the Resume is sent:
            # their events may follow its reply at once.
            for room, w in self.rooms.items():
                with w.cond:
                    if w.opened and w.sess is None and w.failed is None:
                        w.sess, w.lost_err = s, None
                        cursors[room] = w.seq
                        s._subscribe(room, w)
        if cursors:
            self.resume(s, cursors)
        return s

    def resume(self, s: EngineSession, cursors: Mapping[int, int]) -> None:
        """Re-subscribes rooms on s; a room the daemon refuses fails its wait."""
        try:
            results = s.resume(cursors)
        except DecodeplaneError as e:
            if isinstance(e, InvalidArgumentError):
                for room in cursors:
                    self._fail(room, s, with_op("WatchRoom", e))
            return  # the session's end detaches the rooms again
        for r in results:
            if r.error is not None:
                self._fail(r.room, s, with_op("WatchRoom", r.error))

    def _fail(self, room: int, s: EngineSession, err: DecodeplaneError) -> None:
        with self._lock:
            w = self.rooms.get(room)
        if w is None:
            return
        with w.cond:
            if w.sess is s:
                w.failed = err
                w.cond.notify_all()

    def attach(self, w: _Waiter, s: EngineSession) -> None:
        with w.cond:
            w.sess, w.lost_err = s, None
        s._subscribe(w.room, w)

    def join(self, room: int) -> Optional[_Waiter]:
        with self._lock:
            if room in self.rooms:
                return None
            w = _Waiter(room)
            self.rooms[room] = w
            return w

    def leave(self, w: _Waiter) -> None:
        with self._lock:
            if self.rooms.get(w.room) is w:
                del self.rooms[w.room]
        with w.cond:
            s = w.sess
        if s is not None:
            s._unsubscribe(w.room, w)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            cur, self._cur = self._cur, None
        if cur is not None:
            cur.close()


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
        with ``history``), then each transition until it is terminal. A
        broken stream is re-opened; see :class:`RoomWatch`. NotFoundError
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

    def resync(self, rooms: Sequence[rooms_pb2.ResyncRoom], *, timeout: Optional[float] = None) -> rooms_pb2.ResyncResponse:
        """Resync: after a daemon restart, re-declares the rooms the engine
        still runs, in calls of at most 4,096 rooms, the last with ``done``
        (then the daemon admits); returns the last answer. A call refused
        part-way (the error names ``rooms[i]`` of that call) stops it; the
        rooms before stay adopted. FailedPreconditionError: admission has
        already started. Never retried."""
        dl = self._c._deadline(timeout)
        start = 0
        while True:
            end = min(start + MAX_RESYNC_ROOMS, len(rooms))
            req = rooms_pb2.ResyncRequest(rooms=list(rooms[start:end]), done=end == len(rooms))
            resp = self._c._invoke(_RESYNC, self._c._rooms_stub.Resync, req, deadline=dl)
            if req.done:
                return resp
            start = end

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


def _op_seq(fut: Future[Any]) -> int:
    """The seq the op of ``fut`` was queued with (0 when unknown)."""
    return int(getattr(fut, "_decodeplane_seq", 0))
