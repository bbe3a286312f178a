"""The SGLang plugin's failures through the real daemon (engine owner):
aborts before and after the declaration and mid-transfer while a prefill
rank still writes (SGLang sees Failed, and frees the pages, only once they
are reusable), a failed chunk, a declaration of a page another room's
hand-off holds, a prefill restart and a daemon kill -9."""

from __future__ import annotations

import threading
import time
from typing import Any

import decodeplane
from decodeplane.v1 import common_pb2
from tests import sglang_movers
from tests.daemon import OWNER_SETS
from tests.sglang_case import SGLangCase, room_id
from tests.sglang_env import WAIT

FAILED = common_pb2.ROOM_PHASE_FAILED
QUEUED = common_pb2.ROOM_PHASE_QUEUED
ADMITTED = common_pb2.ROOM_PHASE_ADMITTED
TEST_MOVER = {"DECODEPLANE_SGLANG_MOVER": "tests.sglang_movers:mover"}


class ReusableProbe:
    """Watches a room (its own WatchRoom) and records when its last event
    said its pages are reusable."""

    def __init__(self, client: decodeplane.Client, room: int) -> None:
        self.at = 0.0
        self.events: list[Any] = []
        self._w = client.engine.watch_room(room, history=True, timeout=60)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        for ev in self._w:
            self.events.append(ev)
            if ev.pages_reusable:
                self.at = time.monotonic()

    def join(self) -> None:
        self._t.join(WAIT)


def released_at(engine: Any, rid: str) -> list[float]:
    return [t for rk in engine.ranks for (r, _pages, t) in rk.released if r == rid]


class AbortTest(SGLangCase):
    SETS = OWNER_SETS + ("release.deferred_timeout=30s",)

    def test_abort_before_declaration(self) -> None:
        """The prefill never registers: the room waits for it; SGLang aborts."""
        d = self.decode()
        room = room_id()
        d.submit("early", room, 40, 1)  # a prefill address nobody registers
        d.wait("the room waits for its prefill", lambda: _phase(self.client, room) == common_pb2.ROOM_PHASE_WAITING_PREFILL)
        d.abort("early")
        [req] = d.outcome("early")
        self.assertIn("Aborted by AbortReq", str(req.finished_reason))
        self.assertEqual(_phase(self.client, room), FAILED)
        self.assertEqual(released_at(d, "early"), [])  # it never had pages

    def test_abort_after_declaration(self) -> None:
        """The destination is declared, no prefill rank claimed it: the pages
        are reusable at once."""
        d, p = self.decode(), self.prefill()
        room = room_id()
        d.submit("declared", room, 40, p.bootstrap_port)  # the prefill never gets the request
        d.wait("the declaration", lambda: _phase(self.client, room) == ADMITTED)
        d.abort("declared")
        [req] = d.outcome("declared")
        self.assertIn("Aborted by AbortReq", str(req.finished_reason))
        self.assertEqual(len(released_at(d, "declared")), 1)

    def test_abort_mid_transfer_waits_for_the_writer(self) -> None:
        """Chunk 1 of a room is being written (held) when SGLang aborts it:
        the room fails at once, but SGLang sees Failed and frees the pages
        only after the prefill rank stopped writing and acknowledged."""
        d, p = self.decode(), self.prefill(env=TEST_MOVER)
        room = room_id()
        entered, release = sglang_movers.hold(room, 2)
        d.submit("held", room, 64, p.bootstrap_port)
        p.submit("held", room, 64)
        self.assertTrue(entered.wait(WAIT), "chunk 1 never started")
        probe = ReusableProbe(self.client, room)
        d.abort("held")
        d.wait("the room failed", lambda: _phase(self.client, room) == FAILED)
        st = d.manager().dp_decode.state(room)
        time.sleep(0.5)  # long enough for a premature Failed to have been acted on
        self.assertEqual(released_at(d, "held"), [], "the pages went back while the prefill rank still wrote")
        self.assertEqual(d.manager().dp_decode.poll(st), 3, "Transferring while draining")
        self.assertEqual(probe.at, 0.0)
        release.set()
        [req] = d.outcome("held")
        self.assertIn("Aborted by AbortReq", str(req.finished_reason))
        probe.join()
        [t] = released_at(d, "held")
        self.assertGreater(probe.at, 0.0)
        self.assertGreaterEqual(t, probe.at - 0.05)  # freed after the daemon said reusable (clocks: one process)
        [preq] = p.outcome("held")
        self.assertIn("Aborted by AbortReq", preq.failure)

    def test_failed_chunk(self) -> None:
        d, p = self.decode(), self.prefill(env=TEST_MOVER)
        room = room_id()
        sglang_movers.FAIL[(room, 2)] = "rdma write failed"
        d.submit("broken", room, 64, p.bootstrap_port)
        p.submit("broken", room, 64)
        [req] = d.outcome("broken")
        self.assertIn("rdma write failed", str(req.finished_reason))
        self.assertEqual(self.client.engine.get_room(room).failure.code, common_pb2.FAILURE_CODE_TRANSFER_FAILED)
        self.assertEqual(len(released_at(d, "broken")), 1)
        [preq] = p.outcome("broken")
        self.assertIn("rdma write failed", preq.failure)
        # The engines go on.
        rid, _ = self.handoff(p, d, 30)
        d.outcome(rid)
        d.verify(rid, prefill_tp=1)

    def test_held_page_declaration_refused(self) -> None:
        """An engine that frees a draining room's pages too early and hands
        them to another request: decodeplane refuses that declaration, and
        SGLang gets a clear error for the request."""
        d, p = self.decode(), self.prefill(env=TEST_MOVER)
        room = room_id()
        entered, release = sglang_movers.hold(room, 2)
        d.submit("holder", room, 64, p.bootstrap_port)
        p.submit("holder", room, 64)
        self.assertTrue(entered.wait(WAIT))
        rk = d.ranks[0]
        pages = list(rk.reqs["holder"].kv_pages)
        d.abort("holder")
        d.wait("the room failed", lambda: _phase(self.client, room) == FAILED)
        rk.allocator.free_first(pages)  # the premature free
        other = room_id()
        d.submit("victim", other, 64, p.bootstrap_port)
        [req] = d.outcome("victim")
        msg = str(req.finished_reason)
        self.assertIn(f"is still held by room {room}", msg)
        self.assertIn("draining", msg)
        self.assertIn("refused the destination", msg)
        release.set()
        d.outcome("holder")


