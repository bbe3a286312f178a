"""The decode side of the plugin, free of SGLang: one :class:`DecodeSide` per
decode scheduler process holds an EngineSession to the daemon and a
:class:`RoomState` per request; the receiver class
(:mod:`decodeplane.sglang.classes`) only forwards SGLang's calls to it.

Roles. SGLang builds a receiver on every attention TP (and PP) rank of a
decode DP shard for each request and combines their polls by MIN. A room is
one hand-off: the shard's leader rank (attention TP 0, CP 0, PP 0) opens it
(OpenRoom, when the request arrives), declares its destination
(DeclareDestination, at ``send_metadata``), aborts and releases it; every
other rank follows the same room (a Watch on its own session) and maps the
same events to the same KVPoll. Nothing of a room is sent twice.

Threads. SGLang's scheduler thread only reads and marks the room table;
one supervisor thread sends every op (asynchronously, on the current
session), dials a new session when one ended, and re-declares the
hand-offs in flight after a daemon restart; the session's reader thread
records each room's events and each op's answer.

KVPoll. Bootstrapping until the daemon says the prefill registered and the
DP rank resolved (the room reaches ROOM_PHASE_QUEUED) and ``init`` was
called; WaitingForInput until a chunk landed; Transferring; Success only at
ROOM_PHASE_SUCCEEDED; Failed only once the room's pages are reusable (its
last event says so, or nothing of it was ever declared), so that SGLang's
``release_kv_cache`` cannot free pages a prefill rank may still write.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import grpc

from decodeplane import Client
from decodeplane.engine_session import ENGINE_EVENTS_ALL, EngineSession, SessionResult
from decodeplane.errors import DecodeplaneError
from decodeplane.sglang.config import Settings
from decodeplane.v1 import admin_pb2, capacity_pb2, common_pb2, engine_session_pb2, rooms_pb2

__all__ = ["RequestInfo", "RoomState", "DecodeSide", "TransferFailed", "KVPOLL", "STATE_TYPES", "state_indices"]

log = logging.getLogger("decodeplane.sglang")

#: SGLang's KVPoll values.
KVPOLL = {"Failed": 0, "Bootstrapping": 1, "WaitingForInput": 2, "Transferring": 3, "Success": 4}
_FAILED_POLL, _BOOT, _WAIT, _XFER, _OK = 0, 1, 2, 3, 4

#: SGLang's state types decodeplane declares (StateType values -> proto).
STATE_TYPES = {"mamba": common_pb2.STATE_TYPE_MAMBA, "swa": common_pb2.STATE_TYPE_SWA, "dsa": common_pb2.STATE_TYPE_DSA}

_P = common_pb2
_WAITING = (_P.ROOM_PHASE_QUEUED, _P.ROOM_PHASE_ADMITTED, _P.ROOM_PHASE_CLAIMED)
_DONE = (_P.ROOM_PHASE_SUCCEEDED, _P.ROOM_PHASE_RELEASED, _P.ROOM_PHASE_RETRACTED, _P.ROOM_PHASE_HELD)
#: How often the supervisor looks again at rooms that wait for something
#: (a follower's room the leader has not opened yet, a retry delay).
TICK = 0.05
#: Figures are reported at most this often.
CAPACITY_EVERY = 0.05
_MAX_NEW_TOKENS = 1 << 24


@dataclass(frozen=True)
class RequestInfo:
    """What OpenRoom needs of SGLang's Req."""

    rid: str
    room: int
    bootstrap_addr: str
    prompt_len: int
    output_len: int = 0
    max_new_tokens: int = 1
    priority: int = 0
    prefill_dp_rank: Optional[int] = None
    rebootstrap: bool = False

    @staticmethod
    def from_req(req: Any, bootstrap_addr: str, rebootstrap: bool = False) -> "RequestInfo":
        sp = getattr(req, "sampling_params", None)
        mnt = getattr(sp, "max_new_tokens", None) if sp is not None else None
        hint = getattr(req, "disagg_prefill_dp_rank", None)
        prio = getattr(req, "priority", None)
        return RequestInfo(rid=str(req.rid), room=int(req.bootstrap_room), bootstrap_addr=bootstrap_addr,
                           prompt_len=len(req.origin_input_ids), output_len=len(getattr(req, "output_ids", None) or ()),
                           max_new_tokens=min(int(mnt), _MAX_NEW_TOKENS) if mnt else _MAX_NEW_TOKENS,
                           priority=max(min(int(prio or 0), 1 << 20), -(1 << 20)),
                           prefill_dp_rank=None if hint is None else int(hint), rebootstrap=rebootstrap)


