"""A prefill rank's multiplexed stream (:class:`PrefillSession`), opened with
:meth:`decodeplane.prefill.Prefill.session`, and a room's claim on it
(:class:`SessionClaim`).

Hello/welcome, then claims, chunks, reports and acks as ops with increasing
seq numbers, answered by results matched by seq (futures), and each claimed
room's events (the destination, then the room's end) handed to its
:class:`SessionClaim`. One writer (gRPC's sending thread consumes the send
queue, packing what was queued meanwhile into ``PrefillRequest.more`` once
the daemon's header said it reads it) and one reader thread. It is not
re-opened by itself: when it ends, register again if needed, open another
and claim again (the daemon re-delivers).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable, Optional

import grpc

from decodeplane._core import MAX_REQUESTS_PER_MESSAGE, PACK_KEY, PACK_MORE, ClosableQueue, Deadline, Outbox, log
from decodeplane.client import build
from decodeplane.errors import (
    ERROR_DOMAIN,
    DecodeplaneError,
    IncarnationChangedError,
    RoomFailedError,
    StaleIncarnationError,
    from_rpc_error,
    local_error,
    make_error,
    status_code,
    unprefix,
)
from decodeplane.streams import ClaimEvent
from decodeplane.v1 import prefill_session_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.prefill import Prefill

__all__ = ["PrefillSession", "SessionClaim"]

_MUX_OP = "PrefillSession"


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
        #: The claims the daemon made for the session (offers: a FleetPrefill's member), by room.
        self._offered: dict[int, SessionClaim] = {}
        self._end: Optional[BaseException] = None
        self._done = threading.Event()
        self._closing = False
        self._outbox: Outbox[prefill_session_pb2.PrefillRequest] = Outbox(
            idle=prefill._cadence(),
            idle_message=lambda: prefill_session_pb2.PrefillRequest(ping=prefill_session_pb2.PrefillPing()))
        self._outbox.push(prefill_session_pb2.PrefillRequest(hello=prefill_session_pb2.PrefillHello(
            rank=prefill._rank, instance_id=prefill._reg.instance_id, incarnation=prefill.incarnation,
            offers=prefill._offers is not None)))
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
            offered, self._offered = self._offered, {}
        if offered and self._p._offers is not None:
            self._p._offers.lost(self, offered)  # decodeplane.fleet
        claims += offered.values()
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
        elif which == "room" and ev.room.claim_seq == 0:
            if self._p._offers is not None:
                self._p._offers.session_event(self, ev.room)  # an offer's (decodeplane.fleet)
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
            claims = self._offered if cl.seq == 0 else self._claims
            if claims.get(cl.room) is cl:
                del claims[cl.room]

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

    def claim_async(self, room: int, *, incarnation: Optional[int] = None) -> tuple[SessionClaim, Future[Any]]:
        """:meth:`claim` without waiting: the claim (its events come once the
        op succeeded) and the op's future (its exception is the claim's
        refusal, or the session's end; the claim then gets no events)."""
        inc = self._p.incarnation if incarnation is None else incarnation
        req = rooms_pb2.AwaitDestinationRequest(room=room, incarnation=inc)
        cl = SessionClaim(self, room, inc)
        fut = self._submit("AwaitDestination", "claim.", prefill_session_pb2.PrefillRequest(claim=req), "claim", claim=cl)

        def forget(f: Future[Any]) -> None:
            if f.exception() is not None:
                self._forget(cl)
        fut.add_done_callback(forget)
        return cl, fut

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

