"""The engine view's shared EngineSession (open_and_wait's, under
Transport.STREAMS): its rooms' waiters and the re-dial that resumes them.
Internal to :mod:`decodeplane.engine`."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import grpc

from decodeplane._core import Deadline
from decodeplane.engine_session import ENGINE_EVENTS_OUTCOME, EngineSession, _Sink
from decodeplane.errors import DecodeplaneError, InvalidArgumentError, RoomFailedError, local_error, with_op
from decodeplane.v1 import common_pb2, engine_session_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

#: How long open_and_wait stays on the unary path after an UNIMPLEMENTED EngineSession.
UNARY_FALLBACK = 60.0

_FAILED = common_pb2.ROOM_PHASE_FAILED


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


def _op_seq(fut: Future[Any]) -> int:
    """The seq the op of ``fut`` was queued with (0 when unknown)."""
    return int(getattr(fut, "_decodeplane_seq", 0))
