"""The SGLang plugin's delegated mover (DECODEPLANE_SGLANG_MOVER=delegated)
through the real daemon (kv_pool.owner: engine, transfer.path: delegate)
and the real reference transfer agent: each decode rank registers SGLang's
buffers as its engine layout in shared memory, each prefill rank registers
its own at the agent and sends its chunks with the Transfer op, and the
agent writes the bytes into the decode engine's buffers — checked byte for
byte in every layer, aux row and marker. A batch the agent holds keeps an
aborted room's pages from SGLang until it ended; a batch the agent fails
fails the room. And RegisterEngineLayout itself, against the daemon."""

from __future__ import annotations

import time
import unittest
from typing import Any, Optional

import numpy as np

import decodeplane
from decodeplane.v1 import common_pb2, engine_layout_pb2
from tests.agent import Agent
from tests.daemon import OWNER_SETS, Daemon
from tests.sglang_case import SGLangCase, load_plugin
from tests.sglang_engines import PrefillEngine
from tests.sglang_env import WAIT, Shm
from tests.test_sglang_faults import ReusableProbe, released_at

FAILED = common_pb2.ROOM_PHASE_FAILED
RELEASED = common_pb2.ROOM_PHASE_RELEASED
#: The daemon's pool (OWNER_SETS): 256 pages; request_slots 16 make 96
#: metadata slots (2 × (16 + 32 pre-allocated)). The decode engine's buffers
#: hold as many, as SGLang's are sized from the same figures.
PAGES, META = 256, 96
#: One page of one layer on a decode rank of TP 1: 16 tokens × 2 heads × 16 dims × bf16.
ITEM = 16 * 2 * 16 * 2
#: The aux rows copied with each rank's last chunk (every aux buffer of the
#: stand-in's MetadataBuffers but the marker's: 4 × 64 + 32 + 16 bytes) and the marker.
AUX_BYTES = 4 * 64 + 32 + 16 + 8
#: Rooms the agent holds (never runs until their deadline) or fails.
HELD_ROOM, FAILED_ROOM = 9_300_001, 9_300_002
BATCH_TIMEOUT = 3.0


class ShmPrefill(PrefillEngine):
    """A prefill engine whose KV and metadata buffers are in shared memory
    (the agent reads them)."""

    @property
    def zeros(self) -> Any:
        return self.shm.zeros


class DelegatedCase(SGLangCase):
    """An agent and a daemon on the delegated path per class."""

    AGENT_ARGS: tuple[str, ...] = ()
    EXTRA_SETS: tuple[str, ...] = ()

    @classmethod
    def setUpClass(cls) -> None:
        load_plugin()
        cls.class_shm = Shm()
        cls.agent = Agent(*cls.AGENT_ARGS).start()
        try:
            cls.daemon = Daemon(*OWNER_SETS, *cls.EXTRA_SETS,
                                args=("--transfer-path", "delegate", "--agent", cls.agent.addr,
                                      "--set", "transfer.delegate.health_interval=200ms")).start()
        except BaseException:
            cls.agent.stop()
            raise
        with decodeplane.Client(cls.daemon.addr, timeout=WAIT) as c:
            end = time.monotonic() + WAIT
            while not c.admin.status().ready:
                if time.monotonic() > end:
                    raise AssertionError(f"the daemon never became ready:\n{cls.daemon.log()}")
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
        cls.agent.stop()
        cls.class_shm.close()

    def setUp(self) -> None:
        super().setUp()
        # One shared-memory directory for the class: the daemon registers
        # the last layout of each decode rank with the agent again on every
        # health check, so its files outlive the test that created them.
        self.shm = type(self).class_shm

    def env(self) -> dict[str, str]:
        return {"DECODEPLANE_SGLANG_MOVER": "delegated", "DECODEPLANE_SGLANG_AGENT": self.agent.addr}

    def decode(self, tp: int = 1, **kw: Any) -> Any:
        kw.setdefault("pages", PAGES)
        kw.setdefault("meta_slots", META)
        return super().decode(tp, env=self.env(), **kw)

    def prefill(self, tp: int = 1, instance_id: Optional[str] = None, port: Optional[int] = None,
                **kw: Any) -> Any:
        e = ShmPrefill(self.daemon.addr, self.shm, self.namespace, tp=tp, bootstrap_port=port or _port(),
                       env={**self.env(), "DECODEPLANE_SGLANG_INSTANCE_ID": instance_id or f"inst-{self.namespace}"},
                       **kw)
        self.addCleanup(e.stop)
        return e

    def moved(self, room: int, prefill_tp: int, pages: int) -> None:
        """The daemon counted what its agent moved: each prefill rank's share
        of every K and V buffer of every page, its aux rows and the marker."""
        r = self.client.engine.get_room(room)
        per_rank = pages * 8 * ITEM // prefill_tp + AUX_BYTES
        self.assertEqual(r.bytes_transferred, prefill_tp * per_rank)
        self.assertEqual(sorted((c.tp_rank, c.pages_landed, c.last_landed) for c in r.coverage),
                         [(t, pages, True) for t in range(prefill_tp)])


