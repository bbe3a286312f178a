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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import grpc

from decodeplane._core import Deadline, Resumable, log
from decodeplane._handoff import ACK_TIMEOUT, ACK_WAIT, Chunk, _Generation, _HandOffs, _permanent, chunks
from decodeplane._prefill_mux import _PrefillMux
from decodeplane.client import Transport, build, copy_of
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    NotFoundError,
    StaleIncarnationError,
    UnimplementedError,
    local_error,
)
from decodeplane.prefill_session import _MUX_OP, PrefillSession, SessionClaim
from decodeplane.retry import retryable
from decodeplane.streams import DestinationStream, WatermarkStream
from decodeplane.v1 import bootstrap_pb2, common_pb2, rooms_pb2, staging_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["Prefill", "PrefillSession", "SessionClaim", "Chunk", "HeartbeatRunner", "chunks",
           "ACK_TIMEOUT", "ACK_WAIT", "DEFAULT_HEARTBEAT_INTERVAL"]

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
_SETUP_STAGING = "/decodeplane.v1.Staging/SetupStaging"
_ALLOCATE_STAGING = "/decodeplane.v1.Staging/AllocateStaging"
_CHUNK_READY = "/decodeplane.v1.Staging/ChunkReady"
_WATCH_WATERMARK = "/decodeplane.v1.Staging/WatchWatermark"


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


class Prefill(_HandOffs):
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
        #: The fleet's offers (decodeplane.fleet), for a FleetPrefill's member: its sessions ask for them.
        self._offers: Any = None
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

    def shared_session(self) -> Optional[PrefillSession]:
        """The rank's shared session (Transport.STREAMS) when one is up, else
        None: :meth:`run_heartbeat` keeps it open (its pings are the beats)
        and opens a new one when it ended; send_room and report_room use it.
        For callers that drive their own claims, chunks and acks on it."""
        return self._mux.live()

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

