"""The prefill side of the plugin, free of SGLang: one :class:`PrefillSide`
per prefill scheduler process (one attention TP/CP/PP rank) registers the
rank with the daemon and keeps it alive through the rank's shared
PrefillSession (its pings are the heartbeats); one :class:`SenderCore` per
request claims the room on that session, moves each chunk SGLang sends with
the :class:`~decodeplane.sglang.mover.Mover` and reports it
(ReportTransfer), and acknowledges the room's end when the claim says the
rank owes it (AckRoomEnd).

Nothing here blocks SGLang's scheduler thread: claims are made and read
without waiting (each ``poll`` takes what arrived), moves and reports run
on the side's mover threads (one chunk of a room at a time, in order).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Optional, Union

import numpy as np

from decodeplane import Chunk, Client, Prefill
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    NotFoundError,
    RoomFailedError,
    StaleIncarnationError,
)
from decodeplane.prefill_session import PrefillSession, SessionClaim
from decodeplane.sglang.config import Settings
from decodeplane.sglang.mover import ChunkJob, MoveStopped, Mover
from decodeplane.v1 import bootstrap_pb2, rooms_pb2

__all__ = ["PrefillSide", "SenderCore"]

log = logging.getLogger("decodeplane.sglang")

_FAILED_POLL, _BOOT, _WAIT, _XFER, _OK = 0, 1, 2, 3, 4
#: How often an acknowledgement to a restarted daemon is tried again while
#: it does not know the room yet (the decode engine re-declares it).
ACK_RETRY = 0.2


class PrefillSide:
    """One prefill rank's link to the daemon. ``registration`` describes the
    rank under its default bootstrap address; a request naming another
    address registers the rank under that one too (routers may name the
    instance otherwise than it names itself)."""

    def __init__(self, settings: Settings, client: Client, registration: bootstrap_pb2.RegisterPrefillRequest,
                 mover: Mover) -> None:
        self.settings = settings
        self.client = client
        self.mover = mover
        self._reg = registration
        self._lock = threading.Lock()
        self._ranks: dict[str, Prefill] = {}
        self._runners: list[Any] = []
        self.pool = ThreadPoolExecutor(max_workers=settings.mover_threads, thread_name_prefix="decodeplane-mover")
        self._acks: Deque[tuple[float, Prefill, int, int]] = collections.deque()
        self._ack_wake = threading.Event()
        self._closed = threading.Event()
        self._acker = threading.Thread(target=self._ack_loop, name="decodeplane-acks", daemon=True)
        self._acker.start()

    def start(self) -> None:
        """Registers the rank under its default address and starts its
        heartbeat. Raises RuntimeError for a registration the daemon refuses
        (a page size or dtype mismatch: SGLang's message); an unreachable
        daemon is retried by the heartbeat."""
        p = self._add(self._reg.bootstrap_addr)
        try:
            p.register(timeout=self.settings.rpc_timeout)
        except DecodeplaneError as e:
            from decodeplane._handoff import _permanent

            if _permanent(e):
                raise RuntimeError(f"decodeplane: the daemon at {self.settings.target} refused this prefill rank's "
                                   f"registration: {e.message}") from e
            log.warning("decodeplane: registering with %s failed (%s); the heartbeat retries", self.settings.target, e)

    def _add(self, addr: str) -> Prefill:
        with self._lock:
            p = self._ranks.get(addr)
            if p is not None:
                return p
            reg = bootstrap_pb2.RegisterPrefillRequest()
            reg.CopyFrom(self._reg)
            reg.bootstrap_addr = addr
            p = self.client.prefill(reg, on_heartbeat_error=lambda e, a=addr: log.debug("decodeplane: %s: %s", a, e))
            self._ranks[addr] = p
            self._runners.append(p.start_heartbeat())
            return p

    def rank(self, addr: str) -> Prefill:
        """The rank under ``addr`` (registered in the background when new)."""
        return self._add(addr)

    def ack_later(self, p: Prefill, room: int, attempt: int) -> None:
        """AckRoomEnd for a destination of a daemon incarnation that is gone:
        sent to the new daemon (incarnation 0) until it knows the room again
        (the decode engine re-declares it) or DECODEPLANE_SGLANG_RESTART_DRAIN
        passes."""
        with self._lock:
            self._acks.append((time.monotonic() + self.settings.restart_drain, p, room, attempt))
        self._ack_wake.set()

    def _ack_loop(self) -> None:
        while not self._closed.is_set():
            self._ack_wake.wait(ACK_RETRY)
            self._ack_wake.clear()
            with self._lock:
                todo, self._acks = list(self._acks), collections.deque()
            again = []
            for until, p, room, attempt in todo:
                try:
                    p.ack_room_end(room, rooms_pb2.Destination(attempt=attempt), timeout=self.settings.rpc_timeout)
                except NotFoundError:
                    if time.monotonic() < until:
                        again.append((until, p, room, attempt))
                except DecodeplaneError as e:
                    log.warning("decodeplane: room %d: AckRoomEnd to the restarted daemon failed: %s", room, e)
            with self._lock:
                self._acks.extend(again)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        self._ack_wake.set()
        with self._lock:
            runners, ranks = list(self._runners), list(self._ranks.values())
        for r in runners:
            r.stop(5)
        for p in ranks:
            p.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.mover.close()
        self.client.close()


_Job = Union[ChunkJob, str]  # a chunk, or "ack"


class SenderCore:
    """One request's hand-off from one prefill rank (see the module
    documentation)."""

    def __init__(self, side: PrefillSide, room: int, bootstrap_addr: str, bootstrap_timeout: float = 300.0) -> None:
        self.side = side
        self._deadline = time.monotonic() + bootstrap_timeout
        self.room = room
        self.addr = bootstrap_addr
        self._p = side.rank(bootstrap_addr)
        self._lock = threading.Lock()
        self._claim: Optional[SessionClaim] = None
        self._claim_fut: Optional[Future[Any]] = None
        self.dest: Optional[rooms_pb2.Destination] = None
        self.done = False
        self.failure = ""
        self.from_other = False
        self.num_pages = -1
        self.aux_index: Optional[int] = None
        self._sent = 0
        self._chunks = 0
        self._bytes = 0
        self._first_send = 0.0
        self._finished_at = 0.0
        self._stop = threading.Event()
        self._jobs: Deque[_Job] = collections.deque()
        self._running = False
        self._acked = False
        self._cleared = False

    # ---- SGLang's calls (the scheduler thread) ----

    def poll(self) -> int:
        self._pump()
        with self._lock:
            if self.dest is None and not self.failure and not self.done and time.monotonic() >= self._deadline:
                self._fail(f"room {self.room}: no destination from decodeplane ({self.side.settings.target}) within "
                           "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")
                self._close_claim()
            if self.failure:
                return _FAILED_POLL
            if self.done:
                return _OK
            if self.dest is None:
                return _BOOT
            return _XFER if self._sent or self._chunks else _WAIT

    def init(self, num_pages: int, aux_index: Optional[int]) -> None:
        with self._lock:
            self.num_pages, self.aux_index = int(num_pages), aux_index
            d = self.dest
            if d is not None and not d.dummy and self.num_pages != len(d.page_indices):
                self._fail(f"room {self.room}: SGLang's prefill will send {self.num_pages} pages, but the decode engine "
                           f"declared {len(d.page_indices)} beyond its prefix of {d.decode_prefix_len} tokens")

    def decode_prefix_len(self) -> int:
        with self._lock:
            return int(self.dest.decode_prefix_len) if self.dest is not None else 0

    def send(self, kv_indices: Any, state_indices: Optional[list[Any]] = None) -> None:
        """Queues one chunk (the prefill pages ``kv_indices``, the next ones of
        the destination) for the mover threads."""
        pages = np.asarray(kv_indices, dtype=np.int64).reshape(-1)
        with self._lock:
            d = self.dest
            if self.failure or d is None:
                if d is None and not self.failure:
                    self._fail(f"room {self.room}: SGLang sent a chunk before the room's destination arrived")
                return
            if not self._first_send:
                self._first_send = time.monotonic()
            if d.dummy:
                return
            last = self._sent + len(pages) >= (self.num_pages if self.num_pages >= 0 else len(d.page_indices))
            job = ChunkJob(room=self.room, destination=d, page_offset=self._sent, src_pages=pages, last=last,
                           aux_index=self.aux_index, state_indices=state_indices, stop=self._stop)
            self._sent += len(pages)
            self._enqueue(job)

    def abort(self) -> None:
        """AbortReq on the prefill: the room fails (the rank reports its
        hand-off failed), or, before its destination came, the claim is
        withdrawn."""
        with self._lock:
            if self.done or self.failure:
                return
            self._fail("Aborted by AbortReq.")
            if self.dest is None or self.dest.dummy:
                self._close_claim()
                return
            self._stop.set()
            self._enqueue("abort")

    def clear(self) -> None:
        """SGLang is done with the request. One that has not ended here (its
        poll failed on another rank) is given up: the rank reports its
        hand-off failed, stops writing and acknowledges the end."""
        with self._lock:
            self._cleared = True
            if not self.done and not self.failure:
                self._fail("SGLang dropped the request (its hand-off failed on another prefill rank)", from_other=True)
                if self.dest is not None and not self.dest.dummy:
                    self._stop.set()
                    self._enqueue("abort")
            if not self._running and not self._jobs:
                self._close_claim()

    def fail(self, message: str) -> None:
        """Fails the hand-off before it started (SGLang's own checks)."""
        with self._lock:
            self._fail(message)
            self._close_claim()

    def transfer_seconds(self) -> Optional[float]:
        with self._lock:
            if not self._first_send or not self._finished_at:
                return None
            return self._finished_at - self._first_send

    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    # ---- the claim ----

    def _pump(self) -> None:
        """Makes the claim when there is none (on the shared session, without
        waiting) and takes the events that arrived."""
        with self._lock:
            if self.done or (self.failure and self._claim is None):
                return
            cl, fut = self._claim, self._claim_fut
        if cl is None:
            self._make_claim()
            return
        if fut is not None and fut.done():
            err = fut.exception()
            if err is not None:
                self._claim_refused(err)
                return
        self._check_incarnation()
        while True:
            try:
                ev = cl.next(timeout=0)
            except TimeoutError:
                return
            except RoomFailedError as e:
                self._room_failed(e)
                return
            except IncarnationChangedError as e:
                self._void(e.new)
                return
            except DecodeplaneError as e:
                if e._stream_end:  # the session ended: claim again on the next one
                    with self._lock:
                        self._claim, self._claim_fut = None, None
                    return
                with self._lock:
                    self._fail(f"room {self.room}: the claim ended: {e.message}")
                return
            if ev is None:
                return
            with self._lock:
                if ev.done is not None:
                    self.done, self._finished_at = True, time.monotonic()
                    return
                d = ev.destination
                if d is not None and (self.dest is None or self.dest.attempt != d.attempt):
                    self.dest = d
                    if self.num_pages >= 0 and not d.dummy and self.num_pages != len(d.page_indices):
                        self._fail(f"room {self.room}: SGLang's prefill sends {self.num_pages} pages, the decode "
                                   f"engine declared {len(d.page_indices)}")

    def _make_claim(self) -> None:
        s = self._p.shared_session()
        if s is None:
            return  # the heartbeat opens it (after registering)
        inc = self._p.incarnation
        with self._lock:
            d = self.dest
        if d is not None and d.incarnation and inc and d.incarnation != inc:
            self._void(inc)
            return
        try:
            cl, fut = s.claim_async(self.room, incarnation=d.incarnation if d is not None else inc)
        except DecodeplaneError:
            return  # the session ended under the op: the next poll claims on the next one
        with self._lock:
            self._claim, self._claim_fut = cl, fut

    def _claim_refused(self, err: BaseException) -> None:
        with self._lock:
            self._claim, self._claim_fut = None, None
        if isinstance(err, (StaleIncarnationError, IncarnationChangedError)):
            self._void(getattr(err, "new", 0))
        elif isinstance(err, DecodeplaneError) and (err._stream_end or isinstance(err, NotFoundError)):
            return  # the session ended, or the rank is being registered again: claim again
        else:
            with self._lock:
                self._fail(f"room {self.room}: decodeplane refused this rank's claim: {getattr(err, 'message', err)}")

    def _check_incarnation(self) -> None:
        inc = self._p.incarnation
        with self._lock:
            d = self.dest
        if d is not None and d.incarnation and inc and inc != d.incarnation and not self.done:
            self._void(inc)

    def _void(self, new: int) -> None:
        """The daemon restarted: this destination is void. Writing stops; once
        nothing writes, the rank acknowledges to the new daemon, which holds
        the pages of the hand-offs the decode engine re-declares until then."""
        with self._lock:
            if self.failure and self._acked:
                return
            old = self.dest.incarnation if self.dest is not None else 0
            self._fail(f"the decodeplane daemon restarted (incarnation {old:x}, now {new:x}): room {self.room}'s "
                       "destination is void")
            had = self.dest is not None and not self.dest.dummy
            self._stop.set()
            self._close_claim()
            if had:
                self._enqueue("restart-ack")

    def _room_failed(self, e: RoomFailedError) -> None:
        with self._lock:
            self._fail(e.message or f"room {self.room} failed", from_other=True)
            self._close_claim()
            if e.ack_required:
                self._stop.set()
                self._enqueue("ack")

    # ---- the mover threads ----

    def _enqueue(self, job: _Job) -> None:
        """Queues job (lock held) and starts the room's drain if idle."""
        self._jobs.append(job)
        if not self._running:
            self._running = True
            try:
                self.side.pool.submit(self._drain)
            except RuntimeError:  # the side is closed
                self._running = False

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._running = False
                    if self._cleared:
                        self._close_claim()
                    return
                job = self._jobs.popleft()
            try:
                self._run(job)
            except Exception:  # noqa: BLE001 - one room's bug must not stop the others
                log.exception("decodeplane: room %d: a chunk's move failed unexpectedly", self.room)

    def _run(self, job: _Job) -> None:
        if job == "ack" or job == "restart-ack":
            self._ack(job == "restart-ack")
            return
        if job == "abort":
            with self._lock:
                reason = self.failure
            self._report_failure(f"prefill: {reason}")
            self._ack(False)
            return
        assert isinstance(job, ChunkJob)
        if self._stop.is_set():
            return  # the room ended here: nothing more is written
        try:
            delegate = self.side.mover.transfer_request(job)
            if delegate is None:
                self.side.mover.move(job)
        except MoveStopped:
            return
        except Exception as e:  # noqa: BLE001 - the chunk failed: the room fails with its message
            msg = str(e) or type(e).__name__
            with self._lock:
                self._fail(f"room {self.room}: moving a chunk failed: {msg}")
                self._stop.set()
            self._report_failure(msg[:4096])
            self._ack(False)
            return
        if delegate is not None:
            self._transfer(job, delegate)
            return
        self._report(job)

    def _transfer(self, job: ChunkJob, req: rooms_pb2.TransferRequest) -> None:
        """Sends a chunk the daemon's transfer agent moves (the Transfer op);
        a refusal that leaves the room running fails it with the reason."""
        d = job.destination
        with self._lock:
            req.chunk_index = self._chunks
            self._chunks += 1
        req.attempt, req.incarnation = d.attempt, d.incarnation
        got: list[Any] = []

        def call(s: PrefillSession) -> None:
            try:
                got.append(s.chunk(req, timeout=self.side.settings.rpc_timeout))
            except (StaleIncarnationError, IncarnationChangedError):
                raise
            except DecodeplaneError as e:
                if e._stream_end:
                    raise
                got.append(e)
        if not self._send(call) or not got:
            return
        if not isinstance(got[0], DecodeplaneError):
            with self._lock:
                self._bytes += got[0].bytes
            return
        self.side.mover.chunk_failed()
        msg = got[0].message
        with self._lock:
            self._fail(f"room {self.room}: moving a chunk failed: {msg}")
            self._stop.set()
        self._report_failure(msg[:4096])  # refused when the room failed already: nothing changes

    def _report(self, job: ChunkJob) -> None:
        d = job.destination
        with self._lock:
            index = self._chunks
            self._chunks += 1
        n = Chunk(d, index, job.page_offset, len(job.src_pages), job.last).bytes()
        req = rooms_pb2.ReportTransferRequest(room=self.room, chunk_index=index, page_offset=job.page_offset,
                                              num_pages=len(job.src_pages), last=job.last, success=True, bytes=n,
                                              attempt=d.attempt, incarnation=d.incarnation)
        if job.last:
            req.metadata_room_marker = self.room
        if self._send(lambda s: s.report(req, timeout=self.side.settings.rpc_timeout)):
            with self._lock:
                self._bytes += n

    def _report_failure(self, reason: str) -> None:
        d = self.dest
        if d is None:
            return
        with self._lock:
            index = self._chunks
            self._chunks += 1
        req = rooms_pb2.ReportTransferRequest(room=self.room, chunk_index=index, page_offset=0, num_pages=0,
                                              last=False, success=False, failure_reason=(reason or "failed")[:4096],
                                              attempt=d.attempt, incarnation=d.incarnation)
        self._send(lambda s: s.report(req, timeout=self.side.settings.rpc_timeout))

    def _ack(self, restarted: bool) -> None:
        with self._lock:
            if self._acked:
                return
            self._acked = True
            d = self.dest
        if d is None:
            return
        if restarted:
            self.side.ack_later(self._p, self.room, d.attempt)
            return
        req = rooms_pb2.AckRoomEndRequest(room=self.room, attempt=d.attempt, incarnation=d.incarnation)
        self._send(lambda s: s.ack(req, timeout=self.side.settings.rpc_timeout))

    def _send(self, call: Callable[[PrefillSession], Any]) -> bool:
        """Runs an op on the rank's shared session, on the next one when the
        session ended under it (within the RPC timeout). False when it failed
        (logged; the claim's events say what became of the room)."""
        end = time.monotonic() + self.side.settings.rpc_timeout
        while True:
            s = self._p.shared_session()
            if s is not None:
                try:
                    call(s)
                    return True
                except (StaleIncarnationError, IncarnationChangedError) as e:
                    self._void(getattr(e, "new", 0))
                    return False
                except DecodeplaneError as e:
                    if not e._stream_end:
                        log.info("decodeplane: room %d: %s", self.room, e)
                        return False
            if time.monotonic() >= end or self.side.closed or (self._stop.is_set() and not self._acked):
                return False
            time.sleep(0.02)

    # ---- (lock held) ----

    def _fail(self, message: str, from_other: bool = False) -> None:
        if not self.failure:
            self.failure, self.from_other = message, from_other
            self._finished_at = time.monotonic()

    def _close_claim(self) -> None:
        cl = self._claim
        self._claim, self._claim_fut = None, None
        if cl is not None:
            cl.close()
