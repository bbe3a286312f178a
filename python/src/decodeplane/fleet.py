"""A prefill rank of a fleet of decode daemons (:class:`FleetPrefill`): it
hands off every room opened for the rank on any daemon of the fleet
without being told which daemon holds it.

Decode daemons that share their registry through etcd (``registry.backend
etcd``) form a fleet. The rank registers through one of them (the seed) and
keeps one PrefillSession with offers with every daemon of the fleet, found
with GetFleet. Each daemon claims for the rank every room it holds for the
rank's instance and DP rank and offers it on its session (the decode side
tells the prefill where to write, as SGLang's decode pushes its
TransferInfo): the destination arrives on the owner's session at admission,
with no claim of the rank's, no extra hop and no etcd write.
:meth:`FleetPrefill.send_room` and :meth:`FleetPrefill.report_room` take the
room's offer (waiting for it, at most ``offer_wait``) and hand the room off
on the session it came on, so that its chunks, reports and acknowledgement
go to the room's owner. Each session is also the rank's heartbeat on its
daemon.

The owner's death fails its rooms on this side: its session ends at once
when the daemon's process dies (a host that vanished is detected by the
connection's keepalive), and a hand-off of one of its rooms, in flight or
to come, fails once the session could not be opened again under the retry
policy (UnavailableError), or with IncarnationChangedError when the daemon
restarted meanwhile. Every daemon is dialed with the same client options
(token, TLS); no daemon calls another.

::

    fleet = decodeplane.FleetPrefill("10.0.0.5:7600", registration, client_options={"token": token})
    fleet.start()                     # registers, finds the daemons, holds their sessions
    dest = fleet.send_room(room, chunk_pages=4, timeout=60)
    ...
    fleet.close()
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import grpc

from decodeplane._core import Deadline, log
from decodeplane.client import Client, Transport
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    NotFoundError,
    local_error,
)
from decodeplane.prefill import Chunk, Prefill, PrefillSession, SessionClaim
from decodeplane.v1 import bootstrap_pb2, prefill_session_pb2, rooms_pb2

__all__ = ["FleetPrefill", "FleetDaemonState", "FleetOffer", "DEFAULT_REFRESH", "DEFAULT_OFFER_WAIT"]

#: How often the fleet's daemons are listed (seconds).
DEFAULT_REFRESH = 2.0
#: How long a hand-off waits for its room's offer (seconds): SGLang's
#: bootstrap timeout, as a daemon bounds a claim waiting for its room.
DEFAULT_OFFER_WAIT = 300.0
#: The rooms whose daemon is remembered after their offer was taken, ended
#: or lost its session (the oldest are forgotten first).
MAX_ROUTES = 1 << 16


@dataclass(frozen=True)
class FleetDaemonState:
    """One daemon of the fleet as the rank sees it."""

    address: str
    seed: bool
    incarnation: int
    session: bool


@dataclass(frozen=True)
class FleetOffer:
    """A room's daemon as :meth:`FleetPrefill.take_offer` hands it out: its
    advertised address, the rank's Prefill on it and, when its offer was
    not taken yet, the offered claim (the taker's: it reads the claim's
    events and closes it); None for a room offered before whose claim
    ended or whose session ended (claim it again on the Prefill's shared
    session)."""

    daemon: str
    prefill: Prefill
    claim: Optional[SessionClaim]


class _Offer:
    """An offer not taken yet: the member (daemon), its session and the
    offered claim."""

    __slots__ = ("prefill", "session", "claim")

    def __init__(self, prefill: Prefill, session: PrefillSession, claim: SessionClaim) -> None:
        self.prefill, self.session, self.claim = prefill, session, claim


class _OfferTable:
    """The rooms the fleet's daemons offered the rank: the offers not taken
    (live) and the daemon of every room offered before (routes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, _Offer] = {}
        self._routes: dict[int, tuple[Prefill, int]] = {}  # in insertion order: the oldest first
        self._waiters: dict[int, list[threading.Event]] = {}
        self._closed = False

    # ---- from the sessions' readers ----

    def session_event(self, s: PrefillSession, ev: prefill_session_pb2.PrefillRoomEvent) -> None:
        """An event of an offered claim (claim_seq 0): the offer, then the
        claim's events."""
        room = ev.room
        if ev.offer:
            cl = SessionClaim(s, room, s.welcome.incarnation)
            with s._lock:
                old = s._offered.get(room)
                s._offered[room] = cl
            if old is not None:
                self._ended(room, old)
                old.close()
            self._add(room, _Offer(s._p, s, cl))
            return
        with s._lock:
            cl = s._offered.get(room)
        if cl is None:
            return  # closed by its hand-off, or superseded
        cl._deliver(ev.event)
        if ev.event.WhichOneof("event") in ("done", "failure") and self._ended(room, cl):
            cl.close()  # nobody took it: a later hand-off claims it on its daemon

    def lost(self, s: PrefillSession, offered: dict[int, SessionClaim]) -> None:
        """The offers of a session that ended: their rooms are remembered on
        their daemon (a hand-off claims them on its next session)."""
        with self._lock:
            for room, cl in offered.items():
                o = self._live.get(room)
                if o is not None and o.claim is cl:
                    del self._live[room]
                    self._route(room, s._p, cl.incarnation)

    # ---- the table ----

    def _add(self, room: int, o: _Offer) -> None:
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                old = self._live.get(room)
                self._live[room] = o
                waiters = self._waiters.pop(room, [])
        if closed:
            o.claim.close()
            return
        if old is not None:
            old.claim.close()
        for w in waiters:
            w.set()

    def _ended(self, room: int, cl: SessionClaim) -> bool:
        with self._lock:
            o = self._live.get(room)
            if o is None or o.claim is not cl:
                return False
            del self._live[room]
            self._route(room, o.prefill, cl.incarnation)
            return True

    def _route(self, room: int, p: Prefill, inc: int) -> None:
        self._routes.pop(room, None)
        self._routes[room] = (p, inc)
        while len(self._routes) > MAX_ROUTES:
            del self._routes[next(iter(self._routes))]

    def take(self, op: str, room: int, wait: float, dl: Deadline) -> tuple[Optional[_Offer], Optional[tuple[Prefill, int]]]:
        """The room's offer, waiting for it at most ``wait`` (bounded by
        ``dl``); or, for a room offered before, its daemon."""
        end = Deadline(dl.cap(wait))
        while True:
            with self._lock:
                if self._closed:
                    raise local_error(op, grpc.StatusCode.CANCELLED, "the fleet prefill is closed")
                o = self._live.pop(room, None)
                if o is not None:
                    self._route(room, o.prefill, o.claim.incarnation)
                    return o, None
                r = self._routes.get(room)
                if r is not None:
                    return None, r
                w = threading.Event()
                self._waiters.setdefault(room, []).append(w)
            rem = end.remaining()
            if w.wait(rem):
                continue
            with self._lock:
                ws = self._waiters.get(room, [])
                if w in ws:
                    ws.remove(w)
                if not ws:
                    self._waiters.pop(room, None)
            if dl.expired():
                raise local_error(op, grpc.StatusCode.DEADLINE_EXCEEDED, f"room {room}: deadline exceeded waiting for its offer")
            raise local_error(op, grpc.StatusCode.NOT_FOUND,
                              f"room {room} was not offered by any daemon of the fleet within {wait}s (offer_wait): no daemon "
                              "holds it for this rank (its bootstrap_addr or DP rank is another's, it was never opened, or "
                              "its daemon is not in the fleet)")

    def take_now(self, room: int) -> tuple[Optional[_Offer], Optional[tuple[Prefill, int]]]:
        """take without waiting: (None, None) when no daemon offered the
        room yet."""
        with self._lock:
            if self._closed:
                return None, None
            o = self._live.pop(room, None)
            if o is not None:
                self._route(room, o.prefill, o.claim.incarnation)
                return o, None
            return None, self._routes.get(room)

    def owner(self, room: int) -> Optional[Prefill]:
        with self._lock:
            o = self._live.get(room)
            if o is not None:
                return o.prefill
            r = self._routes.get(room)
            return r[0] if r is not None else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            live, self._live = self._live, {}
            waiters, self._waiters = self._waiters, {}
        for o in live.values():
            o.claim.close()
        for ws in waiters.values():
            for w in ws:
                w.set()