class RestartTest(SGLangCase):
    SETS = OWNER_SETS + ("release.deferred_timeout=2s", "engine.resync_timeout=20s")

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        c = decodeplane.Client(cls.daemon.addr, timeout=WAIT)
        c.engine.resync([])  # the daemon admits at once
        c.close()

    def test_prefill_restart(self) -> None:
        """The prefill instance restarts (a new instance id behind the same
        address) while a room is in flight: the room fails, its pages come
        back once the old instance can no longer write (the deferred
        timeout), and the new instance hands rooms off."""
        d = self.decode()
        p1 = self.prefill(env=TEST_MOVER, instance_id="first")
        rid, room = self.handoff(p1, d, 30)
        d.outcome(rid)
        d.verify(rid, prefill_tp=1)
        room = room_id()
        entered, _release = sglang_movers.hold(room, 2)
        d.submit("inflight", room, 64, p1.bootstrap_port)
        p1.submit("inflight", room, 64)
        self.assertTrue(entered.wait(WAIT))
        probe = ReusableProbe(self.client, room)
        p1.stop()  # the process dies (its held write never finishes)
        p2 = self.prefill(instance_id="second", port=p1.bootstrap_port)
        [req] = d.outcome("inflight")
        self.assertIn("replaced", str(req.finished_reason))
        probe.join()
        [t] = released_at(d, "inflight")
        self.assertGreaterEqual(t, probe.at - 0.05)
        rid, _ = self.handoff(p2, d, 50)
        d.outcome(rid)
        d.verify(rid, prefill_tp=1)

    def test_daemon_kill_and_resync(self) -> None:
        """kill -9 of the daemon while a chunk is being written: the decode
        engine re-declares its hand-off in flight to the new daemon, which
        holds its pages until the prefill rank (which learns the new
        incarnation: its old destination is void, its report refused)
        stopped writing and acknowledged; then SGLang frees them. Rooms hand
        off again on the new daemon."""
        d, p = self.decode(), self.prefill(env=TEST_MOVER)
        room = room_id()
        entered, release = sglang_movers.hold(room, 2)
        d.submit("crash", room, 64, p.bootstrap_port)
        p.submit("crash", room, 64)
        self.assertTrue(entered.wait(WAIT))
        old = self.daemon.incarnation
        self.daemon.kill()
        self.daemon.start()
        self.assertNotEqual(self.daemon.incarnation, old)
        c = decodeplane.Client(self.daemon.addr, timeout=WAIT)
        self.addCleanup(c.close)
        d.wait("the hand-off re-declared", lambda: _phase(c, room) == FAILED, timeout=WAIT)
        r = c.engine.get_room(room)
        self.assertEqual(r.failure.code, common_pb2.FAILURE_CODE_SHUTDOWN)
        time.sleep(0.3)
        self.assertEqual(released_at(d, "crash"), [], "freed before the new daemon said reusable")
        release.set()
        [req] = d.outcome("crash")
        self.assertIn("daemon restarted", str(req.finished_reason))
        [preq] = p.outcome("crash")
        self.assertIn("restarted", preq.failure)
        self.assertEqual(len(released_at(d, "crash")), 1)
        rid, _ = self.handoff(p, d, 40)
        d.outcome(rid)
        d.verify(rid, prefill_tp=1)


def _phase(c: decodeplane.Client, room: int) -> int:
    try:
        return c.engine.get_room(room).phase
    except decodeplane.NotFoundError:
        return 0