class TransferFailed(Exception):
    """A hand-off's failure as SGLang's failure_exception() raises it (the
    attributes of SGLang's KVTransferError)."""

    def __init__(self, bootstrap_room: int, failure_reason: str, is_from_another_rank: bool = False) -> None:
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self) -> str:
        return f"decodeplane (room {self.bootstrap_room}): {self.failure_reason}"


class RoomState:
    """One request's room as this rank sees it (fields guarded by the
    DecodeSide's lock)."""

    def __init__(self, room: int, info: Optional[RequestInfo], leader: bool) -> None:
        self.room = room
        self.info = info
        self.leader = leader
        self.phase = 0
        self.failure = ""
        self.reusable = False
        self.cursor = 0
        self.initialized = False
        # Leader: the open, declaration, abort and release, each wanted
        # (None / False: not) and sent; followers only watch.
        self.opened = False  # the daemon has the room (open answered, or watch subscribed)
        self.open_sent = False
        self.watch_sent = False
        self.declare: Optional[rooms_pb2.DeclareDestinationRequest] = None
        self.abort_reason: Optional[str] = None
        self.release_wanted = False
        # op -> "sent" (on the current session) or "done" (answered): an op
        # whose session ended before its answer is sent again on the next.
        self.ops: dict[str, str] = {}
        self.retry_at = 0.0
        # A failure the plugin saw itself (an open or declaration refused, the
        # daemon restarted); with wait_daemon the room is aborted and Failed
        # waits for its last event (or drain_until).
        self.local_failure = ""
        self.wait_daemon = False
        self.drain_until = 0.0
        self.cleared = False
        self.unlisten: Optional[Callable[[], None]] = None
        self.created = time.monotonic()

    def kv_poll(self, now: float) -> int:
        if self.local_failure:
            if not self.wait_daemon or self.reusable or (self.drain_until and now >= self.drain_until):
                return _FAILED_POLL
            return _XFER
        ph = self.phase
        if ph == _P.ROOM_PHASE_FAILED:
            return _FAILED_POLL if self.reusable else _XFER
        if ph in _DONE:
            return _OK
        if ph == _P.ROOM_PHASE_TRANSFERRING:
            return _XFER
        if ph in _WAITING and self.initialized:
            return _WAIT
        return _BOOT

    def fail(self, message: str, wait_daemon: bool) -> None:
        if not self.local_failure:
            self.local_failure, self.wait_daemon = message, wait_daemon


