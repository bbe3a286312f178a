"""A prefill rank's hand-off of one room (claim, chunks, the room's end,
the acknowledgement), shared by :meth:`decodeplane.prefill.Prefill.send_room`
and :meth:`~decodeplane.prefill.Prefill.report_room` and their session
forms; the chunk (:class:`Chunk`) and the incarnation a hand-off is bound to.
Internal to :mod:`decodeplane.prefill`, except :class:`Chunk` and
:func:`chunks`."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import grpc

from decodeplane._core import ClosableQueue, Deadline, log
from decodeplane._prefill_mux import _ClaimStream, _SessionClaimStream, _Transport, _UnaryClaim
from decodeplane.client import Transport
from decodeplane.errors import (
    AbortedError,
    DecodeplaneError,
    FailedPreconditionError,
    IncarnationChangedError,
    InvalidArgumentError,
    PermissionDeniedError,
    RoomFailedError,
    UnauthenticatedError,
    UnimplementedError,
    local_error,
)
from decodeplane.v1 import common_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client
    from decodeplane.prefill_session import PrefillSession

__all__ = ["Chunk", "chunks", "ACK_TIMEOUT", "ACK_WAIT"]

#: Bound of the acknowledgement a hand-off sends when its room ended while
#: it held the destination (best effort: the daemon releases the pages at
#: its release.deferred_timeout anyway).
ACK_TIMEOUT = 5.0
#: How long a hand-off whose own chunk revealed the room's failure waits for
#: the claim's end (and its ack_required) before it gives up acknowledging.
ACK_WAIT = 2.0

_TRANSFER = "/decodeplane.v1.Rooms/Transfer"
_REPORT = "/decodeplane.v1.Rooms/ReportTransfer"
_GET_ROOM = "/decodeplane.v1.Rooms/GetRoom"
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


class _HandOffs:
    """The hand-off machinery of :class:`decodeplane.prefill.Prefill` (a mixin:
    the Prefill holds the client, the rank, the incarnation and the shared
    session it uses)."""

    _c: "Client"
    _rank: common_pb2.PrefillRank
    _lock: threading.Lock
    _gen: Optional[_Generation]

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


