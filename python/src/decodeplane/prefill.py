"""A prefill rank's side of the hand-off (:meth:`decodeplane.Client.prefill`):
registration, heartbeats, claims, chunks, reports, acknowledgements, the
Staging RPCs, the rank's multiplexed stream (:class:`PrefillSession`) and
the hand-off helpers :meth:`Prefill.send_room` and :meth:`Prefill.report_room`.

Incarnations
------------

The daemon draws a new incarnation at every start. A :class:`Prefill`
records it from every registration, heartbeat and session welcome, and
every request it sends about a destination names the destination's
incarnation and attempt. When it learns another incarnation (an answer, a
destination, or the daemon's STALE_INCARNATION refusal), every destination
of the old one is void: each hand-off holding one stops before its next
write or report and raises :class:`~decodeplane.IncarnationChangedError`;
:meth:`Prefill.run_heartbeat` registers again on its next beat (or call
:meth:`Prefill.register`), ``on_incarnation_change`` is told, and the caller
hands the rooms off again.

Transports
----------

Under Transport.STREAMS (the default) every send_room and report_room of a
Prefill, and its run_heartbeat, go on the rank's one shared
PrefillSession stream, opened by the first of them and re-opened after it
ended (under the retry policy's backoff), closed when none uses it any
more. A session that ends under a hand-off is replaced and the hand-off
goes on: it claims again on the new session (the destination is not
returned twice) and sends again the op whose answer was lost, which the
daemon's idempotency rules make safe ((room, rank, chunk_index) keys a
chunk and its report; report_room's ``move`` is not run again). The session
is also the rank's heartbeat (it pings when it has been idle for half the
heartbeat interval). A daemon that does not serve PrefillSession
(UNIMPLEMENTED) gets the unary API. Under Transport.UNARY: AwaitDestination,
Transfer or ReportTransfer per chunk, AckRoomEnd.

The prefill session
-------------------

:meth:`Prefill.session` opens a PrefillSession of your own: hello/welcome,
then claims, chunks, reports and acks as ops with increasing seq numbers,
answered by results matched by seq (futures), and each claimed room's
events (the destination, then the room's end) handed to its
:class:`SessionClaim`. One writer (gRPC's sending thread consumes the send
queue, packing what was queued meanwhile into ``PrefillRequest.more`` once
the daemon's header said it reads it) and one reader thread. It is not
re-opened by itself: when it ends, register again if needed, open another
and claim again (the daemon re-delivers).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

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
)
from decodeplane.client import Transport, build, copy_of
from decodeplane.errors import (
    ERROR_DOMAIN,
    AbortedError,
    DecodeplaneError,
    FailedPreconditionError,
    IncarnationChangedError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    RoomFailedError,
    StaleIncarnationError,
    UnauthenticatedError,
    UnimplementedError,
    from_rpc_error,
    local_error,
    make_error,
    status_code,
    unprefix,
)
from decodeplane.retry import retryable
from decodeplane.streams import ClaimEvent, DestinationStream, WatermarkStream
from decodeplane.v1 import bootstrap_pb2, common_pb2, prefill_session_pb2, rooms_pb2, staging_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["Prefill", "PrefillSession", "SessionClaim", "Chunk", "HeartbeatRunner", "chunks",
           "ACK_TIMEOUT", "DEFAULT_HEARTBEAT_INTERVAL"]

#: Bound of the acknowledgement a hand-off sends when its room ended while
#: it held the destination (best effort: the daemon releases the pages at
#: its release.deferred_timeout anyway).
ACK_TIMEOUT = 5.0
#: How long a hand-off whose own chunk revealed the room's failure waits for
#: the claim's end (and its ack_required) before it gives up acknowledging.
ACK_WAIT = 2.0
#: SGLang's heartbeat interval, used until the daemon gave one.
DEFAULT_HEARTBEAT_INTERVAL = 5.0

_REGISTER = "/decodeplane.v1.Bootstrap/RegisterPrefill"
_HEARTBEAT = "/decodeplane.v1.Bootstrap/Heartbeat"
_DEREGISTER = "/decodeplane.v1.Bootstrap/DeregisterPrefill"
_BIND_ROOM = "/decodeplane.v1.Bootstrap/BindRoom"
_AWAIT = "/decodeplane.v1.Rooms/AwaitDestination"
_TRANSFER = "/decodeplane.v1.Rooms/Transfer"
_REPORT = "/decodeplane.v1.Rooms/ReportTransfer"
_ACK = "/decodeplane.v1.Rooms/AckRoomEnd"
_GET_ROOM = "/decodeplane.v1.Rooms/GetRoom"
_SETUP_STAGING = "/decodeplane.v1.Staging/SetupStaging"
_ALLOCATE_STAGING = "/decodeplane.v1.Staging/AllocateStaging"
_CHUNK_READY = "/decodeplane.v1.Staging/ChunkReady"
_WATCH_WATERMARK = "/decodeplane.v1.Staging/WatchWatermark"

_MUX_OP = "PrefillSession"
_FAILED = 9  # ROOM_PHASE_FAILED


@dataclass(frozen=True)
class Chunk:
    """One chunk of a room's KV from this rank: pages ``[page_offset,
    page_offset + num_pages)`` of the destination's page_indices."""

    destination: rooms_pb2.Destination
    index: int
    page_offset: int
    num_pages: int
    last: bool

    def pages(self) -> list[int]:
        """The decode page indices the chunk writes."""
        return list(self.destination.page_indices[self.page_offset:self.page_offset + self.num_pages])

    def bytes(self) -> int:
        """What the chunk weighs by the decode layout, for this rank: tokens ×
        ``token_bytes``, plus ``state_bytes`` on the last chunk. The daemon
        refuses a ReportTransfer whose ``bytes`` differ."""
        d = self.destination
        ps = d.page_size
        tokens = min((self.page_offset + self.num_pages) * ps, d.fill_len) - self.page_offset * ps
        n = max(tokens, 0) * d.token_bytes
        if self.last:
            n += d.state_bytes
        return n


def chunks(dest: rooms_pb2.Destination, pages_per_chunk: int = 0) -> list[Chunk]:
    """A destination's pages in chunks of ``pages_per_chunk`` (0: one chunk)."""
    total = len(dest.page_indices)
    n = pages_per_chunk if 0 < pages_per_chunk <= total else total
    if total == 0:
        return [Chunk(dest, 0, 0, 0, True)]
    return [Chunk(dest, i, off, min(n, total - off), off + min(n, total - off) == total)
            for i, off in enumerate(range(0, total, n))]


#: A hand-off's move of one chunk: (chunk, stop, check, deadline).
MoveFn = Callable[[Chunk, threading.Event, Callable[[], None], Deadline], None]


class _MoveFailure(Exception):
    """A ``move`` error report_room reported as the chunk's failure."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


class _Generation:
    """One daemon incarnation as a Prefill holds it; void once another was learned."""

    def __init__(self, inc: int) -> None:
        self.inc = inc
        self.void = threading.Event()
        self.cause: Optional[IncarnationChangedError] = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def on_void(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Runs fn when the generation becomes void (at once if it is);
        returns the function that unregisters it."""
        with self._lock:
            if not self.void.is_set():
                self._callbacks.append(fn)

                def remove() -> None:
                    with self._lock:
                        if fn in self._callbacks:
                            self._callbacks.remove(fn)
                return remove
        fn()
        return lambda: None

    def set_void(self, cause: IncarnationChangedError) -> None:
        with self._lock:
            if self.void.is_set():
                return
            self.cause = cause
            self.void.set()
            cbs, self._callbacks = self._callbacks, []
        for fn in cbs:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("incarnation change callback failed")


