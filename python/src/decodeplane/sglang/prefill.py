"""The prefill side of the plugin, free of SGLang: one :class:`PrefillSide`
per prefill scheduler process (one attention TP/CP/PP rank) registers the
rank with the daemon and keeps it alive through the rank's shared
PrefillSession (its pings are the heartbeats); one :class:`SenderCore` per
request claims the room on that session, moves each chunk SGLang sends with
the :class:`~decodeplane.sglang.mover.Mover` and reports it
(ReportTransfer), and acknowledges the room's end when the claim says the
rank owes it (AckRoomEnd).

In a fleet of decode daemons (``DECODEPLANE_SGLANG_FLEET``) the rank is a
:class:`~decodeplane.FleetPrefill`: registered through DECODEPLANE_TARGET,
it holds a session with every daemon of the fleet, and the daemon that
holds a room offers it there. The sender takes the room's offer (the claim
the owner made for the rank) instead of claiming, and reports and
acknowledges on the owner's session: the prefill never needs to know which
decode instance opened the room. When the owner's session stays down for
DECODEPLANE_SGLANG_RPC_TIMEOUT, or the owner leaves the fleet, the room
fails here (the decode side fails it with its daemon).

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

from decodeplane import Chunk, Client, FleetPrefill, Prefill
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    NotFoundError,
    RoomFailedError,
    StaleIncarnationError,
    UnimplementedError,
)
from decodeplane.prefill_session import PrefillSession, SessionClaim
from decodeplane.sglang.config import Settings, client_options
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
        self._fleets: dict[str, FleetPrefill] = {}
        #: Whether the rank is a fleet's (decided at start).
        self.fleet = False
        self._runners: list[Any] = []
        self.pool = ThreadPoolExecutor(max_workers=settings.mover_threads, thread_name_prefix="decodeplane-mover")
        self._acks: Deque[tuple[float, Prefill, int, int]] = collections.deque()
        self._ack_wake = threading.Event()
        self._closed = threading.Event()
        self._acker = threading.Thread(target=self._ack_loop, name="decodeplane-acks", daemon=True)
        self._acker.start()

    def start(self) -> None:
        """Decides whether the rank is a fleet's (DECODEPLANE_SGLANG_FLEET),
        registers the rank under its default address and starts its
        heartbeat (a fleet's rank also opens its sessions with the fleet's
        daemons). Raises RuntimeError for a registration the daemon refuses
        (a page size or dtype mismatch: SGLang's message); an unreachable
        daemon is retried by the heartbeat."""
        self.fleet = self._is_fleet()
        addr = self._reg.bootstrap_addr
        f = self._add_fleet(addr, start=False) if self.fleet else None
        p = f.seed if f is not None else self._add(addr)
        try:
            p.register(timeout=self.settings.rpc_timeout)
            if f is not None:
                f.refresh()  # the fleet's sessions before the first request, not a refresh period later
        except DecodeplaneError as e:
            from decodeplane._handoff import _permanent

            if _permanent(e):
                raise RuntimeError(f"decodeplane: the daemon at {self.settings.target} refused this prefill rank's "
                                   f"registration: {e.message}") from e
            log.warning("decodeplane: registering with %s failed (%s); the heartbeat retries", self.settings.target, e)
        if f is not None:
            f.start()

    def _is_fleet(self) -> bool:
        mode = self.settings.fleet
        if mode != "auto":
            return mode == "on"
        try:
            resp = self.client.admin.get_fleet(timeout=self.settings.rpc_timeout)
        except UnimplementedError:
            return False  # a daemon without the Fleet service: no fleet, no offers
        except DecodeplaneError as e:
            log.warning("decodeplane: DECODEPLANE_SGLANG_FLEET=auto: the daemon at %s did not say whether it is a fleet "
                        "member (%s): this prefill rank runs as a fleet's (which serves one daemon as well); set "
                        "DECODEPLANE_SGLANG_FLEET=on or off to decide", self.settings.target, e)
            return True
        return resp.registry.backend == "etcd"

    def _add(self, addr: str) -> Prefill:
        with self._lock:
            p = self._ranks.get(addr)
            if p is not None:
                return p
            p = self.client.prefill(self._registration(addr),
                                    on_heartbeat_error=lambda e, a=addr: log.debug("decodeplane: %s: %s", a, e))
            self._ranks[addr] = p
            self._runners.append(p.start_heartbeat())
            return p

    def _registration(self, addr: str) -> bootstrap_pb2.RegisterPrefillRequest:
        reg = bootstrap_pb2.RegisterPrefillRequest()
        reg.CopyFrom(self._reg)
        reg.bootstrap_addr = addr
        return reg

    def _add_fleet(self, addr: str, start: bool = True) -> FleetPrefill:
        with self._lock:
            f = self._fleets.get(addr)
            if f is not None:
                return f
            f = FleetPrefill(self.settings.target, self._registration(addr), client_options=client_options(self.settings),
                             on_error=lambda d, e, a=addr: log.debug("decodeplane: %s via %s: %s", a, d, e))
            self._fleets[addr] = f
        if start:
            f.start()
        return f

    def rank(self, addr: str) -> Prefill:
        """The rank under ``addr`` (registered in the background when new);
        in a fleet, its Prefill on DECODEPLANE_TARGET."""
        if self.fleet:
            return self._add_fleet(addr).seed
        return self._add(addr)

    def fleet_rank(self, addr: str) -> Optional[FleetPrefill]:
        """In a fleet, the rank under ``addr`` (registered in the background
        when new); None otherwise."""
        return self._add_fleet(addr) if self.fleet else None

    def bind_room(self, addr: str, room: int) -> None:
        """BindRoom for the rank under ``addr``: on every daemon of a fleet
        (the room's daemon is not known before its DP rank resolved)."""
        if self.fleet:
            self._add_fleet(addr).bind_room(room, timeout=self.settings.rpc_timeout)
        else:
            self._add(addr).bind_room(room, timeout=self.settings.rpc_timeout)

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
            runners, ranks, fleets = list(self._runners), list(self._ranks.values()), list(self._fleets.values())
        for r in runners:
            r.stop(5)
        for p in ranks:
            p.close()
        for f in fleets:
            f.close()
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
        #: In a fleet: the rank's FleetPrefill; the room's daemon (its Prefill
        #: and address) is known once the daemon offered the room.
        self._fleet = side.fleet_rank(bootstrap_addr)
        self._p: Optional[Prefill] = side.rank(bootstrap_addr) if self._fleet is None else None
        self.daemon = ""
        self._down_since = 0.0
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
                if self._fleet is not None and self._p is None:
                    self._fail(f"room {self.room}: no decode daemon of the fleet (registered through "
                               f"{self.side.settings.target}) offered it within SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")
                else:
                    self._fail(f"room {self.room}: no destination from decodeplane ({self.daemon or self.side.settings.target}) "
                               "within SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")
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
                           aux_index=self.aux_index, state_indices=state_indices, stop=self._stop, daemon=self.daemon)
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
        if self._fleet is not None and self._take_offer():
            return
        p = self._p
        if p is None:
            return  # no daemon of the fleet offered the room yet
        s = p.shared_session()
        if s is None:  # the heartbeat (a fleet: its session holder) opens it
            if self._fleet is not None:
                self._owner_down(p)
            return
        self._down_since = 0.0
        inc = p.incarnation
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

    def _take_offer(self) -> bool:
        """A fleet's rank: takes the room's offer when its daemon made one
        (the first, or again on the daemon's next session); learns the
        room's daemon. True when it holds the offered claim now."""
        assert self._fleet is not None
        o = self._fleet.take_offer(self.room)
        if o is None:
            return False
        with self._lock:
            if self._p is not None and o.prefill is not self._p:
                if o.claim is not None:  # another daemon's offer of the same room id: not this hand-off's
                    o.claim.close()
                return False
            self._p, self.daemon = o.prefill, o.daemon
            if o.claim is None:
                return False
            if self.done or self.failure:
                o.claim.close()
                return True
            self._claim, self._claim_fut = o.claim, None
        self._down_since = 0.0
        return True

    def _owner_down(self, p: Prefill) -> None:
        """A fleet's rank without a session with the room's daemon: the room
        fails here when the daemon left the fleet, or when no session could
        be opened for DECODEPLANE_SGLANG_RPC_TIMEOUT (the decode side fails
        the room with its daemon)."""
        now = time.monotonic()
        if not self._down_since:
            self._down_since = now
        gone = p._c.closed
        if not gone and now - self._down_since < self.side.settings.rpc_timeout:
            return
        why = "left the fleet" if gone else \
            f"could not be reached for {self.side.settings.rpc_timeout:g}s (DECODEPLANE_SGLANG_RPC_TIMEOUT)"
        with self._lock:
            if self.done or self.failure:
                return
            self._fail(f"room {self.room}: its decode daemon {self.daemon or '(unknown)'} {why}")
            had = self.dest is not None and not self.dest.dummy
            self._stop.set()
            self._close_claim()
            if had:
                self._enqueue("restart-ack")  # a daemon that comes back learns that nothing writes any more

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
        if self._p is None:
            return
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
            if self._p is not None:
                self.side.ack_later(self._p, self.room, d.attempt)
            return
        req = rooms_pb2.AckRoomEndRequest(room=self.room, attempt=d.attempt, incarnation=d.incarnation)
        self._send(lambda s: s.ack(req, timeout=self.side.settings.rpc_timeout))

    def _send(self, call: Callable[[PrefillSession], Any]) -> bool:
        """Runs an op on the rank's shared session, on the next one when the
        session ended under it (within the RPC timeout). False when it failed
        (logged; the claim's events say what became of the room)."""
        end = time.monotonic() + self.side.settings.rpc_timeout
        p = self._p
        if p is None:
            return False
        while True:
            s = p.shared_session()
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
