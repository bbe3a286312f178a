"""A Prefill's shared PrefillSession (Transport.STREAMS) and the claim
streams a hand-off reads (unary, a session of its own, or the shared
session, claimed again on a new session when one ends). Internal to
:mod:`decodeplane.prefill`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import grpc

from decodeplane._core import Deadline, wait_retry
from decodeplane.errors import DecodeplaneError, IncarnationChangedError, NotFoundError, local_error
from decodeplane.prefill_session import _MUX_OP, PrefillSession, SessionClaim
from decodeplane.streams import ClaimEvent, DestinationStream
from decodeplane.v1 import rooms_pb2

if TYPE_CHECKING:
    from decodeplane.prefill import Prefill


class _ClaimStream:
    """A claim's events, over the unary API or a session."""

    def next(self, dl: Deadline) -> Optional[ClaimEvent]:  # pragma: no cover - protocol
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError


class _UnaryClaim(_ClaimStream):
    def __init__(self, s: DestinationStream) -> None:
        self._s = s

    def next(self, dl: Deadline) -> Optional[ClaimEvent]:
        return self._s.next()

    def close(self) -> None:
        self._s.close()


class _SessionClaimStream(_ClaimStream):
    def __init__(self, c: SessionClaim) -> None:
        self._c = c

    def next(self, dl: Deadline) -> Optional[ClaimEvent]:
        try:
            return self._c.next(dl.remaining())
        except TimeoutError:
            raise local_error("AwaitDestination", grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"room {self._c.room}: deadline exceeded waiting for the claim's events") from None

    def close(self) -> None:
        self._c.close()


@dataclass
class _Transport:
    claim: Callable[[rooms_pb2.AwaitDestinationRequest, Deadline], _ClaimStream]
    ack: Callable[[int, rooms_pb2.Destination, Deadline], Any]


class _MuxClaim(_ClaimStream):
    """A hand-off's claim on the shared session, made again on the next
    session when the one it was on ended."""

    def __init__(self, mux: "_PrefillMux", req: rooms_pb2.AwaitDestinationRequest, dl: Deadline,
                 first: Optional[SessionClaim] = None) -> None:
        self._m = mux
        self._req = req
        self._lock = threading.Lock()
        self._cur: Optional[SessionClaim] = first  # an offer the daemon made (decodeplane.fleet)
        self._closed = False
        self._seen = False
        self._attempt = 0
        self._fails = 0
        if first is None:
            self._attach(dl)

    def _attach(self, dl: Deadline) -> None:
        max_attempts = self._m._p._c._retry.max_attempts
        while True:
            s = self._m.get_hand_off(dl)
            try:
                sc = s._claim(self._req, dl.remaining())
            except DecodeplaneError as e:
                if self._fails + 1 < max_attempts and e._stream_end and not dl.expired():
                    self._fails += 1
                    continue
                raise
            with self._lock:
                if self._closed:
                    sc.close()
                    return
                self._cur = sc
            return

    def next(self, dl: Deadline) -> Optional[ClaimEvent]:
        max_attempts = self._m._p._c._retry.max_attempts
        while True:
            with self._lock:
                cur = self._cur
            if cur is None:
                return None
            try:
                ev = _SessionClaimStream(cur).next(dl)
            except DecodeplaneError as e:
                with self._lock:
                    closed = self._closed
                if closed or self._fails + 1 >= max_attempts or not e._stream_end or dl.expired():
                    raise
                self._fails += 1
                self._attach(dl)
                continue
            if ev is None:
                return None
            if ev.destination is not None:
                if self._seen and ev.destination.attempt == self._attempt:
                    continue  # re-delivered after a re-claim
                self._seen, self._attempt = True, ev.destination.attempt
            self._fails = 0
            return ev

    def close(self) -> None:
        with self._lock:
            self._closed = True
            cur = self._cur
        if cur is not None:
            cur.close()