def _permanent(err: BaseException) -> bool:
    """Errors that repeating the same call cannot fix."""
    return isinstance(err, (InvalidArgumentError, FailedPreconditionError, UnauthenticatedError,
                            PermissionDeniedError, UnimplementedError))


def _op_error(op: str, e: prefill_session_pb2.PrefillError) -> DecodeplaneError:
    return make_error(op, status_code(e.code), e.message, reason=e.reason, domain=ERROR_DOMAIN if e.reason else "",
                      error_metadata=dict(e.metadata))


_OK_END = object()


class SessionClaim:
    """One room's claim on a :class:`PrefillSession`: the destination, then
    the room's end, as a DestinationStream gives them. Read it from one
    thread; close from any."""

    def __init__(self, session: "PrefillSession", room: int, incarnation: int) -> None:
        self.room = room
        self.seq = 0
        self.incarnation = incarnation
        self._s = session
        self._q: ClosableQueue[rooms_pb2.DestinationEvent] = ClosableQueue()
        self._end: Optional[BaseException] = None  # the session's end; None: closed by the caller

    def _deliver(self, ev: rooms_pb2.DestinationEvent) -> None:
        self._q.put(ev)

    def _fail(self, end: BaseException) -> None:
        if self._end is None:
            self._end = end
        self._q.close()

    def next(self, timeout: Optional[float] = None) -> Optional[ClaimEvent]:
        """The next event: the destination, then the room's end (``done``);
        the room's failure raises RoomFailedError (``ack_required`` as the
        daemon said). None after the end or :meth:`close`; the session's end
        raises its error (an IncarnationChangedError for a
        STALE_INCARNATION refusal). TimeoutError when ``timeout`` passes
        first."""
        while True:
            try:
                ev = self._q.get(timeout)
            except ClosableQueue.Closed:
                end = self._end
                if end is None or end is _OK_END:
                    if end is _OK_END:
                        e = local_error("AwaitDestination", grpc.StatusCode.UNAVAILABLE, "the prefill session ended")
                        e._stream_end = True
                        raise e from None
                    return None
                if isinstance(end, StaleIncarnationError):
                    raise IncarnationChangedError(room=self.room, old=end.old, new=end.new, op=end.op, cause=end) from None
                raise end from None
            which = ev.WhichOneof("event")
            if which == "destination":
                d = ev.destination
                if d.incarnation and self.incarnation and d.incarnation != self.incarnation:
                    self.close()
                    raise IncarnationChangedError(room=self.room, old=self.incarnation, new=d.incarnation,
                                                  op="AwaitDestination")
                return ClaimEvent(destination=d)
            if which == "done":
                self.close()
                return ClaimEvent(done=ev.done)
            if which == "failure":
                self.close()
                raise RoomFailedError(self.room, ev.failure, ack_required=ev.ack_required, op="AwaitDestination")

    def close(self) -> None:
        """Stops delivering this claim's events. The daemon keeps the claim
        until the room ends or the session does."""
        self._s._forget(self)
        self._q.close()