_ports = iter(range(19000, 20000))


def _port() -> int:
    return next(_ports)


class DelegatedHandoffTest(DelegatedCase):
    def test_tp1_to_tp1(self) -> None:
        d, p = self.decode(tp=1), self.prefill(tp=1)
        rids = [(self.handoff(p, d, n), n) for n in (40, 16, 70)]  # pages of 16: partial, exact, 5 pages
        for (rid, room), n in rids:
            d.outcome(rid)
            d.verify(rid, prefill_tp=1)
            [preq] = p.outcome(rid)
            self.assertEqual(preq.failure, "")
            self.moved(room, 1, -(-n // 16))
            d.wait(f"room {room} released", lambda r=room: self.client.engine.get_room(r).phase == RELEASED)
        st = self.client.admin.status()
        self.assertEqual((st.layout.page_owner, st.transfer_path), ("engine", "delegate"))
        [lay] = [x for x in st.engine_layouts if x.decode_tp_rank == 0]
        self.assertEqual(lay.layout_id, d.manager().dp_mover.layout_id)
        self.assertEqual([b.name for b in lay.layout.kv][:2], [f"{self.namespace}/dp0/tp0/k/0",
                                                                f"{self.namespace}/dp0/tp0/k/1"])
        self.assertEqual(lay.layout.marker, f"{self.namespace}/dp0/tp0/aux/6")

    def test_tp2_to_tp1(self) -> None:
        d, p = self.decode(tp=1), self.prefill(tp=2)
        for n in (50, 33):
            rid, room = self.handoff(p, d, n)
            d.outcome(rid)
            d.verify(rid, prefill_tp=2)
            self.moved(room, 2, -(-n // 16))
            for rk in p.outcome(rid):
                self.assertEqual(rk.failure, "")

    def test_prefill_without_agent_is_refused(self) -> None:
        with self.assertRaises(RuntimeError) as cm:
            ShmPrefill(self.daemon.addr, self.shm, self.namespace, bootstrap_port=_port(),
                       env={"DECODEPLANE_SGLANG_MOVER": "delegated"})
        self.assertIn("needs DECODEPLANE_SGLANG_AGENT", str(cm.exception))


class DelegatedFaultTest(DelegatedCase):
    AGENT_ARGS = ("--fault-hold-rooms", str(HELD_ROOM), "--fault-hold-past-cancel",
                  "--fault-fail-rooms", str(FAILED_ROOM))
    EXTRA_SETS = (f"transfer.delegate.batch_timeout={BATCH_TIMEOUT:g}s", "release.deferred_timeout=30s")

    def test_abort_while_the_agent_holds_a_batch(self) -> None:
        """SGLang aborts a room while the agent holds its batch (a copy that
        cannot be recalled): the room fails at once, but SGLang's poll says
        Failed, and the pages go back, only once the batch ended at its
        deadline and the daemon said the pages are reusable."""
        d, p = self.decode(), self.prefill()
        rid = "held"
        d.submit(rid, HELD_ROOM, 64, p.bootstrap_port)
        p.submit(rid, HELD_ROOM, 64)
        d.wait("the agent holds the room's batch", lambda: f"room={HELD_ROOM}" in self.agent.log()
               and "batch held" in self.agent.log())
        held_at = time.monotonic()
        probe = ReusableProbe(self.client, HELD_ROOM)
        d.abort(rid)
        d.wait("the room failed", lambda: self.client.engine.get_room(HELD_ROOM).phase == FAILED)
        st = d.manager().dp_decode.state(HELD_ROOM)
        time.sleep(0.5)  # long enough for a premature Failed to have been acted on
        self.assertEqual(released_at(d, rid), [], "the pages went back while the agent's batch could still write")
        self.assertEqual(d.manager().dp_decode.poll(st), 3, "Transferring while the batch is held")
        self.assertEqual(probe.at, 0.0)
        [req] = d.outcome(rid)
        self.assertIn("Aborted by AbortReq", str(req.finished_reason))
        probe.join()
        [t] = released_at(d, rid)
        self.assertGreater(probe.at, 0.0)
        self.assertGreaterEqual(probe.at, held_at + BATCH_TIMEOUT - 1.0, "reusable before the held batch's deadline")
        self.assertGreaterEqual(t, probe.at - 0.05)  # freed after the daemon said reusable (clocks: one process)
        [preq] = p.outcome(rid)
        self.assertNotEqual(preq.failure, "")
        # The engines go on.
        rid2, room2 = self.handoff(p, d, 30)
        d.outcome(rid2)
        d.verify(rid2, prefill_tp=1)

    def test_failed_batch(self) -> None:
        d, p = self.decode(), self.prefill(tp=2)
        rid = "broken"
        d.submit(rid, FAILED_ROOM, 64, p.bootstrap_port)
        p.submit(rid, FAILED_ROOM, 64)
        [req] = d.outcome(rid)
        self.assertIn("injected fault", str(req.finished_reason))
        self.assertEqual(self.client.engine.get_room(FAILED_ROOM).failure.code, common_pb2.FAILURE_CODE_TRANSFER_FAILED)
        self.assertEqual(len(released_at(d, rid)), 1)
        for preq in p.outcome(rid):
            self.assertNotEqual(preq.failure, "")
        rid2, room2 = self.handoff(p, d, 30)
        d.outcome(rid2)
        d.verify(rid2, prefill_tp=2)
        self.moved(room2, 2, 2)


class RegisterEngineLayoutTest(DelegatedCase):
    """RegisterEngineLayout against the daemon (and, through it, the agent)."""

    def layout(self, short: Optional[int] = None) -> engine_layout_pb2.EngineLayout:
        lay = engine_layout_pb2.EngineLayout()
        for kv in "kv":
            for layer in range(4):
                n = PAGES * ITEM - (ITEM if short == layer and kv == "v" else 0)
                lay.kv.add(name=f"{self.namespace}/reg/{kv}/{layer}", layer=layer, value=kv == "v", item_len=ITEM,
                           length=n, memory=self.shm_region(PAGES * ITEM))
        for i, row in enumerate((64, 64, 64)):
            lay.aux.add(name=f"{self.namespace}/reg/aux/{i}", row_len=row, length=META * row,
                        memory=self.shm_region(META * row))
        lay.marker = lay.aux[-1].name
        return lay

    def shm_region(self, n: int) -> engine_layout_pb2.EngineMemory:
        a = self.shm.zeros((n,), np.uint8)
        self.addCleanup(lambda a=a: a._mmap.close() if getattr(a, "_mmap", None) is not None else None)
        return engine_layout_pb2.EngineMemory(shared=engine_layout_pb2.EngineSharedMemory(path=a.filename, offset=0))

    def test_register_engine_layout(self) -> None:
        lay = self.layout()
        first = self.client.engine.register_engine_layout(decode_dp_rank=0, decode_tp_rank=0, layout=lay)
        self.assertNotEqual(first.layout_id, 0)
        self.assertFalse(first.already)
        again = self.client.engine.register_engine_layout(decode_dp_rank=0, decode_tp_rank=0, layout=lay)
        self.assertEqual((again.layout_id, again.already), (first.layout_id, True))
        [reg] = [x for x in self.client.admin.status().engine_layouts if x.decode_tp_rank == 0]
        self.assertEqual(reg.layout_id, first.layout_id)
        self.assertFalse(reg.layout.kv[0].HasField("memory"))  # the memory is the engine's to hand out
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.register_engine_layout(decode_dp_rank=0, decode_tp_rank=0, layout=self.layout(short=2))
        self.assertEqual(cm.exception.field, "layout.kv[6].length", cm.exception.message)
        self.assertIn(str(PAGES * ITEM - ITEM), cm.exception.message)

    def test_rank_outside_the_shard(self) -> None:
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.register_engine_layout(decode_dp_rank=0, decode_tp_rank=1, layout=self.layout())
        self.assertEqual(cm.exception.field, "decode_tp_rank", cm.exception.message)


class LayoutUnitTest(unittest.TestCase):
    """The layout and source buffers the delegated mover builds from SGLang's
    pointers (a /proc/self/maps text), without a daemon."""

    MAPS = ("7f0000000000-7f0000100000 rw-s 00000000 00:1a 1 /dev/shm/kv\n"
            "7f0000100000-7f0000200000 rw-s 00000000 00:1a 2 /dev/shm/aux\n"
            "7f0000200000-7f0000300000 rw-p 00000000 00:00 0\n")

    def bufs(self, n_kv: int, kv_base: int = 0x7F0000000000) -> Any:
        from decodeplane.sglang.buffers import Buffer, EngineBuffers

        kv = [Buffer(kv_base + i * 0x10000, 0x10000, 1024) for i in range(n_kv)]
        aux = [Buffer(0x7F0000100000 + i * 0x1000, 0x1000, 64) for i in range(3)]
        return EngineBuffers(page_size=16, kv=kv, aux=aux, heads_per_rank=2)

    def test_roles(self) -> None:
        from decodeplane.sglang.delegated import kv_roles

        self.assertEqual(kv_roles(4, mla=False, num_layers=2), [("k", 0), ("k", 1), ("v", 0), ("v", 1)])
        self.assertEqual(kv_roles(4, mla=False, num_layers=4, start_layer=2), [("k", 2), ("k", 3), ("v", 2), ("v", 3)])
        self.assertEqual(kv_roles(6, mla=False, num_layers=2)[4:], [("draft/k", 0), ("draft/v", 0)])
        self.assertEqual(kv_roles(3, mla=True, num_layers=2), [("k", 0), ("k", 1), ("draft/k", 0)])
        from decodeplane.sglang.buffers import BufferError

        with self.assertRaises(BufferError):
            kv_roles(5, mla=False, num_layers=2)

    def test_layout(self) -> None:
        from decodeplane.sglang.delegated import engine_layout, prefill_buffers
        from decodeplane.transfer.v1 import agent_pb2

        lay = engine_layout(self.bufs(4), "ns/dp0/tp0", mla=False, num_layers=2, maps=self.MAPS)
        self.assertEqual([(b.name, b.layer, b.value, b.memory.shared.offset) for b in lay.kv],
                         [("ns/dp0/tp0/k/0", 0, False, 0), ("ns/dp0/tp0/k/1", 1, False, 0x10000),
                          ("ns/dp0/tp0/v/0", 0, True, 0x20000), ("ns/dp0/tp0/v/1", 1, True, 0x30000)])
        self.assertEqual({b.memory.shared.path for b in lay.kv}, {"/dev/shm/kv"})
        self.assertEqual([(a.name, a.row_len, a.memory.shared.offset) for a in lay.aux][2], ("ns/dp0/tp0/aux/2", 64, 0x2000))
        self.assertEqual(lay.marker, "ns/dp0/tp0/aux/2")
        src = prefill_buffers(self.bufs(4), "P", mla=False, num_layers=4, start_layer=2, maps=self.MAPS)
        self.assertEqual([b.name for b in src], ["P/k/2", "P/k/3", "P/v/2", "P/v/3", "P/aux/0", "P/aux/1", "P/aux/2"])
        self.assertEqual({b.kind for b in src}, {agent_pb2.BUFFER_KIND_PREFILL_KV})

    def test_refusals(self) -> None:
        from decodeplane.sglang.buffers import BufferError
        from decodeplane.sglang.delegated import engine_layout

        with self.assertRaises(BufferError) as cm:  # private memory, as GPU memory would be
            engine_layout(self.bufs(2, kv_base=0x7F0000200000), "ns", mla=False, num_layers=1, maps=self.MAPS)
        self.assertIn("KV buffer 0", str(cm.exception))
        self.assertIn("GPU buffers need a GPU transfer agent", str(cm.exception))
        with self.assertRaises(BufferError) as cm:  # the agent maps whole pages
            engine_layout(self.bufs(2, kv_base=0x7F0000000800), "ns", mla=False, num_layers=1, maps=self.MAPS)
        self.assertIn("offset 2048 of /dev/shm/kv, not a multiple of 4096", str(cm.exception))

    def test_settings(self) -> None:
        from decodeplane.sglang.config import Settings, SettingsError

        s = Settings.from_env({"DECODEPLANE_SGLANG_MOVER": "delegated", "DECODEPLANE_SGLANG_AGENT": "10.0.0.1:7700"})
        self.assertEqual((s.mover, s.agent), ("delegated", "10.0.0.1:7700"))
        with self.assertRaises(SettingsError) as cm:
            Settings.from_env({"DECODEPLANE_SGLANG_AGENT": "agent"})
        self.assertIn("DECODEPLANE_SGLANG_AGENT", str(cm.exception))


if __name__ == "__main__":  # pragma: no cover
    unittest.main()
