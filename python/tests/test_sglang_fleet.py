"""The SGLang plugin in a fleet of decode daemons: a development etcd
(bin/decodeplane-dev-etcd), two decode daemons on it (kv_pool.owner
engine), one decode engine beside each, and one prefill engine registered
through the first daemon only. The prefill's ranks are told only each
request's room (as SGLang's are): the daemon that opened it offers it, and
the chunks, reports and acknowledgements go to that daemon."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from tests.sglang_case import load_plugin, room_id  # noqa: I001 - first: puts SGLang on sys.path

import unittest

import decodeplane
from decodeplane.v1 import common_pb2
from tests import sglang_movers
from tests.daemon import OWNER_SETS, Daemon
from tests.sglang_engines import DecodeEngine, PrefillEngine
from tests.sglang_env import WAIT, Shm
from tests.test_fleet import DevEtcd, fleet_daemon

FAILED = common_pb2.ROOM_PHASE_FAILED
RELEASED = common_pb2.ROOM_PHASE_RELEASED
TEST_MOVER = {"DECODEPLANE_SGLANG_MOVER": "tests.sglang_movers:mover"}


class FleetCase(unittest.TestCase):
    """Two daemons of one fleet for the class; engines per test, all on one
    DECODEPLANE_SGLANG_NAMESPACE (a fleet's prefill finds each decode
    rank's buffers by the room's daemon)."""

    etcd: DevEtcd
    daemons: list[Daemon]

    @classmethod
    def setUpClass(cls) -> None:
        load_plugin()
        cls.etcd = DevEtcd().start()
        prefix = f"/py-sglang-fleet-{uuid.uuid4().hex[:8]}/"
        cls.daemons = []
        try:
            for _ in range(2):
                cls.daemons.append(fleet_daemon(cls.etcd, prefix, *OWNER_SETS, "release.deferred_timeout=30s").start())
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        for d in cls.daemons:
            d.stop()
        cls.etcd.stop()

    def setUp(self) -> None:
        self.shm = Shm()
        self.addCleanup(self.shm.close)
        self.addCleanup(sglang_movers.release_all)
        self.namespace = f"dpfleet{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.clients = []
        for d in self.daemons:
            c = decodeplane.Client(d.addr, timeout=WAIT)
            self.addCleanup(c.close)
            self.clients.append(c)
        for c in self.clients:
            _poll("both daemons in the registry", lambda c=c: len(c.admin.get_fleet().daemons) == 2)
        self.decodes = []
        for d in self.daemons:
            e = DecodeEngine(d.addr, self.shm, self.namespace)
            self.addCleanup(e.stop)
            self.decodes.append(e)

    def prefill(self, tp: int, **env: str) -> PrefillEngine:
        """A prefill engine of tp ranks whose DECODEPLANE_TARGET is the first
        daemon (DECODEPLANE_SGLANG_FLEET unset: auto)."""
        env["DECODEPLANE_SGLANG_INSTANCE_ID"] = f"inst-{self.namespace}"
        p = PrefillEngine(self.daemons[0].addr, self.shm, self.namespace, tp=tp,
                          bootstrap_port=18000 + os.getpid() % 1000, env=env)
        self.addCleanup(p.stop)
        return p

    def fleet_rank(self, p: PrefillEngine, r: int) -> decodeplane.FleetPrefill:
        side = p.manager(r).dp_prefill
        self.assertTrue(side.fleet, "DECODEPLANE_SGLANG_FLEET=auto did not see the etcd registry")
        f = side.fleet_rank(f"127.0.0.1:{p.bootstrap_port}")
        assert f is not None
        return f

    def submit(self, p: PrefillEngine, i: int, prompt_len: int) -> tuple[str, int]:
        room = room_id()
        rid = f"fleet-{room}"
        self.decodes[i].submit(rid, room, prompt_len, p.bootstrap_port)
        p.submit(rid, room, prompt_len)
        return rid, room



class SGLangFleetTest(FleetCase):
    def test_rooms_on_both_decode_instances(self) -> None:
        """Rooms alternate between the two decode instances; the prefill (TP
        2, registered through the first daemon) hands each off to the daemon
        that opened it: every room succeeds, byte for byte in every layer and
        aux row, with its marker, in the decode engine that asked for it."""
        p = self.prefill(tp=2)
        for r in range(2):
            f = self.fleet_rank(p, r)
            p.wait("the rank's sessions with both daemons",
                   lambda f=f: sorted(d.address for d in f.daemons() if d.session)
                   == sorted(d.addr for d in self.daemons))
        rooms = [(i % 2, *self.submit(p, i % 2, n)) for i, n in enumerate((40, 16, 70, 33, 50, 64))]
        for i, rid, room in rooms:
            d = self.decodes[i]
            d.outcome(rid)
            d.verify(rid, prefill_tp=2)
            for rk in p.outcome(rid):
                self.assertEqual(rk.failure, "")
            got = self.clients[i].engine.get_room(room)
            self.assertEqual(got.rid, rid)
            self.assertEqual(sorted((c.tp_rank, c.last_landed) for c in got.coverage), [(0, True), (1, True)])
            with self.assertRaises(decodeplane.NotFoundError):
                self.clients[1 - i].engine.get_room(room)
            for r in range(2):
                self.assertEqual(self.fleet_rank(p, r).owner(room), self.daemons[i].addr)
            d.wait(f"room {room} released", lambda i=i, room=room: self.clients[i].engine.get_room(room).phase == RELEASED)
        addr = f"127.0.0.1:{p.bootstrap_port}"
        [inst] = [x for x in self.clients[1].admin.get_fleet().prefills if x.bootstrap_addr == addr]
        self.assertEqual((inst.registered_via, inst.registered_ranks), (self.daemons[0].addr, 2))

    def test_abort_on_the_second_daemon_mid_transfer(self) -> None:
        """A room of the second daemon is aborted while the prefill rank
        writes its second chunk: the failure reaches the rank on the second
        daemon's session, which acknowledges there once it stopped writing;
        SGLang's decode frees the pages only after that. A room on the first
        daemon, sent meanwhile, succeeds."""
        p = self.prefill(tp=1, **TEST_MOVER)
        f = self.fleet_rank(p, 0)
        p.wait("the rank's session with the second daemon",
               lambda: any(d.session and d.address == self.daemons[1].addr for d in f.daemons()))
        room = room_id()
        rid = f"fleet-held-{room}"
        entered, release = sglang_movers.hold(room, 2)
        self.decodes[1].submit(rid, room, 64, p.bootstrap_port)
        p.submit(rid, room, 64)
        self.assertTrue(entered.wait(WAIT), "chunk 1 never started")
        self.assertEqual(f.owner(room), self.daemons[1].addr)
        other_rid, other = self.submit(p, 0, 40)
        self.decodes[0].outcome(other_rid)
        self.decodes[0].verify(other_rid, prefill_tp=1)
        self.decodes[1].abort(rid)
        c = self.clients[1]
        self.decodes[1].wait("the room failed", lambda: c.engine.get_room(room).phase == FAILED)
        time.sleep(0.5)  # long enough for a premature Failed to have been acted on
        self.assertEqual(_released(self.decodes[1], rid), [], "the pages went back while the prefill rank still wrote")
        dec = self.decodes[1].manager().dp_decode
        self.assertEqual(dec.poll(dec.state(room)), 3, "Transferring while draining")
        release.set()
        [req] = self.decodes[1].outcome(rid)
        self.assertIn("Aborted by AbortReq", str(req.finished_reason))
        self.assertEqual(len(_released(self.decodes[1], rid)), 1)
        [preq] = p.outcome(rid)
        self.assertIn("Aborted by AbortReq", preq.failure)
        self.assertEqual(p.outcome(other_rid)[0].failure, "")


class SGLangFleetOwnerKilledTest(FleetCase):
    """A fleet of its own: the second daemon is killed (SIGKILL)."""

    def test_owner_killed_mid_transfer(self) -> None:
        """The second daemon is killed while the prefill rank writes a room
        of its: the room fails on the prefill side once no session with that
        daemon could be opened for DECODEPLANE_SGLANG_RPC_TIMEOUT (1 s here),
        and rooms of the first daemon keep flowing."""
        p = self.prefill(tp=1, DECODEPLANE_SGLANG_RPC_TIMEOUT="1", **TEST_MOVER)
        f = self.fleet_rank(p, 0)
        p.wait("the rank's session with the second daemon",
               lambda: any(d.session and d.address == self.daemons[1].addr for d in f.daemons()))
        room = room_id()
        rid = f"fleet-killed-{room}"
        entered, _release = sglang_movers.hold(room, 2)
        self.decodes[1].submit(rid, room, 64, p.bootstrap_port)
        p.submit(rid, room, 64)
        self.assertTrue(entered.wait(WAIT), "chunk 1 never started")
        self.daemons[1].kill()
        start = time.monotonic()
        [preq] = p.outcome(rid)
        took = time.monotonic() - start
        self.assertIn(f"its decode daemon {self.daemons[1].addr} could not be reached for 1s", preq.failure)
        self.assertLess(took, 5.0)
        rid0, _ = self.submit(p, 0, 40)
        self.decodes[0].outcome(rid0)
        self.decodes[0].verify(rid0, prefill_tp=1)
        self.assertEqual(p.outcome(rid0)[0].failure, "")


def _released(engine: Any, rid: str) -> list[float]:
    return [t for rk in engine.ranks for (r, _pages, t) in rk.released if r == rid]


def _poll(what: str, fn: Any, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


if __name__ == "__main__":
    unittest.main()