class DecodeSide:
    """One decode scheduler process's link to the daemon (see the module
    documentation). ``leader``: this rank opens and declares the shard's
    rooms; ``dp_rank`` is the decode DP shard; ``expect`` are facts of the
    engine the daemon's layout must match (page_size, attn_tp_size)."""

    def __init__(self, settings: Settings, client: Client, *, dp_rank: int, tp_rank: int, leader: bool,
                 resync_done: bool = True) -> None:
        self._s = settings
        self._c = client
        self.dp_rank, self.tp_rank, self.leader = dp_rank, tp_rank, leader
        self._resync_done = resync_done
        #: How long the leader tries to open a room before SGLang is told it failed.
        self.open_bound = 300.0
        # Reentrant: an op's future answered before its callback is added
        # runs the callback at once, under the lock its sender holds.
        self._lock = threading.RLock()
        self._rooms: dict[int, RoomState] = {}
        self._pending: dict[int, RequestInfo] = {}
        self._session: Optional[EngineSession] = None
        self._incarnation = 0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._dial_failures = 0
        self._next_dial = 0.0
        self._capacity: Optional[capacity_pb2.ReportCapacityRequest] = None
        self._capacity_sent: Optional[capacity_pb2.ReportCapacityRequest] = None
        self._capacity_at = 0.0
        self._thread = threading.Thread(target=self._supervise, name=f"decodeplane-decode-dp{dp_rank}-tp{tp_rank}",
                                        daemon=True)

    # ---- startup ----

    def check(self, page_size: int, attn_tp_size: int, timeout: float) -> "admin_pb2.GetStatusResponse":
        """Checks that the daemon serves an engine-owned pool this engine can
        use; returns its status. Raises RuntimeError saying what to fix."""
        try:
            st = self._c.admin.status(timeout=timeout)
        except DecodeplaneError as e:
            raise RuntimeError(f"decodeplane: cannot reach the daemon at {self._s.target} (DECODEPLANE_TARGET): {e}") from e
        lay = st.layout
        problems = []
        if lay.page_owner and lay.page_owner != "engine":
            problems.append(f"its kv_pool.owner is {lay.page_owner}: set kv_pool.owner: engine (SGLang allocates the pages)")
        if lay.page_size and lay.page_size != page_size:
            problems.append(f"its kv_pool.page_size is {lay.page_size}, this engine's --page-size {page_size}")
        if lay.attn_tp_size and lay.attn_tp_size != attn_tp_size:
            problems.append(f"its parallel.attn_tp is {lay.attn_tp_size}, this engine's attention TP size {attn_tp_size}")
        if lay.dp_size and self.dp_rank >= lay.dp_size:
            problems.append(f"its parallel.dp is {lay.dp_size}, below this engine's DP rank {self.dp_rank}")
        if problems:
            raise RuntimeError(f"decodeplane: the daemon at {self._s.target} cannot serve this decode engine: "
                               + "; ".join(problems))
        return st

    def advertised_address(self, timeout: float) -> str:
        """The daemon's address as its fleet advertises it (GetFleet's own
        entry): the name a fleet's prefill ranks know the room's daemon by;
        "" when the daemon does not say (logged)."""
        try:
            resp = self._c.admin.get_fleet(timeout=timeout)
        except DecodeplaneError as e:
            log.info("decodeplane: the daemon at %s did not name its fleet address (%s): prefill ranks of a fleet "
                     "cannot address this decode rank's buffers", self._s.target, e)
            return ""
        for d in resp.daemons:
            if d.self:
                return str(d.address)
        return ""

    def start(self, incarnation: int) -> None:
        self._incarnation = incarnation
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)
        with self._lock:
            s, self._session = self._session, None
        if s is not None:
            s.close()
        self._c.close()

    # ---- the scheduler's calls ----

    def capture(self, room: int, info: RequestInfo) -> None:
        """The request of the receiver about to be built for ``room``."""
        with self._lock:
            self._pending[room] = info

    def uncapture(self, room: int) -> None:
        with self._lock:
            self._pending.pop(room, None)

    def track(self, room: int) -> RoomState:
        """The receiver of ``room`` was built: the leader opens the room, the
        others watch it."""
        with self._lock:
            info = self._pending.pop(room, None)
            st = RoomState(room, info, self.leader)
            if info is None:
                st.fail(f"decodeplane: no request details for room {room}: the plugin's hook on SGLang's "
                        "DecodePreallocQueue._create_receiver_and_enqueue did not run (an SGLang version this plugin "
                        "does not know)", wait_daemon=False)
            old = self._rooms.get(room)
            if old is not None and old.unlisten is not None:
                old.unlisten()
            self._rooms[room] = st
        self._wake.set()
        return st

    def init(self, st: RoomState) -> None:
        with self._lock:
            st.initialized = True

    def declare(self, st: RoomState, pages: Sequence[int], metadata_slot: int, state: Sequence[common_pb2.StateIndices],
                decode_prefix_len: int) -> None:
        """SGLang allocated the room's destination: the leader declares it."""
        with self._lock:
            if not self.leader or st.local_failure or st.declare is not None:
                return
            st.declare = rooms_pb2.DeclareDestinationRequest(room=st.room, page_indices=[int(p) for p in pages],
                                                            metadata_slot=int(metadata_slot), state=list(state),
                                                            decode_prefix_len=int(decode_prefix_len))
        self._wake.set()

    def poll(self, st: RoomState) -> int:
        now = time.monotonic()
        with self._lock:
            if self.leader and not st.opened and not st.local_failure and now >= st.created + self.open_bound:
                # Never opened (the daemon unreachable): nothing was declared.
                st.fail(f"room {st.room} could not be opened at decodeplane ({self._s.target}) within "
                        f"{self.open_bound:.0f} s (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)", wait_daemon=False)
            return st.kv_poll(now)

    def failure(self, st: RoomState) -> tuple[str, bool]:
        """The room's failure message and whether another rank (or the
        daemon, for a follower) reported it."""
        with self._lock:
            msg = st.local_failure or st.failure or f"room {st.room} failed"
            return msg, not self.leader and not st.local_failure

    def abort(self, st: RoomState, reason: str = "") -> None:
        with self._lock:
            if self.leader and st.abort_reason is None and st.phase not in _DONE:
                st.abort_reason = reason
        self._wake.set()

    def clear(self, st: RoomState) -> None:
        """SGLang is done with the receiver: a succeeded room is released, a
        room that has not ended is aborted (SGLang dropped its request)."""
        with self._lock:
            st.cleared = True
            if self.leader and not st.local_failure:
                if st.phase in _DONE:
                    st.release_wanted = True
                elif st.phase != _P.ROOM_PHASE_FAILED and st.abort_reason is None:
                    st.abort_reason = ""
        self._wake.set()

    def report_capacity(self, req: capacity_pb2.ReportCapacityRequest) -> None:
        """The engine's latest free figures (the leader reports them)."""
        if not self.leader:
            return
        req.decode_dp_rank = self.dp_rank
        with self._lock:
            self._capacity = req
        self._wake.set()

    def state(self, room: int) -> Optional[RoomState]:
        with self._lock:
            return self._rooms.get(room)

    # ---- the supervisor ----

    def _supervise(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(TICK)
            self._wake.clear()
            try:
                s = self._live_session()
                if s is not None:
                    self._send_all(s)
            except Exception:  # noqa: BLE001 - the supervisor must outlive a bug in one round
                log.exception("decodeplane: the decode supervisor's round failed")

    def _live_session(self) -> Optional[EngineSession]:
        with self._lock:
            s = self._session
        if s is not None and not s.done:
            return s
        now = time.monotonic()
        if now < self._next_dial:
            return None
        try:
            inc = self._c.admin.status(timeout=self._s.rpc_timeout).incarnation
            s = EngineSession(self._c, events=ENGINE_EVENTS_ALL)
        except DecodeplaneError as e:
            self._dial_failures += 1
            self._next_dial = now + self._c.retry_policy.backoff(min(self._dial_failures, 8))
            log.warning("decodeplane: the engine session to %s is down (%s); retrying", self._s.target, e)
            return None
        self._dial_failures = 0
        old = self._incarnation
        with self._lock:
            self._session = s
            for st in self._rooms.values():
                # Every room is subscribed anew on this session, and its ops
                # whose answers the old one lost are sent again (each is
                # idempotent: the open by its key).
                st.open_sent = st.watch_sent = False
                st.unlisten = None
                st.ops = {k: v for k, v in st.ops.items() if v == "done"}
        if old and inc and inc != old:
            self._restarted(old, inc)
        self._incarnation = inc or old
        return s

    def _restarted(self, old: int, new: int) -> None:
        """The daemon restarted: every room of the old one is gone. The leader
        re-declares the hand-offs still in flight (the new daemon holds their
        pages until their prefill ranks acknowledge) and fails the rooms not
        declared yet; a follower watches its rooms anew."""
        msg = f"the decodeplane daemon restarted (incarnation {old:x}, now {new:x})"
        resync: list[tuple[RoomState, rooms_pb2.ResyncRoom]] = []
        with self._lock:
            for st in self._rooms.values():
                if st.reusable or st.phase in _DONE or (st.local_failure and not st.wait_daemon):
                    continue  # ended: nothing of it is on the daemon any more
                st.opened, st.cursor = False, 0
                if not self.leader:
                    continue
                if st.declare is not None and st.info is not None:
                    resync.append((st, _in_flight(st, self.dp_rank)))
                else:
                    st.fail(f"{msg} before the room's destination was declared: the room is gone", wait_daemon=False)
        if not resync:
            return
        try:
            self._c.engine.resync([r for _, r in resync], done=self._resync_done, timeout=self._s.rpc_timeout)
        except DecodeplaneError as e:
            until = time.monotonic() + self._s.restart_drain
            log.error("decodeplane: %s and refused to re-declare %d hand-offs in flight (%s): their pages are kept "
                      "%.0f s (DECODEPLANE_SGLANG_RESTART_DRAIN) before SGLang reuses them; start the daemon with "
                      "engine.resync_timeout > 0", msg, len(resync), e, self._s.restart_drain)
            with self._lock:
                for st, _ in resync:
                    st.fail(f"{msg}; the hand-off could not be re-declared ({e.message})", wait_daemon=True)
                    st.drain_until = until
            return
        with self._lock:
            for st, _ in resync:
                st.opened = True  # the new daemon holds it (FAILED, draining): watch it to its last event
                st.ops["declare"] = "done"

    def _send_all(self, s: EngineSession) -> None:
        now = time.monotonic()
        with self._lock:
            rooms = list(self._rooms.values())
            cap = self._capacity
        for st in rooms:
            self._send_room(s, st, now)
        if cap is not None and cap != self._capacity_sent and now - self._capacity_at >= CAPACITY_EVERY:
            try:
                s.capacity_async(cap).add_done_callback(_log_failure("ReportCapacity"))
            except DecodeplaneError:
                return  # the session ended: the next one reports
            self._capacity_sent, self._capacity_at = cap, now

    def _send_room(self, s: EngineSession, st: RoomState, now: float) -> None:
        with self._lock:
            if st.cleared and (st.local_failure or not self._owes(st)):
                if self._rooms.get(st.room) is st:
                    del self._rooms[st.room]
                if st.unlisten is not None:
                    st.unlisten()
                return
            if st.local_failure and not st.wait_daemon:
                return
            if not st.open_sent and not st.watch_sent and now >= st.retry_at:
                if self.leader and not st.opened:
                    self._open(s, st)
                else:
                    self._watch(s, st)
                return
            if not st.opened or not self.leader:
                return
            if st.declare is not None and "declare" not in st.ops and not st.local_failure:
                self._op(st, "declare", lambda: s.declare_async(st.declare), self._on_declared(st))
            if st.abort_reason is not None and "abort" not in st.ops:
                self._op(st, "abort", lambda: s.abort_async(st.room, st.abort_reason or ""),
                         _log_failure(f"AbortRoom {st.room}"))
            if st.release_wanted and "release" not in st.ops:
                self._op(st, "release", lambda: s.release_async(st.room), _log_failure(f"ReleaseRoom {st.room}"))

    def _op(self, st: RoomState, name: str, send: Callable[[], Any], then: Callable[[Any], None]) -> None:
        """Sends one of a room's ops (lock held); its answer marks it done
        (``then`` handles it); a session's end leaves it to be sent again."""
        try:
            fut = send()
        except DecodeplaneError:
            return  # the session ended: the next round dials and sends it
        st.ops[name] = "sent"

        def done(f: Any) -> None:
            try:
                f.result()
                answered = True
            except DecodeplaneError as e:
                answered = not e._stream_end
            if answered:
                with self._lock:
                    st.ops[name] = "done"
            then(f)
        fut.add_done_callback(done)

    def _owes(self, st: RoomState) -> bool:
        """Whether an op of a cleared room is still to be sent (lock held)."""
        if not self.leader or not st.opened:
            return False
        return ((st.abort_reason is not None and st.ops.get("abort") != "done")
                or (st.release_wanted and st.ops.get("release") != "done"))

    def _listen(self, s: EngineSession, st: RoomState) -> None:
        st.unlisten = s.listen(st.room, lambda ev: self._on_event(st, ev))

    def _open(self, s: EngineSession, st: RoomState) -> None:
        """OpenRoom on the session (lock held)."""
        info = st.info
        assert info is not None
        req = rooms_pb2.OpenRoomRequest(rid=info.rid, bootstrap_addr=info.bootstrap_addr, room=st.room,
                                        prompt_len=info.prompt_len, output_len=info.output_len,
                                        max_new_tokens=info.max_new_tokens, priority=info.priority,
                                        rebootstrap=info.rebootstrap, decode_dp_rank=self.dp_rank,
                                        idempotency_key=f"sglang:{info.rid}:{st.room}")
        if info.prefill_dp_rank is not None:
            req.prefill_dp_rank = info.prefill_dp_rank
        self._listen(s, st)
        st.open_sent = True
        try:
            fut = s.open_async([req])
        except DecodeplaneError:
            st.open_sent = False  # the session ended: the next round dials
            return
        fut.add_done_callback(self._on_opened(st))

    def _watch(self, s: EngineSession, st: RoomState) -> None:
        """A Watch of the room from its cursor (lock held)."""
        self._listen(s, st)
        st.watch_sent = True
        try:
            fut = s.resume_async({st.room: st.cursor})
        except DecodeplaneError:
            st.watch_sent = False
            return
        fut.add_done_callback(self._on_watched(st))

    # ---- answers and events (the session's reader thread) ----

    def _on_opened(self, st: RoomState) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            try:
                res: SessionResult = fut.result()[0]
                err = res.error
            except DecodeplaneError as e:
                err = e
            with self._lock:
                if err is None:
                    st.opened = True
                elif err._stream_end:
                    return  # the session ended: the next one opens it again (same key)
                elif err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.retry_after is not None:
                    st.open_sent, st.retry_at = False, time.monotonic() + err.retry_after
                else:
                    st.fail(f"decodeplane refused to open room {st.room}: {err.message}", wait_daemon=False)
            self._wake.set()
        return done

    def _on_watched(self, st: RoomState) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            try:
                res: SessionResult = fut.result()[0]
                err = res.error
            except DecodeplaneError as e:
                err = e
            with self._lock:
                if err is None:
                    st.opened = True
                elif not err._stream_end:
                    # Not open yet (the leader opens it), or gone after a
                    # restart until the leader re-declares it: look again.
                    st.watch_sent, st.retry_at = False, time.monotonic() + TICK
                    if st.unlisten is not None:
                        st.unlisten()
                        st.unlisten = None
        return done

    def _on_declared(self, st: RoomState) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            try:
                res: SessionResult = fut.result()
                err = res.error
            except DecodeplaneError as e:
                err = e
            if err is None or err._stream_end:
                return
            with self._lock:
                # The room cannot use these pages (one is still held by another
                # room's hand-off, or the room ended): it is aborted, and
                # Failed comes with its last event.
                st.fail(f"decodeplane refused the destination SGLang allocated for room {st.room}: {err.message}",
                        wait_daemon=err.code() != grpc.StatusCode.NOT_FOUND)
                if st.abort_reason is None:
                    st.abort_reason = "the decode engine's destination was refused"
            log.error("decodeplane: room %d: DeclareDestination refused: %s", st.room, err.message)
            self._wake.set()
        return done

    def _on_event(self, st: RoomState, ev: engine_session_pb2.EngineRoomEvent) -> None:
        e = ev.event
        with self._lock:
            if st.info is not None and e.room.rid and e.room.rid != st.info.rid and not self.leader:
                return  # another request's room under the same id, retained: not this one
            st.opened = True
            st.cursor = max(st.cursor, ev.seq)
            st.phase = e.transition.phase if e.HasField("transition") else e.room.phase
            if e.room.failure.message:
                st.failure = e.room.failure.message
            if e.pages_reusable:
                st.reusable = True


def _in_flight(st: RoomState, dp_rank: int) -> rooms_pb2.ResyncRoom:
    from decodeplane.engine import in_flight

    info = st.info
    assert info is not None and st.declare is not None
    return in_flight(st.declare, rid=info.rid, prompt_len=info.prompt_len, max_new_tokens=info.max_new_tokens,
                     decode_dp_rank=dp_rank, bootstrap_addr=info.bootstrap_addr, prefill_dp_rank=info.prefill_dp_rank)


def _log_failure(what: str) -> Callable[[Any], None]:
    def done(fut: Any) -> None:
        try:
            res = fut.result()
        except DecodeplaneError as e:
            if not e._stream_end:
                log.warning("decodeplane: %s failed: %s", what, e)
            return
        if isinstance(res, SessionResult) and res.error is not None:
            log.warning("decodeplane: %s refused: %s", what, res.error)
    return done


def state_indices(state_types: Sequence[Any], indices: Optional[Sequence[Any]]) -> list[common_pb2.StateIndices]:
    """SGLang's ``send_metadata`` state indices (one entry per
    ``kv_args.state_types``) as decodeplane's StateIndices; raises
    ValueError for a state type decodeplane does not declare."""
    out = []
    for st, idx in zip(state_types, indices or ()):
        name = str(getattr(st, "value", st))
        if name not in STATE_TYPES:
            raise ValueError(f"decodeplane: state type {name!r} is not declared by decodeplane (allowed: "
                             f"{', '.join(STATE_TYPES)})")
        if idx is None:
            continue
        flat = [int(i) for i in _flatten(idx)]
        out.append(common_pb2.StateIndices(type=STATE_TYPES[name], indices=flat))
    return out


def _flatten(x: Any) -> list[Any]:
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        out: list[Any] = []
        for v in x:
            out.extend(_flatten(v))
        return out
    return [x]