class _PrefillMux:
    """A Prefill's shared session (Transport.STREAMS)."""

    def __init__(self, p: "Prefill") -> None:
        self._p = p
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._cur: Optional[PrefillSession] = None
        self._closed = False
        self._users = 0

    def acquire(self) -> Callable[[], None]:
        """Counts a user of the session (a hand-off, run_heartbeat) until the
        returned release; the last one closes the session (an idle rank does
        not beat)."""
        with self._lock:
            self._users += 1
        once = threading.Lock()
        released = [False]

        def release() -> None:
            with once:
                if released[0]:
                    return
                released[0] = True
            s = None
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._cur is not None:
                    s, self._cur = self._cur, None
            if s is not None:
                s.close()
        return release

    def live(self) -> Optional[PrefillSession]:
        with self._lock:
            if self._cur is not None and self._cur.done:
                self._cur = None
            return self._cur

    def closed(self) -> bool:
        return self._closed

    def get(self, dl: Deadline) -> PrefillSession:
        """The live session, opening one if there is none (one open at a
        time, retried under the retry policy)."""
        s = self.live()
        if s is not None:
            return s
        rem = dl.remaining()
        if not self._open_lock.acquire(timeout=-1 if rem is None else rem):
            raise local_error(_MUX_OP, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded waiting for the prefill session")
        c = self._p._c
        try:
            attempt = 1
            while True:
                s = self.live()
                if s is not None:
                    return s
                c._check_open(_MUX_OP)
                if self._closed:
                    raise local_error(_MUX_OP, grpc.StatusCode.CANCELLED, "the Prefill is closed")
                try:
                    return self._dial(dl)
                except DecodeplaneError as e:
                    err = e
                if (dl.expired() or self._closed or attempt >= c._retry.max_attempts
                        or isinstance(err, IncarnationChangedError)):
                    raise err
                d = c._retry.retry_delay(err, attempt)
                if d is None:
                    raise err
                wait_retry(_MUX_OP, d, err, dl, c._closed)
                attempt += 1
        finally:
            self._open_lock.release()

    def get_hand_off(self, dl: Deadline) -> PrefillSession:
        """get for a hand-off: a session the daemon refuses because it does not
        know the rank (NOT_FOUND: it restarted, or declared the rank dead)
        while a run_heartbeat of this Prefill runs is opened again once that
        run_heartbeat registered the rank anew (at most two heartbeat
        intervals later)."""
        reg, beating = self._p._registered_signal()
        try:
            return self.get(dl)
        except NotFoundError:
            if not beating:
                raise
            if not reg.wait(dl.cap(2 * self._p._heartbeat_interval())):
                raise
            return self.get(dl)

    def _dial(self, dl: Deadline) -> PrefillSession:
        s = PrefillSession(self._p, timeout=dl.remaining())
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._cur = s
        if closed:
            s.close()
            raise local_error(_MUX_OP, grpc.StatusCode.CANCELLED, "the Prefill is closed")
        return s

    def do(self, dl: Deadline, call: Callable[[PrefillSession], Any]) -> Any:
        """Runs call on the shared session, on a new one when the session
        ended under it (at most max_attempts sessions)."""
        n = 1
        while True:
            s = self.get(dl)
            try:
                return call(s)
            except DecodeplaneError as e:
                if n >= self._p._c._retry.max_attempts or not e._stream_end or dl.expired():
                    raise
            n += 1

    def transport(self, first: Optional[SessionClaim] = None) -> _Transport:
        """The hand-off's claim and ack on the shared session; ``first``, an
        offered claim (decodeplane.fleet), is the first claim's events while
        its session lives."""
        p = self._p
        offered = [first]

        def claim(req: rooms_pb2.AwaitDestinationRequest, dl: Deadline) -> _ClaimStream:
            first, offered[0] = offered[0], None
            return _MuxClaim(self, req, dl, first)

        def ack(room: int, dest: rooms_pb2.Destination, dl: Deadline) -> Any:
            req = rooms_pb2.AckRoomEndRequest(room=room, rank=p._rank, attempt=dest.attempt, incarnation=dest.incarnation)
            return self.do(dl, lambda s: s.ack(req, timeout=dl.remaining()))
        return _Transport(claim, ack)

    def chunk(self, req: rooms_pb2.TransferRequest, dl: Deadline) -> Any:
        return self.do(dl, lambda s: s.chunk(req, timeout=dl.remaining()))

    def report(self, req: rooms_pb2.ReportTransferRequest, dl: Deadline) -> Any:
        return self.do(dl, lambda s: s.report(req, timeout=dl.remaining()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            s, self._cur = self._cur, None
        if s is not None:
            s.close()