class PrefillSession:
    """A prefill rank's PrefillSession stream (see the module
    documentation). Build it with :meth:`Prefill.session`; the rank must be
    registered. Safe for use from any thread; a context manager.

    The op methods block until the op's result (at most ``timeout``); their
    ``*_async`` forms return a :class:`concurrent.futures.Future` resolved
    by the reader thread (callbacks run there: keep them short).
    """

    def __init__(self, prefill: "Prefill", *, timeout: Optional[float] = None) -> None:
        op = _MUX_OP
        c = prefill._c
        c._check_open(op)
        self._p = prefill
        self._lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[int, tuple[Future[Any], Callable[[prefill_session_pb2.PrefillResult], Any]]] = {}
        self._claims: dict[int, SessionClaim] = {}
        self._end: Optional[BaseException] = None
        self._done = threading.Event()
        self._closing = False
        self._outbox: Outbox[prefill_session_pb2.PrefillRequest] = Outbox(
            idle=prefill._cadence(),
            idle_message=lambda: prefill_session_pb2.PrefillRequest(ping=prefill_session_pb2.PrefillPing()))
        self._outbox.push(prefill_session_pb2.PrefillRequest(hello=prefill_session_pb2.PrefillHello(
            rank=prefill._rank, instance_id=prefill._reg.instance_id, incarnation=prefill.incarnation)))
        self._call = c._prefill_session_stub.Session(iter(self._outbox), metadata=c._metadata(pack=True))
        dl = Deadline(timeout)
        fired = threading.Event()

        def expire() -> None:
            fired.set()
            self._call.cancel()

        rem = dl.remaining()
        timer = threading.Timer(rem, expire) if rem is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            md = self._call.initial_metadata() or ()
            first = next(self._call)
        except grpc.RpcError as e:
            self._outbox.abort()
            err = from_rpc_error(op, e)
            if fired.is_set():
                err = local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded waiting for the session's welcome")
            raise prefill._voided(prefill._generation(), 0, err) from None
        except StopIteration:
            self._outbox.abort()
            raise local_error(op, grpc.StatusCode.UNAVAILABLE, "the session ended before its welcome") from None
        finally:
            if timer is not None:
                timer.cancel()
        if first.WhichOneof("event") != "welcome":
            self._call.cancel()
            self._outbox.abort()
            raise local_error(op, grpc.StatusCode.INTERNAL, f"the daemon's first session message is not a welcome: {first}")
        #: The daemon's answer to the hello (incarnation, heartbeat interval, queue bound).
        self.welcome: prefill_session_pb2.PrefillWelcome = first.welcome
        prefill._learn(self.welcome.incarnation, registered=False)
        iv = self.welcome.heartbeat_interval.ToNanoseconds() / 1e9
        if iv > 0:
            prefill._set_interval(iv)
        # Packed requests only to a daemon that reads them: its header (which
        # came before the welcome) says so.
        if any(k == PACK_KEY and v == PACK_MORE for k, v in md):
            self._outbox.set_max(1 + MAX_REQUESTS_PER_MESSAGE)
        self._reader = threading.Thread(target=self._read, name="decodeplane-prefill-session", daemon=True)
        self._reader.start()

    # ---- reader ----

    def _read(self) -> None:
        end: BaseException = _OK_END  # type: ignore[assignment]
        try:
            for ev in self._call:
                self._dispatch(ev)
                for m in ev.more:
                    self._dispatch(m)
        except grpc.RpcError as e:
            end = from_rpc_error(_MUX_OP, e)
            if self._closing:
                end = local_error(_MUX_OP, grpc.StatusCode.CANCELLED, "the session is closed")
        except BaseException as e:  # noqa: BLE001
            log.exception("prefill session reader failed")
            end = local_error(_MUX_OP, grpc.StatusCode.INTERNAL, f"the session's reader failed: {e!r}")
            self._call.cancel()
        with self._lock:
            self._end = end
            waiting = list(self._waiting.values())
            self._waiting.clear()
            claims = list(self._claims.values())
            self._claims.clear()
        self._outbox.abort()
        for fut, _ in waiting:
            fut.set_exception(self._ended_error(_MUX_OP))
        for cl in claims:
            cl._fail(end if end is _OK_END else self._ended_error("AwaitDestination"))
        self._done.set()

    def _dispatch(self, ev: prefill_session_pb2.PrefillEvent) -> None:
        which = ev.WhichOneof("event")
        if which == "result":
            r = ev.result
            with self._lock:
                entry = self._waiting.pop(r.seq, None)
            if entry is not None:
                fut, convert = entry
                try:
                    fut.set_result(convert(r))
                except DecodeplaneError as e:
                    fut.set_exception(e)
        elif which == "room":
            re_ = ev.room
            with self._lock:
                cl = self._claims.get(re_.room)
            if cl is not None and cl.seq == re_.claim_seq:
                cl._deliver(re_.event)

    def _ended_error(self, op: str) -> DecodeplaneError:
        end = self._end
        if end is None or end is _OK_END:
            e = local_error(op, grpc.StatusCode.UNAVAILABLE, "the prefill session ended")
        else:
            assert isinstance(end, DecodeplaneError)
            e = make_error(op, end.code(), end.message, reason=end.reason, domain=end.domain,
                           error_metadata=end.error_metadata, retry_after=end.retry_after)
        e._stream_end = True
        return e

    def _forget(self, cl: SessionClaim) -> None:
        with self._lock:
            if self._claims.get(cl.room) is cl:
                del self._claims[cl.room]

    # ---- ops ----

    def _submit(self, op: str, prefix: str, m: prefill_session_pb2.PrefillRequest, field: str,
                claim: Optional[SessionClaim] = None) -> Future[Any]:
        fut: Future[Any] = Future()

        def convert(r: prefill_session_pb2.PrefillResult) -> Any:
            if r.HasField("error"):
                raise unprefix(_op_error(op, r.error), prefix)
            return getattr(r, field)

        ended: list[bool] = []

        def add() -> bool:
            with self._lock:
                if self._end is not None:
                    ended.append(True)
                    return False
                self._seq += 1
                m.seq = self._seq
                self._waiting[m.seq] = (fut, convert)
                if claim is not None:
                    claim.seq = m.seq
                    self._claims[claim.room] = claim  # before the result: the events follow it
                return True

        if not self._outbox.push(m, add):
            raise self._ended_error(op)
        return fut

    @staticmethod
    def _wait(op: str, fut: Future[Any], timeout: Optional[float]) -> Any:
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded waiting for the op's result") from None

    def claim(self, room: int, *, incarnation: Optional[int] = None, timeout: Optional[float] = None) -> SessionClaim:
        """AwaitDestination over the session for the session's rank: once the
        claim is made, the room's events come on the returned SessionClaim.
        ``incarnation`` is the daemon incarnation the rank registered with
        (default: the Prefill's). A second claim of a room supersedes the
        first."""
        inc = self._p.incarnation if incarnation is None else incarnation
        return self._claim(rooms_pb2.AwaitDestinationRequest(room=room, incarnation=inc), timeout)

    def _claim(self, req: rooms_pb2.AwaitDestinationRequest, timeout: Optional[float]) -> SessionClaim:
        op = "AwaitDestination"
        cl = SessionClaim(self, req.room, req.incarnation)
        try:
            fut = self._submit(op, "claim.", prefill_session_pb2.PrefillRequest(claim=req), "claim", claim=cl)
            self._wait(op, fut, timeout)
        except DecodeplaneError:
            self._forget(cl)
            raise
        return cl

    def chunk_async(self, request: Optional[rooms_pb2.TransferRequest] = None, **fields: Any) -> Future[rooms_pb2.TransferResponse]:
        """Transfer over the session (``rank`` unset: the session's); the
        future's result comes when the chunk landed."""
        req = build(rooms_pb2.TransferRequest, request, fields)
        return self._submit("Transfer", "chunk.", prefill_session_pb2.PrefillRequest(chunk=req), "chunk")

    def chunk(self, request: Optional[rooms_pb2.TransferRequest] = None, *, timeout: Optional[float] = None,
              **fields: Any) -> rooms_pb2.TransferResponse:
        """Transfer over the session: its answer, or Transfer's typed error."""
        return self._wait("Transfer", self.chunk_async(request, **fields), timeout)

    def report_async(self, request: Optional[rooms_pb2.ReportTransferRequest] = None,
                     **fields: Any) -> Future[rooms_pb2.ReportTransferResponse]:
        """ReportTransfer over the session."""
        req = build(rooms_pb2.ReportTransferRequest, request, fields)
        return self._submit("ReportTransfer", "report.", prefill_session_pb2.PrefillRequest(report=req), "report")

    def report(self, request: Optional[rooms_pb2.ReportTransferRequest] = None, *, timeout: Optional[float] = None,
               **fields: Any) -> rooms_pb2.ReportTransferResponse:
        """ReportTransfer over the session: its answer, or its typed error."""
        return self._wait("ReportTransfer", self.report_async(request, **fields), timeout)

    def ack_async(self, request: Optional[rooms_pb2.AckRoomEndRequest] = None,
                  **fields: Any) -> Future[rooms_pb2.AckRoomEndResponse]:
        """AckRoomEnd over the session."""
        req = build(rooms_pb2.AckRoomEndRequest, request, fields)
        return self._submit("AckRoomEnd", "ack.", prefill_session_pb2.PrefillRequest(ack=req), "ack")

    def ack(self, request: Optional[rooms_pb2.AckRoomEndRequest] = None, *, timeout: Optional[float] = None,
            **fields: Any) -> rooms_pb2.AckRoomEndResponse:
        """AckRoomEnd over the session: its answer, or its typed error
        (StaleAttemptError for an attempt that is not the room's current one)."""
        return self._wait("AckRoomEnd", self.ack_async(request, **fields), timeout)

    # ---- lifecycle ----

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for the session's end; False if ``timeout`` passed first."""
        return self._done.wait(timeout)

    @property
    def error(self) -> Optional[BaseException]:
        """Why the session ended (None while it lives or after an OK end)."""
        end = self._end
        return None if end is None or end is _OK_END else end

    def close(self) -> None:
        """Ends the session. Claims whose destination was delivered stand (as
        after a dropped AwaitDestination stream)."""
        self._closing = True
        self._call.cancel()
        self._outbox.abort()
        if threading.current_thread() is not self._reader:
            self._reader.join()

    def __enter__(self) -> "PrefillSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- hand-off transports ----


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

    def __init__(self, mux: "_PrefillMux", req: rooms_pb2.AwaitDestinationRequest, dl: Deadline) -> None:
        self._m = mux
        self._req = req
        self._lock = threading.Lock()
        self._cur: Optional[SessionClaim] = None
        self._closed = False
        self._seen = False
        self._attempt = 0
        self._fails = 0
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

    def transport(self) -> _Transport:
        p = self._p

        def claim(req: rooms_pb2.AwaitDestinationRequest, dl: Deadline) -> _ClaimStream:
            return _MuxClaim(self, req, dl)

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


