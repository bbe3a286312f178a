"""The SGLang plugin's hand-offs through the real daemon (engine owner): the
stand-in's (or real SGLang's) schedulers build the plugin's classes through
get_kv_class, and the KV lands byte for byte in the decode engine's
shared-memory buffers."""

from __future__ import annotations

from decodeplane.v1 import common_pb2
from tests.sglang_case import SGLangCase
from tests.sglang_env import WAIT

SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED
RELEASED = common_pb2.ROOM_PHASE_RELEASED


class HandoffTest(SGLangCase):
    def test_tp1_to_tp1(self) -> None:
        d, p = self.decode(tp=1), self.prefill(tp=1)
        rids = [self.handoff(p, d, n) for n in (40, 16, 70)]  # pages of 16: partial, exact, 5 pages
        for rid, room in rids:
            d.outcome(rid)
            d.verify(rid, prefill_tp=1)
            self.assertEqual(p.outcome(rid)[0].failure, "")
            # Released once SGLang cleared the receiver (the engine decodes in its pages).
            d.wait(f"room {room} released",
                   lambda r=room: self.client.engine.get_room(r).phase == RELEASED)
        st = self.client.admin.status()
        self.assertEqual(st.layout.page_owner, "engine")

    def test_tp2_to_tp1(self) -> None:
        d, p = self.decode(tp=1), self.prefill(tp=2)
        rid, room = self.handoff(p, d, 50)
        d.outcome(rid)
        d.verify(rid, prefill_tp=2)
        r = self.client.engine.get_room(room)
        self.assertEqual(sorted((c.tp_rank, c.last_landed) for c in r.coverage), [(0, True), (1, True)])
        for rk in p.outcome(rid):
            self.assertEqual(rk.failure, "")

    def test_fleet_mode_on_one_daemon(self) -> None:
        """DECODEPLANE_SGLANG_FLEET=on against a daemon whose registry is in
        memory (a fleet of one): the daemon offers each room to the rank,
        which hands it off as a fleet's rank; auto (the default) claims
        instead."""
        d = self.decode(tp=1)
        p = self.prefill(tp=1, env={"DECODEPLANE_SGLANG_FLEET": "on"})
        auto = self.prefill(tp=1)
        self.assertTrue(p.manager().dp_prefill.fleet)
        self.assertFalse(auto.manager().dp_prefill.fleet)
        rooms = []
        for e in (p, auto):
            rid, room = self.handoff(e, d, 40)
            rooms.append(room)
            d.outcome(rid)
            d.verify(rid, prefill_tp=1)
            self.assertEqual(e.outcome(rid)[0].failure, "")
        f = p.manager().dp_prefill.fleet_rank(f"127.0.0.1:{p.bootstrap_port}")
        self.assertEqual(f.owner(rooms[0]), self.daemon.addr)
        self.assertIsNone(auto.manager().dp_prefill.fleet_rank(f"127.0.0.1:{auto.bootstrap_port}"))


class DecodeTP2Test(SGLangCase):
    SETS = SGLangCase.SETS + ("parallel.attn_tp=2",)

    def test_tp1_to_tp2(self) -> None:
        """Decode TP 2: rank 0 opens and declares each room, rank 1 follows
        it on its own session; both commit only when both ranks' pages and
        metadata rows landed (MIN)."""
        d, p = self.decode(tp=2), self.prefill(tp=1)
        rid, room = self.handoff(p, d, 33)
        d.outcome(rid)
        d.verify(rid, prefill_tp=1)
        leader, follower = d.manager(0).dp_decode, d.manager(1).dp_decode
        self.assertTrue(leader.leader)
        self.assertFalse(follower.leader)
        # One room, opened once: the follower never opened one.
        self.assertEqual(self.client.engine.get_room(room).rid, rid)
        self.assertEqual([r.room for r in self.client.admin.list_rooms(limit=1000).rooms].count(room), 1)
        p.outcome(rid, timeout=WAIT)