class _Call(threading.Thread):
    """Runs fn on a daemon thread; result or error once joined."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(name="decodeplane-fleet-call", daemon=True)
        self._fn = fn
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.error = e


class _Member:
    """One daemon of the fleet: its client and the rank's Prefill on it."""

    def __init__(self, addr: str, client: Client, prefill: Prefill) -> None:
        self.addr = addr
        self.client = client
        self.prefill = prefill
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.missing = 0


class FleetPrefill:
    """One prefill rank of a fleet (see the module documentation).

    Args:
        seed: the address of the daemon the rank registers through
            (``"10.0.0.5:7600"``).
        registration: the rank's RegisterPrefillRequest (copied).
        client_options: keyword arguments of every :class:`Client` it makes,
            one per daemon (``token``, ``tls``, ``retry``, ``options``); the
            transport is always STREAMS.
        refresh: seconds between two listings of the fleet (GetFleet).
        offer_wait: how long a hand-off waits for its room's offer.
        on_error: called with (daemon, error) for every error the loop
            recovers from (to log).
        heartbeat_every: the Prefills' heartbeat cadence (default: half the
            daemon's interval).

    :meth:`start` (or :meth:`run` on a thread of yours) must run for the
    rank to work; :meth:`send_room` and :meth:`report_room` may be called
    from any thread meanwhile. A context manager: leaving it closes.
    """

    def __init__(self, seed: str, registration: bootstrap_pb2.RegisterPrefillRequest, *,
                 client_options: Optional[dict[str, Any]] = None, refresh: float = DEFAULT_REFRESH,
                 offer_wait: float = DEFAULT_OFFER_WAIT,
                 on_error: Optional[Callable[[str, BaseException], None]] = None,
                 heartbeat_every: Optional[float] = None) -> None:
        self._reg = registration
        self._opts = dict(client_options or {})
        self._opts["transport"] = Transport.STREAMS
        self._refresh = refresh if refresh > 0 else DEFAULT_REFRESH
        self._offer_wait = offer_wait if offer_wait > 0 else DEFAULT_OFFER_WAIT
        self._on_error = on_error
        self._every = heartbeat_every
        self._offers = _OfferTable()
        self._lock = threading.Lock()
        self._members: dict[str, _Member] = {}
        self._seed = self._member(seed)
        self._seed_addr: Optional[str] = None  # its advertised address, once GetFleet named it
        self._seed_live = time.monotonic()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        #: What ended :meth:`start`'s loop (an error repeating cannot fix), None while it runs.
        self.error: Optional[BaseException] = None

    def _member(self, addr: str) -> _Member:
        c = Client(addr, **self._opts)
        p = c.prefill(self._reg, heartbeat_every=self._every)
        p._offers = self._offers
        return _Member(addr, c, p)

    @property
    def seed(self) -> Prefill:
        """The rank's Prefill on the seed daemon (its registration,
        incarnation)."""
        return self._seed.prefill

    # ---- the loop ----

    def start(self) -> "FleetPrefill":
        """Runs :meth:`run` on a daemon thread until :meth:`close`."""
        def loop() -> None:
            try:
                self.run(self._stop)
            except BaseException as e:  # noqa: BLE001
                self.error = e
        self._thread = threading.Thread(target=loop, name="decodeplane-fleet", daemon=True)
        self._thread.start()
        return self

    def run(self, stop: Optional[threading.Event] = None) -> None:
        """Registers the rank through the seed and keeps it alive and its
        sessions open with every daemon of the fleet until ``stop`` is set
        (or :meth:`close`). Through the seed it runs
        :meth:`Prefill.run_heartbeat`; every other daemon gets a session with
        offers only, opened again after it ended (a daemon that does not know
        the rank yet is asked again after a back-off; one that still does not
        when the seed has been unreachable for a heartbeat interval is
        registered with). A daemon GetFleet no longer lists twice in a row,
        whose session is down, is dropped. Errors repeating cannot fix (the
        registration refused) end it and are raised."""
        stop = stop or self._stop
        beat_err: list[BaseException] = []
        failed = threading.Event()

        def beat() -> None:
            try:
                self._seed.prefill.run_heartbeat(stop)
            except BaseException as e:  # noqa: BLE001
                beat_err.append(e)
                failed.set()
        t = threading.Thread(target=beat, name="decodeplane-fleet-seed", daemon=True)
        t.start()
        try:
            while not (stop.is_set() or self._stop.is_set() or failed.is_set()):
                self._refresh_once()
                failed.wait(self._refresh)
        finally:
            self._stop_members()
            if not failed.is_set() and stop is not self._stop and self._stop.is_set():
                self._seed.prefill.close()  # closed: the seed's heartbeat ends (CanceledError)
            t.join()
        if beat_err and not self._closed:
            raise beat_err[0]

    def _report(self, daemon: str, err: BaseException) -> None:
        if self._on_error is not None:
            try:
                self._on_error(daemon, err)
            except Exception:  # noqa: BLE001
                log.exception("on_error failed")

    def _refresh_once(self) -> None:
        if self._seed.prefill._mux.live() is not None:
            self._seed_live = time.monotonic()
        if self._seed.prefill.registration is None:
            return  # the other daemons would not know the rank yet
        resp, from_seed, err = self._get_fleet()
        if resp is None:
            self._report(self._seed_addr or self._seed.addr, err or local_error(
                "GetFleet", grpc.StatusCode.UNAVAILABLE, "no daemon answered"))
            return
        with self._lock:
            if from_seed and self._seed_addr is None:
                for d in resp.daemons:
                    if d.self and d.address:
                        self._seed_addr = d.address
                        self._members[d.address] = self._seed
            named = self._seed_addr is not None
        if not named:
            return
        listed = {d.address for d in resp.daemons if d.address}
        for addr in listed:
            with self._lock:
                known = addr in self._members or self._closed
            if not known:
                self._start_member(addr)
        self._prune(listed)

    def _get_fleet(self) -> tuple[Any, bool, Optional[BaseException]]:
        with self._lock:
            ms = [self._seed] + [m for m in self._members.values() if m is not self._seed]
        first: Optional[BaseException] = None
        for m in ms:
            try:
                return m.client.admin.get_fleet(timeout=self._refresh), m is self._seed, None
            except DecodeplaneError as e:
                first = first or e
        return None, False, first

    def _start_member(self, addr: str) -> None:
        m = self._member(addr)
        with self._lock:
            if self._closed:
                m.client.close()
                return
            self._members[addr] = m
        m.thread = threading.Thread(target=self._hold, args=(m,), name=f"decodeplane-fleet-{addr}", daemon=True)
        m.thread.start()

    def _prune(self, listed: set[str]) -> None:
        gone = []
        with self._lock:
            for addr, m in list(self._members.items()):
                if m is self._seed:
                    continue
                if addr in listed:
                    m.missing = 0
                    continue
                m.missing += 1
                if m.missing >= 2 and m.prefill._mux.live() is None:
                    del self._members[addr]
                    gone.append(m)
        for m in gone:
            self._end_member(m)

    def _end_member(self, m: _Member) -> None:
        m.stop.set()
        if m.thread is not None:
            m.thread.join()
        m.client.close()

    def _stop_members(self) -> None:
        with self._lock:
            ms = [m for m in self._members.values() if m is not self._seed]
            self._members = {a: m for a, m in self._members.items() if m is self._seed}
        for m in ms:
            self._end_member(m)

    def _hold(self, m: _Member) -> None:
        """Keeps the rank's session with offers open on a daemon other than
        the seed until its stop."""
        p = m.prefill
        release = p._mux.acquire()
        fails = not_found = 0
        try:
            while not m.stop.is_set():
                try:
                    s = p._mux.get(Deadline(p._heartbeat_interval()))
                except DecodeplaneError as e:
                    if m.stop.is_set():
                        return
                    self._report(m.addr, e)
                    fails += 1
                    not_found = self._unknown_rank(m, e, not_found)
                    if isinstance(e, IncarnationChangedError):
                        continue  # learned: the next hello names the new incarnation
                    m.stop.wait(min(p._c._retry.backoff(fails), p._cadence()))
                    continue
                fails = not_found = 0
                opened = time.monotonic()
                while not s.wait(0.25):
                    if m.stop.is_set():
                        return
                self._report(m.addr, s.error or local_error("PrefillSession", grpc.StatusCode.UNAVAILABLE,
                                                            "the prefill session ended"))
                if time.monotonic() - opened < p._cadence():
                    fails += 1
                    m.stop.wait(min(p._c._retry.backoff(fails), p._cadence()))
        finally:
            release()

    def _unknown_rank(self, m: _Member, err: BaseException, n: int) -> int:
        """Counts a daemon's NOT_FOUND refusals of the rank's session; the
        third in a row while the seed has been unreachable for a heartbeat
        interval registers the rank through this daemon."""
        if not isinstance(err, NotFoundError):
            return 0
        n += 1
        p = m.prefill
        if n < 3 or time.monotonic() - self._seed_live < p._heartbeat_interval():
            return n
        try:
            p.register(timeout=p._heartbeat_interval())
        except DecodeplaneError as e:
            self._report(m.addr, e)
            return n
        return 0

    # ---- hand-offs ----

    def bind_room(self, room: int, *, timeout: Optional[float] = None) -> bool:
        """:meth:`Prefill.bind_room` (SGLang's /register_dp_rank) for a prefill
        that does not follow follow_bootstrap_room: a daemon offers a room only
        once its DP rank is resolved, so the room's daemon is not known yet,
        and the binding goes to every daemon the rank holds a session with
        (the seed included). Returns whether a daemon replaced an earlier
        binding; raises the first daemon's error, if any."""
        with self._lock:
            ps = [self._seed.prefill] + [m.prefill for m in self._members.values() if m is not self._seed]
        calls = [_Call(lambda p=p: p.bind_room(room, timeout=timeout)) for p in ps]
        replaced, first = False, None
        for c in calls:
            c.join()
            if c.error is not None:
                first = first or c.error
            else:
                replaced = replaced or bool(c.result)
        if first is not None:
            raise first
        return replaced

    def send_room(self, room: int, *, chunk_pages: int = 0,
                  source: Optional[Callable[[Chunk], rooms_pb2.TransferSource]] = None,
                  output_ids: Sequence[int] = (), timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """:meth:`Prefill.send_room` through the daemon that holds ``room``
        (same arguments, results and errors), without naming it: it waits for
        the room's offer (at most ``offer_wait``: NotFoundError past it,
        bounded by ``timeout``) and hands the room off on the session it came
        on. A room offered before is claimed again on its daemon:
        UnavailableError when the daemon cannot be reached,
        IncarnationChangedError when it restarted."""
        return self._hand_off("SendRoom", room, chunk_pages, timeout,
                              lambda p: p._transfer_move(room, source, output_ids, p._mux.chunk))

    def report_room(self, room: int, *, move: Optional[Callable[[Chunk, threading.Event], int]] = None,
                    chunk_pages: int = 0, timeout: Optional[float] = None) -> Optional[rooms_pb2.Destination]:
        """send_room for a prefill that moves the bytes itself, as
        :meth:`Prefill.report_room`."""
        return self._hand_off("ReportRoom", room, chunk_pages, timeout,
                              lambda p: p._report_move(room, move, p._mux.report))

    def _hand_off(self, op: str, room: int, chunk_pages: int, timeout: Optional[float],
                  make_move: Callable[[Prefill], Any]) -> Optional[rooms_pb2.Destination]:
        if chunk_pages < 0:
            raise local_error(op, grpc.StatusCode.INVALID_ARGUMENT,
                              f"chunk_pages: {chunk_pages} must be >= 0 (0 sends every page in one chunk)")
        dl = Deadline(timeout)
        offer, route = self._offers.take(op, room, self._offer_wait, dl)
        p = offer.prefill if offer is not None else route[0]  # type: ignore[index]
        if p._c.closed:
            if offer is not None:
                offer.claim.close()
            raise local_error(op, grpc.StatusCode.UNAVAILABLE, f"room {room}'s daemon left the fleet")
        if offer is None:
            inc = p.incarnation
            if route[1] and inc and inc != route[1]:  # type: ignore[index]
                raise IncarnationChangedError(room=room, old=route[1], new=inc, op=op)  # type: ignore[index]
        release = p._mux.acquire()
        tr = p._mux.transport(first=offer.claim if offer is not None else None)
        try:
            return p._hand_off(op, room, chunk_pages, tr, make_move(p), dl)
        finally:
            if offer is not None:
                offer.claim.close()  # the hand-off's claim ended with it; a no-op then
            release()

    def take_offer(self, room: int) -> Optional[FleetOffer]:
        """For a caller that drives its own claims (a poll loop that must not
        block, as SGLang's scheduler): the room's daemon and its offered
        claim, without waiting; None while no daemon offered the room. The
        offer is taken once: a second call answers the daemon without a
        claim."""
        offer, route = self._offers.take_now(room)
        if offer is not None:
            return FleetOffer(self.address_of(offer.prefill), offer.prefill, offer.claim)
        if route is not None:
            return FleetOffer(self.address_of(route[0]), route[0], None)
        return None

    # ---- state ----

    def address_of(self, prefill: Prefill) -> str:
        """The advertised address of the daemon ``prefill`` (one of this
        rank's Prefills) is on; the seed's address as given before GetFleet
        named it; "" for a Prefill of a daemon that left the fleet."""
        with self._lock:
            for addr, m in self._members.items():
                if m.prefill is prefill:
                    return addr
        return self._seed.addr if prefill is self._seed.prefill else ""

    def owner(self, room: int) -> Optional[str]:
        """The advertised address of the daemon that offered ``room`` (None
        when no daemon offered it yet, or it was forgotten)."""
        p = self._offers.owner(room)
        if p is None:
            return None
        return self.address_of(p) or None

    def refresh(self) -> None:
        """Lists the fleet once now (as the loop does every ``refresh``
        seconds): names the seed's advertised address and opens sessions with
        the daemons not held yet. For a caller that wants the fleet's
        sessions before the loop's first listing: call it before
        :meth:`start`, once the rank is registered (:attr:`seed`'s
        register)."""
        self._refresh_once()

    def daemons(self) -> list[FleetDaemonState]:
        """The daemons the rank keeps a session with, sorted by address."""
        with self._lock:
            ms = dict(self._members)
            if self._seed_addr is None:
                ms[self._seed.addr] = self._seed
        return sorted((FleetDaemonState(addr, m is self._seed, m.prefill.incarnation, m.prefill._mux.live() is not None)
                       for addr, m in ms.items()), key=lambda d: d.address)

    def close(self) -> None:
        """Ends the loop, the hand-offs waiting for an offer (CanceledError)
        and every client it made. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._offers.close()
        if self._thread is not None:
            self._thread.join()
        self._stop_members()
        self._seed.client.close()

    def __enter__(self) -> "FleetPrefill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