class HeartbeatRunner:
    """A :meth:`Prefill.run_heartbeat` loop on a daemon thread
    (:meth:`Prefill.start_heartbeat`)."""

    def __init__(self, prefill: "Prefill") -> None:
        self._stop = threading.Event()
        #: What ended the loop (an error repeating cannot fix), None while it
        #: runs or after stop().
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(prefill,), name="decodeplane-heartbeat", daemon=True)
        self._thread.start()

    def _run(self, prefill: "Prefill") -> None:
        try:
            prefill.run_heartbeat(self._stop)
        except BaseException as e:  # noqa: BLE001
            self.error = e

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops the loop and waits for it."""
        self._stop.set()
        self._thread.join(timeout)


class Prefill:
    """One prefill scheduler rank: its registration, heartbeats and
    hand-offs. Build it with :meth:`decodeplane.Client.prefill`; safe for
    use from any thread (one runs the heartbeat while others send rooms).

    The rank's identity (:attr:`rank`) is derived from the registration the
    way the daemon keys it: the DP group is ``attn_dp_rank``, or
    ``system_dp_rank`` when ``system_dp_size > 1``.

    Args (of :meth:`decodeplane.Client.prefill`):
        heartbeat_every: seconds between beats, instead of half the
            daemon's heartbeat interval.
        on_heartbeat_error: called from the heartbeat thread with every error
            the loop recovers from (to log).
        on_incarnation_change: called with (old, new) when the Prefill learns
            that the daemon restarted (every destination of ``old`` is void
            by then), from the thread that learned it.
    """

    def __init__(self, client: "Client", registration: bootstrap_pb2.RegisterPrefillRequest, *,
                 heartbeat_every: Optional[float] = None,
                 on_heartbeat_error: Optional[Callable[[BaseException], None]] = None,
                 on_incarnation_change: Optional[Callable[[int, int], None]] = None) -> None:
        self._c = client
        self._reg = copy_of(registration)
        par = self._reg.parallel
        dp = par.system_dp_rank if par.system_dp_size > 1 else par.attn_dp_rank
        self._rank = common_pb2.PrefillRank(bootstrap_addr=self._reg.bootstrap_addr, dp_rank=dp,
                                            cp_rank=par.attn_cp_rank, tp_rank=par.attn_tp_rank, pp_rank=par.pp_rank)
        self._every = heartbeat_every
        self._on_err = on_heartbeat_error
        self._on_inc = on_incarnation_change
        self._lock = threading.Lock()
        self._resp: Optional[bootstrap_pb2.RegisterPrefillResponse] = None
        self._interval = 0.0
        self._gen: Optional[_Generation] = None
        self._reregister = False
        self._registered_ev = threading.Event()
        self._beating = 0
        self._deregistered = False
        self._mux = _PrefillMux(self)
        client._on_close(self.close)

    # ---- identity, incarnation ----

    @property
    def rank(self) -> common_pb2.PrefillRank:
        """This rank's identity (a PrefillRank copy), as AwaitDestination,
        Transfer and Heartbeat name it."""
        return copy_of(self._rank)

    @property
    def incarnation(self) -> int:
        """The daemon incarnation the rank holds (from its last registration,
        heartbeat or session welcome), 0 until one is known."""
        with self._lock:
            return self._gen.inc if self._gen is not None else 0

    @property
    def registration(self) -> Optional[bootstrap_pb2.RegisterPrefillResponse]:
        """The last successful registration's answer, or None."""
        with self._lock:
            return self._resp

    def _generation(self) -> _Generation:
        with self._lock:
            if self._gen is None:
                self._gen = _Generation(0)
            return self._gen

    def _inc_of(self, g: _Generation) -> int:
        with self._lock:
            return g.inc

    def _learn(self, inc: int, registered: bool) -> None:
        """Records the daemon's incarnation; another one than held voids every
        destination of the old one (unless it came from register, the next
        beat registers again)."""
        if not inc:
            return
        old = 0
        void: Optional[_Generation] = None
        with self._lock:
            g = self._gen
            if g is None:
                self._gen = _Generation(inc)
            elif g.inc == 0:
                g.inc = inc
            elif g.inc != inc:
                old, void = g.inc, g
                self._gen = _Generation(inc)
                if not registered:
                    self._reregister = True
            if registered:
                self._reregister = False
        if void is not None:
            void.set_void(IncarnationChangedError(old=old, new=inc))
            if self._on_inc is not None:
                self._on_inc(old, inc)

    def _check(self, g: _Generation, room: int) -> None:
        """Called right before every write and report of a hand-off bound to g."""
        if g.void.is_set():
            raise self._changed(g, room, None)

    def _changed(self, g: _Generation, room: int, err: Optional[BaseException]) -> IncarnationChangedError:
        new = g.cause.new if g.cause is not None else 0
        return IncarnationChangedError(room=room, old=g.inc, new=new, cause=err)

    def _voided(self, g: _Generation, room: int, err: BaseException) -> BaseException:
        """A hand-off's error as an IncarnationChangedError when the
        incarnation changed (the error says so, or g was voided meanwhile),
        learning the daemon's incarnation from it."""
        if isinstance(err, StaleIncarnationError):
            self._learn(err.new, False)
            return IncarnationChangedError(room=room, old=self._inc_of(g) or err.old, new=err.new, op=err.op, cause=err)
        if isinstance(err, IncarnationChangedError):
            self._learn(err.new, False)
            if err.room == room:
                return err
            return IncarnationChangedError(room=room, old=err.old, new=err.new, watch=err.watch, op=err.op, cause=err.cause)
        if g.void.is_set():
            return self._changed(g, room, err)
        return err

    def _set_interval(self, seconds: float) -> None:
        with self._lock:
            self._interval = seconds

    def _heartbeat_interval(self) -> float:
        with self._lock:
            return self._interval if self._interval > 0 else DEFAULT_HEARTBEAT_INTERVAL

    def _cadence(self) -> float:
        """The time between beats: heartbeat_every, or half the daemon's interval."""
        return self._every if self._every and self._every > 0 else self._heartbeat_interval() / 2

    def _registered_signal(self) -> tuple[threading.Event, bool]:
        with self._lock:
            return self._registered_ev, self._beating > 0

    # ---- Bootstrap ----

    def register(self, *, timeout: Optional[float] = None) -> bootstrap_pb2.RegisterPrefillResponse:
        """RegisterPrefill: registers the rank and keeps the answer
        (:attr:`registration`), its heartbeat interval and the daemon's
        incarnation. Errors: InvalidArgumentError (a field, named),
        FailedPreconditionError (page size or KV dtype mismatch, with
        SGLang's message), UnauthenticatedError. Safe to repeat; retried on
        UNAVAILABLE."""
        with self._lock:
            if self._deregistered:
                raise local_error("RegisterPrefill", grpc.StatusCode.CANCELLED,
                                  "the prefill rank was deregistered (Prefill.deregister)")
        resp = self._c._invoke(_REGISTER, self._c._boot_stub.RegisterPrefill, self._reg, timeout)
        self._learn(resp.incarnation, registered=True)
        with self._lock:
            self._resp = resp
            ev, self._registered_ev = self._registered_ev, threading.Event()
            iv = resp.heartbeat_interval.ToNanoseconds() / 1e9
            if iv > 0:
                self._interval = iv
        ev.set()
        return resp

    def deregister(self, reason: str = "", *,
                   timeout: Optional[float] = None) -> bootstrap_pb2.DeregisterPrefillResponse:
        """DeregisterPrefill: tells the daemon that this rank's prefill
        instance stops cleanly. The instance leaves the registry (with a
        fleet registry, on every daemon) and its rooms still handing off fail
        at once with FAILURE_CODE_PREFILL_LOST, instead of when its heartbeats
        have been missing for their liveness bound. ``reason`` is logged by
        the daemon and named in the rooms' failure ("" is "the prefill
        instance stopped"). Call it once the instance stops serving, from any
        one of its ranks: it removes every rank of the instance.

        It first stops the rank: it ends the shared session (:meth:`close`),
        and :meth:`register` raises CanceledError from then on, so that a
        run_heartbeat still running stops (CanceledError) instead of
        registering the instance again; a new Prefill registers it afresh.
        Idempotent (``deregistered`` is false when there was nothing to
        remove); retried on UNAVAILABLE."""
        with self._lock:
            self._deregistered = True
        self.close()
        req = bootstrap_pb2.DeregisterPrefillRequest(bootstrap_addr=self._reg.bootstrap_addr,
                                                     instance_id=self._reg.instance_id, reason=reason)
        return self._c._invoke(_DEREGISTER, self._c._boot_stub.DeregisterPrefill, req, timeout)

    def heartbeat(self, *, timeout: Optional[float] = None) -> bootstrap_pb2.HeartbeatResponse:
        """One Heartbeat RPC (learning the daemon's incarnation).
        NotFoundError: the rank is not registered (or was declared dead):
        register again. Retried on UNAVAILABLE."""
        req = bootstrap_pb2.HeartbeatRequest(rank=self._rank, instance_id=self._reg.instance_id)
        resp = self._c._invoke(_HEARTBEAT, self._c._boot_stub.Heartbeat, req, timeout)
        self._learn(resp.incarnation, registered=False)
        iv = resp.interval.ToNanoseconds() / 1e9
        if iv > 0:
            self._set_interval(iv)
        return resp

    def _beat(self) -> None:
        """One beat (or registration), bounded by the heartbeat interval."""
        t = self._heartbeat_interval()
        with self._lock:
            must = self._resp is None or self._reregister
        if must:
            self.register(timeout=t)
            return
        try:
            self.heartbeat(timeout=t)
        except NotFoundError as e:
            if self._on_err is not None:
                self._on_err(e)
            self.register(timeout=t)

    def _report(self, err: BaseException) -> None:
        if self._on_err is not None:
            try:
                self._on_err(err)
            except Exception:  # noqa: BLE001
                log.exception("on_heartbeat_error failed")

    def run_heartbeat(self, stop: Optional[threading.Event] = None) -> None:
        """Keeps the rank alive until ``stop`` is set (then returns). It
        registers first if :meth:`register` has not succeeded, then beats
        every half heartbeat interval; when the daemon answers NOT_FOUND (it
        declared the rank dead, or restarted) it registers again, and so it
        does on the beat after the Prefill learned a new incarnation
        elsewhere. Transient failures are retried on the next beat and passed
        to ``on_heartbeat_error``; errors repeating cannot fix
        (InvalidArgumentError, FailedPreconditionError,
        UnauthenticatedError, PermissionDeniedError, UnimplementedError) end
        the loop and are raised.

        Under Transport.STREAMS the beats are the shared session's: it keeps
        the session open (its pings are the beats), re-opens it when it
        ends, registers again when the daemon ended it NOT_FOUND or refused
        its re-open as of an earlier incarnation, and beats unary while no
        session can be opened. After :meth:`close` it raises CanceledError.
        """
        stop = stop or threading.Event()
        if self._c._transport is Transport.STREAMS:
            self._run_heartbeat_streams(stop)
            return
        wait = self._cadence() if self.registration is not None else 0.0
        while not stop.wait(wait):
            try:
                self._beat()
            except DecodeplaneError as e:
                with self._lock:
                    gone = self._deregistered
                if _permanent(e) or gone:
                    raise
                self._report(e)
            wait = self._cadence()

    def start_heartbeat(self) -> HeartbeatRunner:
        """Runs :meth:`run_heartbeat` on a daemon thread; stop it with
        :meth:`HeartbeatRunner.stop`."""
        return HeartbeatRunner(self)

    def _run_heartbeat_streams(self, stop: threading.Event) -> None:
        m = self._mux
        release = m.acquire()
        with self._lock:
            self._beating += 1
        quick = refused = 0
        unimpl = False
        try:
            while not stop.is_set():
                if m.closed():
                    raise local_error(_MUX_OP, grpc.StatusCode.CANCELLED, "the Prefill is closed")
                with self._lock:
                    must = self._resp is None or self._reregister
                if must:
                    try:
                        self._beat()  # registers
                    except DecodeplaneError as e:
                        if _permanent(e):
                            raise
                        self._report(e)
                        stop.wait(self._cadence())
                        continue
                # The open is bounded as a beat is.
                try:
                    s: Optional[PrefillSession] = m.get(Deadline(self._heartbeat_interval()))
                    err: Optional[DecodeplaneError] = None
                except DecodeplaneError as e:
                    s, err = None, e
                if err is not None and isinstance(err, (IncarnationChangedError, NotFoundError)):
                    refused += 1
                    if refused > 1 and stop.wait(self._c._retry.backoff(refused - 1)):
                        return
                else:
                    refused = 0
                if err is not None:
                    if stop.is_set():
                        return
                    if m.closed() or self._c.closed:
                        raise err
                    if isinstance(err, IncarnationChangedError):
                        self._report(err)  # learned: the next round registers again
                        continue
                    if isinstance(err, NotFoundError):
                        self._report(err)
                        with self._lock:
                            self._reregister = True
                        continue
                    if _permanent(err) and not isinstance(err, UnimplementedError):
                        raise err
                    if not isinstance(err, UnimplementedError) or not unimpl:
                        self._report(err)
                    unimpl = unimpl or isinstance(err, UnimplementedError)
                    # No session: a unary beat keeps the rank alive meanwhile.
                    try:
                        self._beat()
                    except DecodeplaneError as e:
                        if _permanent(e):
                            raise
                        self._report(e)
                    stop.wait(self._cadence())
                    continue
                assert s is not None
                opened = time.monotonic()
                while not s.wait(0.25):
                    if stop.is_set():
                        return
                if m.closed():
                    raise local_error(_MUX_OP, grpc.StatusCode.CANCELLED, "the Prefill is closed")
                end = s.error
                if isinstance(end, NotFoundError):
                    with self._lock:
                        self._reregister = True
                self._report(end if end is not None else local_error(_MUX_OP, grpc.StatusCode.UNAVAILABLE,
                                                                     "the prefill session ended"))
                # A session that keeps ending at once is not re-opened in a tight loop.
                if time.monotonic() - opened < self._cadence():
                    quick += 1
                    if stop.wait(self._c._retry.backoff(quick)):
                        return
                else:
                    quick = 0
        finally:
            with self._lock:
                self._beating -= 1
            release()

    def bind_room(self, room: int, *, timeout: Optional[float] = None) -> bool:
        """BindRoom: this rank's DP group scheduled ``room`` (SGLang's POST
        /register_dp_rank); returns whether an earlier binding was replaced.
        FailedPreconditionError: it contradicts follow_bootstrap_room."""
        req = bootstrap_pb2.BindRoomRequest(bootstrap_addr=self._rank.bootstrap_addr, room=room, dp_rank=self._rank.dp_rank)
        return self._c._invoke(_BIND_ROOM, self._c._boot_stub.BindRoom, req, timeout).replaced

    # ---- Rooms, unary ----

    def await_destination(self, room: int, *, incarnation: Optional[int] = None,
                          timeout: Optional[float] = None) -> DestinationStream:
        """AwaitDestination: claims ``room`` for this rank and returns the
        stream of its events (see DestinationStream). ``incarnation``
        (default: the one the rank holds) is the daemon incarnation the rank
        registered with. ``timeout`` bounds the whole stream."""
        op = "AwaitDestination"
        self._c._check_open(op)
        inc = self.incarnation if incarnation is None else incarnation
        req = rooms_pb2.AwaitDestinationRequest(room=room, rank=self._rank, incarnation=inc)

        def open_call(reopen: bool, remaining: Optional[float]) -> Any:
            return self._c._rooms_stub.AwaitDestination(req, metadata=self._c._md, timeout=remaining)

        s: Resumable[rooms_pb2.DestinationEvent] = Resumable(self._c, _AWAIT, retryable(_AWAIT, req), Deadline(timeout), open_call)
        return DestinationStream(s, room, inc)

    def _with_rank(self, req: Any) -> Any:
        if not req.HasField("rank"):
            req = copy_of(req)
            req.rank.CopyFrom(self._rank)
        return req

    def transfer(self, request: Optional[rooms_pb2.TransferRequest] = None, *, timeout: Optional[float] = None,
                 **fields: Any) -> rooms_pb2.TransferResponse:
        """Transfer: the daemon's transfer engine moves one chunk into the
        room's pages; returns when it landed (``rank`` defaults to this
        rank's). Errors: AbortedError (the chunk failed: the room failed),
        FailedPreconditionError (not claimed, room terminal, stale attempt),
        StaleIncarnationError, InvalidArgumentError. Retried on UNAVAILABLE:
        (room, rank, chunk_index) is the daemon's idempotency key."""
        req = self._with_rank(build(rooms_pb2.TransferRequest, request, fields))
        return self._c._invoke(_TRANSFER, self._c._rooms_stub.Transfer, req, timeout)

    def report_transfer(self, request: Optional[rooms_pb2.ReportTransferRequest] = None, *,
                        timeout: Optional[float] = None, **fields: Any) -> rooms_pb2.ReportTransferResponse:
        """ReportTransfer: a chunk the prefill moved itself, or its failure
        (which fails the room). Same errors and key as :meth:`transfer`."""
        req = self._with_rank(build(rooms_pb2.ReportTransferRequest, request, fields))
        return self._c._invoke(_REPORT, self._c._rooms_stub.ReportTransfer, req, timeout)

    def ack_room_end(self, room: int, destination: rooms_pb2.Destination, *,
                     timeout: Optional[float] = None) -> rooms_pb2.AckRoomEndResponse:
        """AckRoomEnd: this rank writes nothing more into ``destination`` (the
        room's destination of one generation). An ack from a rank that owes
        none is a no-op (``owed`` false). StaleAttemptError: the attempt is
        not the room's current one. Retried on UNAVAILABLE."""
        req = rooms_pb2.AckRoomEndRequest(room=room, rank=self._rank, attempt=destination.attempt,
                                          incarnation=destination.incarnation)
        return self._c._invoke(_ACK, self._c._rooms_stub.AckRoomEnd, req, timeout)

    # ---- Staging ----

    def setup_staging(self, *, timeout: Optional[float] = None) -> staging_pb2.SetupStagingResponse:
        """SetupStaging: this rank's staging plan against the decode instance
        (whether staging is required, head slices, writers, rings).
        NotFoundError: the instance is not registered; FailedPreconditionError
        with SGLang's messages (an MLA pool, staging not configured)."""
        req = staging_pb2.SetupStagingRequest(rank=self._rank)
        return self._c._invoke(_SETUP_STAGING, self._c._staging_stub.SetupStaging, req, timeout)

    def allocate_staging(self, room: int, chunk_index: int, num_pages: int, *, incarnation: Optional[int] = None,
                         timeout: Optional[float] = None) -> staging_pb2.AllocateStagingResponse:
        """AllocateStaging: the ring regions of one chunk, one per decode rank
        this rank writes to; write a region only once ``writable`` (or the
        watermark says so). ``incarnation`` defaults to the rank's."""
        inc = self.incarnation if incarnation is None else incarnation
        req = staging_pb2.AllocateStagingRequest(room=room, rank=self._rank, chunk_index=chunk_index,
                                                 num_pages=num_pages, incarnation=inc)
        return self._c._invoke(_ALLOCATE_STAGING, self._c._staging_stub.AllocateStaging, req, timeout)

    def chunk_ready(self, request: Optional[staging_pb2.ChunkReadyRequest] = None, *, timeout: Optional[float] = None,
                    **fields: Any) -> staging_pb2.ChunkReadyResponse:
        """ChunkReady: this rank wrote its part of a chunk's regions; the call
        that completes the writer set returns after the scatter
        (``scattered``). ``rank`` defaults to this rank's."""
        req = self._with_rank(build(staging_pb2.ChunkReadyRequest, request, fields))
        return self._c._invoke(_CHUNK_READY, self._c._staging_stub.ChunkReady, req, timeout)

    def watch_watermark(self, decode_dp_rank: int = 0, decode_tp_ranks: Iterable[int] = (), *,
                        timeout: Optional[float] = None) -> WatermarkStream:
        """WatchWatermark: the watermark of the selected decode rings (empty:
        every TP rank of the shard), then every change."""
        self._c._check_open("WatchWatermark")
        req = staging_pb2.WatchWatermarkRequest(decode_dp_rank=decode_dp_rank, decode_tp_ranks=list(decode_tp_ranks))

        def open_call(reopen: bool, remaining: Optional[float]) -> Any:
            return self._c._staging_stub.WatchWatermark(req, metadata=self._c._md, timeout=remaining)

        return WatermarkStream(Resumable(self._c, _WATCH_WATERMARK, True, Deadline(timeout), open_call,
                                         ends_with_event=False))

    # ---- sessions ----

    def session(self, *, timeout: Optional[float] = None) -> PrefillSession:
        """Opens a :class:`PrefillSession` of the rank's own (not re-opened by
        itself); ``timeout`` bounds the wait for the welcome. The rank must be
        registered: NotFoundError otherwise; a rank holding another
        incarnation: IncarnationChangedError."""
        return PrefillSession(self, timeout=timeout)

    # ---- hand-offs ----

    def send_room(self, room: int, *, chunk_pages: int = 0,
                  source: Optional[Callable[[Chunk], rooms_pb2.TransferSource]] = None,
                  output_ids: Sequence[int] = (), timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """Delivers a room's KV through the daemon's transfer engine: claims
        the room, waits for the destination, sends its pages with Transfer in
        chunks of ``chunk_pages`` (0: one chunk; the last with
        ``aux.room_marker = room`` and ``output_ids``), then waits for the
        room's end. ``source`` gives each chunk's bytes on the prefill side
        (the delegated transfer path). A dummy destination sends nothing and
        only waits.

        Returns the destination once the room succeeded, or None when it had
        succeeded before the call. Raises RoomFailedError when the room
        fails (acknowledging the room's end when the daemon asked for it),
        IncarnationChangedError when the daemon restarted (before the next
        write), or the RPCs' typed errors. ``timeout`` bounds the whole
        hand-off. The transport is the client's (see the module
        documentation)."""
        op = "SendRoom"
        dl = Deadline(timeout)
        use, release, err = self._streams(dl)
        if use:
            try:
                if err is not None:
                    self._hand_off_failed(op, room, chunk_pages, err)
                return self._hand_off(op, room, chunk_pages, self._mux.transport(),
                                      self._transfer_move(room, source, output_ids, self._mux.chunk), dl)
            finally:
                release()
        return self._hand_off(op, room, chunk_pages, self._unary_transport(),
                              self._transfer_move(room, source, output_ids, self._unary_transfer), dl)

    def report_room(self, room: int, *, move: Optional[Callable[[Chunk, threading.Event], int]] = None,
                    chunk_pages: int = 0, timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """send_room for a prefill that moves the bytes itself (as Mooncake
        prefills do): each chunk is moved by ``move(chunk, stop)``, which
        returns the bytes it moved (:meth:`Chunk.bytes`; the daemon checks
        it), then reported with ReportTransfer (the last with
        ``metadata_room_marker = room``). ``stop`` is set when the room ended
        while the rank may write (the daemon asked for an acknowledgement):
        stop writing. A ``move`` exception is reported as the chunk's
        failure, and report_room raises RoomFailedError with the exception
        as its cause. None ``move`` reports every chunk moved. A chunk whose
        report a session's end lost is reported again; ``move`` is not run
        again."""
        op = "ReportRoom"
        dl = Deadline(timeout)
        use, release, err = self._streams(dl)
        if use:
            try:
                if err is not None:
                    self._hand_off_failed(op, room, chunk_pages, err)
                return self._hand_off(op, room, chunk_pages, self._mux.transport(),
                                      self._report_move(room, move, self._mux.report), dl)
            finally:
                release()
        return self._hand_off(op, room, chunk_pages, self._unary_transport(),
                              self._report_move(room, move, self._unary_report), dl)

    def send_room_session(self, session: PrefillSession, room: int, *, chunk_pages: int = 0,
                          source: Optional[Callable[[Chunk], rooms_pb2.TransferSource]] = None,
                          output_ids: Sequence[int] = (), timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """send_room over a session of this Prefill's own (not re-opened)."""
        self._own(session, "SendRoomSession")
        return self._hand_off("SendRoomSession", room, chunk_pages, self._session_transport(session),
                              self._transfer_move(room, source, output_ids,
                                                  lambda r, dl: session.chunk(r, timeout=dl.remaining())), Deadline(timeout))

    def report_room_session(self, session: PrefillSession, room: int, *,
                            move: Optional[Callable[[Chunk, threading.Event], int]] = None, chunk_pages: int = 0,
                            timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """report_room over a session of this Prefill's own (not re-opened)."""
        self._own(session, "ReportRoomSession")
        return self._hand_off("ReportRoomSession", room, chunk_pages, self._session_transport(session),
                              self._report_move(room, move, lambda r, dl: session.report(r, timeout=dl.remaining())),
                              Deadline(timeout))

    def _own(self, session: PrefillSession, op: str) -> None:
        if session is None or session._p is not self:
            raise local_error(op, grpc.StatusCode.INVALID_ARGUMENT, "session: a session of this Prefill is required")

    def close(self) -> None:
        """Ends the rank's shared session (and the heartbeat it carries).
        Later send_room, report_room and run_heartbeat under Transport.STREAMS
        raise CanceledError; the unary methods are not affected. Idempotent."""
        self._mux.close()

    def __enter__(self) -> "Prefill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- hand-off machinery ----

    def _streams(self, dl: Deadline) -> tuple[bool, Callable[[], None], Optional[DecodeplaneError]]:
        """Whether the hand-off goes on the shared session (and the session's
        open error, which is the hand-off's)."""
        if self._c._transport is not Transport.STREAMS:
            return False, lambda: None, None
        release = self._mux.acquire()
        try:
            self._mux.get_hand_off(dl)
        except UnimplementedError:
            release()
            return False, lambda: None, None
        except DecodeplaneError as e:
            return True, release, e
        return True, release, None

    def _hand_off_failed(self, op: str, room: int, chunk_pages: int, err: DecodeplaneError) -> None:
        if chunk_pages < 0:
            raise local_error(op, grpc.StatusCode.INVALID_ARGUMENT,
                              f"chunk_pages: {chunk_pages} must be >= 0 (0 sends every page in one chunk)")
        g = self._generation()
        self._check(g, room)
        raise self._voided(g, room, err)

    def _unary_transport(self) -> _Transport:
        def claim(req: rooms_pb2.AwaitDestinationRequest, dl: Deadline) -> _ClaimStream:
            return _UnaryClaim(self.await_destination(req.room, incarnation=req.incarnation, timeout=dl.remaining()))

        def ack(room: int, dest: rooms_pb2.Destination, dl: Deadline) -> Any:
            return self.ack_room_end(room, dest, timeout=dl.remaining())
        return _Transport(claim, ack)

    def _session_transport(self, session: PrefillSession) -> _Transport:
        def claim(req: rooms_pb2.AwaitDestinationRequest, dl: Deadline) -> _ClaimStream:
            return _SessionClaimStream(session._claim(req, dl.remaining()))

        def ack(room: int, dest: rooms_pb2.Destination, dl: Deadline) -> Any:
            return session.ack(room=room, rank=self._rank, attempt=dest.attempt, incarnation=dest.incarnation,
                               timeout=dl.remaining())
        return _Transport(claim, ack)

    def _unary_transfer(self, req: rooms_pb2.TransferRequest, dl: Deadline) -> Any:
        return self._c._invoke(_TRANSFER, self._c._rooms_stub.Transfer, req, deadline=dl)

    def _unary_report(self, req: rooms_pb2.ReportTransferRequest, dl: Deadline) -> Any:
        return self._c._invoke(_REPORT, self._c._rooms_stub.ReportTransfer, req, deadline=dl)

    def _transfer_move(self, room: int, source: Optional[Callable[[Chunk], rooms_pb2.TransferSource]],
                       output_ids: Sequence[int], transfer: Callable[[rooms_pb2.TransferRequest, Deadline], Any]) -> MoveFn:
        def move(ch: Chunk, stop: threading.Event, check: Callable[[], None], dl: Deadline) -> None:
            req = rooms_pb2.TransferRequest(room=room, rank=self._rank, chunk_index=ch.index, page_offset=ch.page_offset,
                                            num_pages=ch.num_pages, last=ch.last, attempt=ch.destination.attempt,
                                            incarnation=ch.destination.incarnation)
            if source is not None:
                req.source.CopyFrom(source(ch))
            if ch.last:
                req.aux.CopyFrom(rooms_pb2.Aux(room_marker=room, output_ids=list(output_ids)))
            check()
            transfer(req, dl)
        return move

    def _report_move(self, room: int, move_fn: Optional[Callable[[Chunk, threading.Event], int]],
                     report: Callable[[rooms_pb2.ReportTransferRequest, Deadline], Any]) -> MoveFn:
        def move(ch: Chunk, stop: threading.Event, check: Callable[[], None], dl: Deadline) -> None:
            n = ch.bytes()
            move_err: Optional[BaseException] = None
            if move_fn is not None:
                try:
                    n = move_fn(ch, stop)
                except Exception as e:  # noqa: BLE001 - reported as the chunk's failure
                    move_err = e
            check()
            req = rooms_pb2.ReportTransferRequest(
                room=room, rank=self._rank, chunk_index=ch.index, page_offset=ch.page_offset, num_pages=ch.num_pages,
                last=ch.last, success=move_err is None, bytes=n if move_err is None else 0,
                attempt=ch.destination.attempt, incarnation=ch.destination.incarnation)
            if move_err is not None:
                req.failure_reason = (str(move_err) or type(move_err).__name__)[:4096]
            elif ch.last:
                req.metadata_room_marker = room
            report(req, dl)
            if move_err is not None:
                raise _MoveFailure(move_err)
        return move

    def _hand_off(self, op: str, room: int, chunk_pages: int, tr: _Transport, move: MoveFn,
                  dl: Deadline) -> Optional[rooms_pb2.Destination]:
        """Claim, move every chunk, wait for the end. The hand-off is bound to
        the incarnation the Prefill holds when it starts (or, when none is
        known yet, to the destination's)."""
        if chunk_pages < 0:
            raise local_error(op, grpc.StatusCode.INVALID_ARGUMENT,
                              f"chunk_pages: {chunk_pages} must be >= 0 (0 sends every page in one chunk)")
        g = self._generation()
        self._check(g, room)
        try:
            claim = tr.claim(rooms_pb2.AwaitDestinationRequest(room=room, rank=self._rank, incarnation=self._inc_of(g)), dl)
        except DecodeplaneError as e:
            raise self._voided(g, room, e) from None
        remove = g.on_void(claim.close)  # an incarnation change stops the claim at once
        try:
            dest = None
            while dest is None:
                try:
                    ev = claim.next(dl)
                except DecodeplaneError as e:
                    raise self._voided(g, room, e) from None
                if ev is None:
                    self._check(g, room)
                    raise local_error(op, grpc.StatusCode.CANCELLED, f"room {room}: the claim ended")
                if ev.done is not None:
                    return None
                dest = ev.destination
            self._bind(g, room, dest)
            return self._move_and_wait(g, room, claim, dest, chunk_pages, tr, move, dl)
        finally:
            remove()
            claim.close()

    def _bind(self, g: _Generation, room: int, dest: rooms_pb2.Destination) -> None:
        """Binds a hand-off of g to its destination's incarnation; another one
        than g's means the daemon changed (learned: g is void)."""
        inc = dest.incarnation
        if not inc:
            return
        with self._lock:
            old = g.inc
            if old == 0 and self._gen is g:
                g.inc = inc
        if old == 0 or old == inc:
            self._check(g, room)
            return
        self._learn(inc, False)
        raise IncarnationChangedError(room=room, old=old, new=inc)

    def _move_and_wait(self, g: _Generation, room: int, claim: _ClaimStream, dest: rooms_pb2.Destination,
                       chunk_pages: int, tr: _Transport, move: MoveFn, dl: Deadline) -> rooms_pb2.Destination:
        """Moves every chunk while a watcher reads the claim. When the claim
        ends the room with a failure that asks for an acknowledgement, writing
        stops at once (``stop`` is set, no further chunk is moved or
        reported); once nothing writes any more, a rank the claim told to
        acknowledge, or whose own chunk revealed the room's failure, sends
        AckRoomEnd (best effort, bounded by ACK_TIMEOUT)."""
        stop = threading.Event()
        stop_err: list[Optional[RoomFailedError]] = [None]
        ended: ClosableQueue[tuple[bool, Optional[BaseException]]] = ClosableQueue()

        def watch() -> None:
            try:
                while True:
                    ev = claim.next(dl)
                    if ev is None:
                        ended.put((False, local_error("AwaitDestination", grpc.StatusCode.CANCELLED, "the claim ended")))
                        return
                    if ev.done is not None:
                        ended.put((True, None))
                        return
                    # Another destination cannot come on this claim: skipped.
            except BaseException as e:  # noqa: BLE001 - handed to the hand-off
                if isinstance(e, RoomFailedError) and e.ack_required:
                    stop_err[0] = e
                    stop.set()  # the room ended while this rank may write: stop writing
                ended.put((False, e))

        t = threading.Thread(target=watch, name=f"decodeplane-claim-{room}", daemon=True)
        t.start()
        got = False
        try:
            def check() -> None:
                self._check(g, room)
                if stop.is_set() and stop_err[0] is not None:
                    raise stop_err[0]

            move_err: Optional[BaseException] = None
            if not dest.dummy:
                for ch in chunks(dest, chunk_pages):
                    try:
                        check()
                        move(ch, stop, check, dl)
                    except (DecodeplaneError, _MoveFailure) as e:
                        move_err = e
                        break
            if move_err is None:
                ok, end_err = ended.get()
                got = True
                if ok:
                    return dest
                assert end_err is not None
                self._ack_if_owed(tr, room, dest, end_err, False)
                raise self._voided(g, room, end_err)
            # Nothing writes any more. The error as before: the claim's end
            # when it stopped the writes, else what the chunk revealed.
            item = ended.get_nowait()
            end_err = None
            if item is not None:
                got = True
                end_err = item[1]
            if end_err is not None and (move_err is end_err or move_err is stop_err[0]):
                self._ack_if_owed(tr, room, dest, end_err, False)
                raise self._voided(g, room, end_err)
            v = self._voided(g, room, move_err.err if isinstance(move_err, _MoveFailure) else move_err)
            if isinstance(v, IncarnationChangedError):
                raise v
            err = self._explain(room, move_err, dl)
            if isinstance(err, RoomFailedError) and end_err is None:
                try:
                    end_err = ended.get(ACK_WAIT)[1]
                    got = True
                except TimeoutError:
                    pass
            self._ack_if_owed(tr, room, dest, end_err, isinstance(err, RoomFailedError))
            raise err
        finally:
            if not got:
                claim.close()
                t.join(ACK_TIMEOUT)

    def _ack_if_owed(self, tr: _Transport, room: int, dest: rooms_pb2.Destination, err: Optional[BaseException],
                     failed: bool) -> None:
        """Sends AckRoomEnd when the claim's end asked for it, or when the room
        failed while this rank held its destination (best effort)."""
        if not (isinstance(err, RoomFailedError) and err.ack_required) and not failed:
            return
        try:
            tr.ack(room, dest, Deadline(ACK_TIMEOUT))
        except DecodeplaneError as e:
            log.debug("room %d: AckRoomEnd failed: %s", room, e)

    def _explain(self, room: int, err: BaseException, dl: Deadline) -> BaseException:
        """A chunk's error as the room's failure when the room failed (a chunk
        answered ABORTED or FAILED_PRECONDITION, or a move failed)."""
        if isinstance(err, _MoveFailure):
            cause: BaseException = err.err
        elif (isinstance(err, (AbortedError, FailedPreconditionError))
              and not isinstance(err, (RoomFailedError, IncarnationChangedError))):
            cause = err
        else:
            return err
        try:
            r = self._c._invoke(_GET_ROOM, self._c._rooms_stub.GetRoom, rooms_pb2.GetRoomRequest(room=room),
                                deadline=Deadline(dl.cap(ACK_TIMEOUT)))
        except DecodeplaneError:
            return cause
        if r.phase != _FAILED:
            return cause
        return RoomFailedError(room, r.failure, op="ReportRoom" if isinstance(err, _MoveFailure) else "SendRoom",
                               cause=cause)

