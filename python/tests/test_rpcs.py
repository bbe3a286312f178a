"""Every unary RPC and server stream of decodeplane.v1 against the real
daemon: the happy path and a typed error each (the field an
INVALID_ARGUMENT names, NOT_FOUND, FAILED_PRECONDITION, the ErrorInfo
reasons)."""

from __future__ import annotations


import decodeplane
from decodeplane.v1 import common_pb2, rooms_pb2
from tests.base import WAIT, Background, DaemonCase, open_fields, poll, prefill_addr, registration, room_id


class AdminFleetCapacityTest(DaemonCase):
    def test_get_status(self) -> None:
        st = self.client.admin.status()
        self.assertTrue(st.ready)
        self.assertEqual(st.readiness, "serving")
        self.assertEqual(st.incarnation, self.daemon.incarnation)
        self.assertEqual(st.transfer_path, "sim")
        self.assertEqual(st.layout.page_size, 64)
        self.assertEqual(len(st.shards), 1)

    def test_get_fleet(self) -> None:
        p = self.registered()[0]
        f = self.client.admin.get_fleet()
        self.assertEqual(f.registry.backend, "memory")
        self.assertEqual([(d.address, d.self, d.incarnation) for d in f.daemons],
                         [(self.daemon.addr, True, self.daemon.incarnation)])
        self.assertIn(p.rank.bootstrap_addr, [x.bootstrap_addr for x in f.prefills])

    def test_watch_capacity(self) -> None:
        with self.client.admin.watch_capacity(min_interval=0.05, keepalive=1, timeout=WAIT) as s:
            first = s.next()
            self.assertIsNotNone(first)
            assert first is not None
            self.assertEqual(first.incarnation, self.daemon.incarnation)
            self.assertTrue(first.ready)
            self.assertEqual(first.shards[0].page_size, 64)
            self.assertEqual(first.shards[0].pages_total, 16384)
            # An open room changes the figures: an update follows.
            addr = prefill_addr()
            self.client.engine.open_room(**open_fields(room_id(), addr, prompt_len=64 * 10))
            nxt = s.next()
            assert nxt is not None
            self.assertGreater(nxt.sequence, first.sequence)

    def test_watch_capacity_invalid_interval(self) -> None:
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.admin.watch_capacity(min_interval=0.001, timeout=WAIT).next()
        self.assertEqual(cm.exception.field, "min_interval")


class BootstrapTest(DaemonCase):
    def test_register_tp2(self) -> None:
        addr = prefill_addr()
        p0 = self.client.prefill(registration(addr, 2, 0))
        r0 = p0.register()
        self.assertEqual((r0.registered_ranks, r0.expected_ranks), (1, 2))
        self.assertEqual(r0.incarnation, self.daemon.incarnation)
        self.assertEqual(p0.incarnation, self.daemon.incarnation)
        self.assertEqual(r0.decode_layout.kind, "gqa")
        r1 = self.client.prefill(registration(addr, 2, 1)).register()
        self.assertEqual((r1.registered_ranks, r1.expected_ranks), (2, 2))
        self.assertEqual(list(r1.mapping.serves_decode_tp_ranks), [0])
        self.assertGreater(r1.heartbeat_interval.seconds, 0)

    def test_register_errors(self) -> None:
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.prefill(registration(prefill_addr(), 2, 5)).register()
        self.assertEqual(cm.exception.field, "parallel.attn_tp_rank")
        with self.assertRaises(decodeplane.FailedPreconditionError) as fp:
            self.client.prefill(registration(prefill_addr(), page_size=32)).register()
        self.assertIn("Page size mismatch", fp.exception.message)

    def test_heartbeat(self) -> None:
        p = self.registered()[0]
        hb = p.heartbeat()
        self.assertEqual(hb.incarnation, self.daemon.incarnation)
        self.assertEqual(hb.interval.seconds, 600)
        with self.assertRaises(decodeplane.NotFoundError):
            self.client.prefill(registration(prefill_addr())).heartbeat()

    def test_deregister(self) -> None:
        p = self.registered()[0]
        addr = p.rank.bootstrap_addr
        room = room_id()
        self.client.engine.open_room(**open_fields(room, addr))
        poll("room admitted", lambda: self.client.admin.get_room(room).phase == common_pb2.ROOM_PHASE_ADMITTED or None)
        resp = p.deregister("scaled down")
        self.assertTrue(resp.deregistered)
        self.assertEqual(resp.rooms_failed, 1)
        r = self.client.admin.get_room(room)
        self.assertEqual(r.phase, common_pb2.ROOM_PHASE_FAILED)
        self.assertEqual(r.failure.code, common_pb2.FAILURE_CODE_PREFILL_LOST)
        self.assertIn("it deregistered (Bootstrap.DeregisterPrefill through ", r.failure.message)
        self.assertTrue(r.failure.message.endswith("): scaled down"), r.failure.message)
        self.assertNotIn(addr, [x.bootstrap_addr for x in self.client.admin.status().prefills])
        self.assertFalse(p.deregister().deregistered)  # idempotent
        with self.assertRaises(decodeplane.CanceledError):
            p.register()

    def test_bind_and_lookup(self) -> None:
        addr = prefill_addr()
        ps = [self.client.prefill(registration(addr, parallel=dict(attn_dp_size=2, attn_dp_rank=d),
                                               load_balance_method="round_robin")) for d in (0, 1)]
        for p in ps:
            p.register()
        room, other = room_id(), room_id()
        self.assertFalse(ps[1].bind_room(room))
        self.assertTrue(ps[0].bind_room(room))  # rebound to dp 0
        res = self.client.engine.lookup_dp_ranks(addr, [room, other, other + 1], {other + 1: 1})
        got = {(r.room, r.dp_rank, r.rule) for r in res.resolved}
        self.assertEqual(got, {(room, 0, common_pb2.DP_RANK_RULE_BINDING), (other + 1, 1, common_pb2.DP_RANK_RULE_HINT)})
        self.assertEqual(list(res.unresolved), [other])
        with self.assertRaises(decodeplane.NotFoundError):
            self.client.engine.lookup_dp_ranks(prefill_addr(), [room])

    def test_bind_follow_bootstrap_room_conflict(self) -> None:
        addr = prefill_addr()
        p = self.client.prefill(registration(addr, parallel=dict(attn_dp_size=2, attn_dp_rank=1)))
        p.register()
        with self.assertRaises(decodeplane.FailedPreconditionError) as cm:
            p.bind_room(4)  # 4 % 2 == 0, not dp 1
        self.assertIn("follow_bootstrap_room conflict", cm.exception.message)


class RoomsTest(DaemonCase):
    def test_open_room(self) -> None:
        addr = prefill_addr()
        self.registered(client=None)  # another instance: not this room's
        room = room_id()
        resp = self.client.engine.open_room(**open_fields(room, addr, idempotency_key="k1"))
        self.assertEqual(resp.room.room, room)
        self.assertEqual(resp.room.rid, f"r-{room}")
        self.assertFalse(resp.existing)
        self.assertEqual(resp.room.phase, common_pb2.ROOM_PHASE_WAITING_PREFILL)
        again = self.client.engine.open_room(**open_fields(room, addr, idempotency_key="k1"))
        self.assertTrue(again.existing)
        with self.assertRaises(decodeplane.AlreadyExistsError):
            self.client.engine.open_room(**open_fields(room, addr))
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.open_room(**open_fields(room_id(), addr, prompt_len=0))
        self.assertEqual(cm.exception.fields, ["prompt_len"])
        with self.assertRaises(decodeplane.InvalidArgumentError) as big:
            self.client.engine.open_room(**open_fields(room_id(), addr, prompt_len=2_000_000, max_new_tokens=1))
        self.assertIn("exceeds the maximum number of tokens", big.exception.message)

    def test_get_list_abort(self) -> None:
        addr = prefill_addr()
        room = room_id()
        self.client.engine.open_room(**open_fields(room, addr))
        r = self.client.engine.get_room(room, include_pages=True)
        self.assertEqual((r.room, r.bootstrap_addr, r.prompt_len), (room, addr, 100))
        listed = self.client.admin.list_rooms(bootstrap_addr=addr, live_only=True)
        self.assertEqual([x.room for x in listed.rooms], [room])
        self.assertEqual(listed.total, 1)
        ab = self.client.engine.abort_room(room, "test abort")
        self.assertFalse(ab.already_terminal)
        self.assertEqual(ab.room.phase, common_pb2.ROOM_PHASE_FAILED)
        self.assertEqual(ab.room.failure.code, common_pb2.FAILURE_CODE_ABORTED)
        self.assertEqual(ab.room.failure.message, "test abort")
        self.assertTrue(self.client.engine.abort_room(room).already_terminal)
        failed = self.client.admin.list_rooms(bootstrap_addr=addr, phases=[common_pb2.ROOM_PHASE_FAILED])
        self.assertEqual([x.room for x in failed.rooms], [room])
        for call in (lambda: self.client.engine.get_room(room_id()), lambda: self.client.engine.abort_room(room_id()),
                     lambda: self.client.engine.release_room(room_id())):
            with self.assertRaises(decodeplane.NotFoundError):
                call()
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.admin.list_rooms(limit=200_000)
        self.assertEqual(cm.exception.field, "limit")

    def test_release_before_success(self) -> None:
        room = room_id()
        self.client.engine.open_room(**open_fields(room, prefill_addr()))
        with self.assertRaises(decodeplane.FailedPreconditionError) as cm:
            self.client.engine.release_room(room)
        self.assertIn("has not succeeded", cm.exception.message)
        with self.assertRaises(decodeplane.FailedPreconditionError):
            self.client.engine.retract_room(room)

    def test_watch_room(self) -> None:
        p = self.registered()[0]
        room = room_id()
        self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr))
        with self.client.engine.watch_room(room, history=True, timeout=WAIT) as w:
            first = w.next()
            assert first is not None
            self.assertEqual(first.incarnation, self.daemon.incarnation)
            send = Background(lambda: p.send_room(room, timeout=WAIT))
            phases = [first.transition.phase]
            while phases[-1] != common_pb2.ROOM_PHASE_SUCCEEDED:
                ev = w.next()
                assert ev is not None
                phases.append(ev.transition.phase)
            send.outcome()
            self.assertEqual(phases[0], common_pb2.ROOM_PHASE_WAITING_PREFILL)
            self.assertIn(common_pb2.ROOM_PHASE_CLAIMED, phases)
            self.client.engine.release_room(room)
            last = w.next()
            assert last is not None
            self.assertTrue(last.terminal)
            self.assertEqual(last.transition.phase, common_pb2.ROOM_PHASE_RELEASED)
            self.assertIsNone(w.next())
        with self.assertRaises(decodeplane.NotFoundError):
            self.client.engine.watch_room(room_id()).next()

    def test_running_retract_continue(self) -> None:
        p = self.registered()[0]
        rooms = [room_id(), room_id()]
        sends = [Background(lambda r=r: p.send_room(r, timeout=WAIT)) for r in rooms]
        for r in rooms:
            got = self.client.engine.open_and_wait(**open_fields(r, p.rank.bootstrap_addr, prompt_len=64), timeout=WAIT)
            self.assertEqual(got.num_pages, 1)
        for s in sends:
            s.outcome()
        # Growing past the first page grants more: 64 + 100 tokens are 3 pages, 64 + 1 are 2.
        rr = self.client.engine.report_running({rooms[0]: 100, rooms[1]: 1})
        self.assertEqual([(g.room, len(g.new_page_indices)) for g in rr.grown], [(rooms[0], 2), (rooms[1], 1)])
        self.assertEqual(list(rr.no_capacity), [])
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.report_running({0: 5})
        self.assertEqual(cm.exception.field, "rooms[0].room")
        ret = self.client.engine.retract_room(rooms[0], rooms_pb2.RETRACT_MODE_RETRACT)
        self.assertEqual(ret.room.phase, common_pb2.ROOM_PHASE_RETRACTED)
        held = self.client.engine.retract_room(rooms[1], rooms_pb2.RETRACT_MODE_REBOOTSTRAP)
        self.assertEqual(held.room.phase, common_pb2.ROOM_PHASE_HELD)
        cont = self.client.engine.continue_generation()
        self.assertEqual(list(cont.rooms), [rooms[1]])
        self.assertEqual([(x.room, x.attempt, x.prefill_bootstrap_addr) for x in cont.resumed],
                         [(rooms[1], 2, p.rank.bootstrap_addr)])
        # The rebootstrapped room's second attempt is handed off again.
        self.assertIsNotNone(p.send_room(rooms[1], timeout=WAIT))
        self.assertEqual(self.client.engine.wait_room(rooms[1], common_pb2.ROOM_PHASE_SUCCEEDED, timeout=WAIT).attempt, 2)
        for r in rooms:
            self.client.engine.abort_room(r)

    def test_resync_refused_once_admitting(self) -> None:
        with self.assertRaises(decodeplane.FailedPreconditionError) as cm:
            self.client.engine.resync([])
        self.assertIn("admission already started", cm.exception.message)


class PrefillRpcTest(DaemonCase):
    def test_transfer_report_ack(self) -> None:
        p = self.registered()[0]
        room = room_id()
        self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr, prompt_len=130))
        with p.await_destination(room, timeout=WAIT) as claim:
            ev = claim.next()
            assert ev is not None and ev.destination is not None
            d = ev.destination
            self.assertEqual((d.room, len(d.page_indices), d.fill_len, d.attempt), (room, 3, 130, 1))
            self.assertEqual(d.incarnation, self.daemon.incarnation)
            inc = d.incarnation
            with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
                p.transfer(room=room, chunk_index=0, page_offset=3, num_pages=1, attempt=1, incarnation=inc)
            self.assertEqual(cm.exception.field, "page_offset")
            with self.assertRaises(decodeplane.StaleIncarnationError) as st:
                p.transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, attempt=1, incarnation=inc + 1)
            self.assertEqual((st.exception.old, st.exception.new), (inc + 1, inc))
            t = p.transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, attempt=1, incarnation=inc)
            self.assertEqual(t.bytes, 64 * d.token_bytes)
            self.assertFalse(t.duplicate)
            self.assertTrue(p.transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, attempt=1,
                                       incarnation=inc).duplicate)
            with self.assertRaises(decodeplane.InvalidArgumentError) as bad_bytes:
                p.report_transfer(room=room, chunk_index=1, page_offset=1, num_pages=1, success=True, bytes=1,
                                  attempt=1, incarnation=inc)
            self.assertEqual(bad_bytes.exception.field, "bytes")
            r = p.report_transfer(room=room, chunk_index=1, page_offset=1, num_pages=2, last=True, success=True,
                                  bytes=(130 - 64) * d.token_bytes, metadata_room_marker=room, attempt=1,
                                  incarnation=inc)
            self.assertEqual(r.poll, common_pb2.KV_POLL_SUCCESS)
            end = claim.next()
            assert end is not None and end.done is not None
            self.assertEqual(end.done.phase, common_pb2.ROOM_PHASE_SUCCEEDED)
            self.assertIsNone(claim.next())
        ack = p.ack_room_end(room, d)
        self.assertFalse(ack.owed)
        with self.assertRaises(decodeplane.StaleAttemptError) as sa:
            p.ack_room_end(room, rooms_pb2.Destination(attempt=2, incarnation=inc))
        self.assertEqual(sa.exception.reason, "STALE_ATTEMPT")
        with self.assertRaises(decodeplane.NotFoundError):
            p.ack_room_end(room_id(), d)
        rel = self.client.engine.release_room(room)
        self.assertEqual(rel.pages_released, 3)

    def test_claim_errors(self) -> None:
        p = self.registered()[0]
        other_rank = self.client.prefill(registration(p.rank.bootstrap_addr, 2, 1))
        with self.assertRaises(decodeplane.NotFoundError):
            other_rank.await_destination(room_id(), timeout=WAIT).next()
        with self.assertRaises(decodeplane.IncarnationChangedError) as cm:
            p.await_destination(room_id(), incarnation=self.daemon.incarnation ^ 1, timeout=WAIT).next()
        self.assertEqual((cm.exception.old, cm.exception.new), (self.daemon.incarnation ^ 1, self.daemon.incarnation))

    def test_staging_not_configured(self) -> None:
        p = self.registered()[0]
        for call in (p.setup_staging, lambda: p.allocate_staging(room_id(), 0, 1),
                     lambda: p.chunk_ready(room=room_id(), chunk_index=0, page_offset=0, num_pages=1),
                     lambda: p.watch_watermark(0, timeout=WAIT).next()):
            with self.assertRaises(decodeplane.FailedPreconditionError) as cm:
                call()
            self.assertIn("staging", cm.exception.message)


class StagingTest(DaemonCase):
    """The staged path: prefill TP 2 into decode TP 1 with the staging ring."""

    SETS = ("staging.enabled=true", "staging.pool_size_mb=64")

    def test_staged_room(self) -> None:
        ps = self.registered(tp_size=2)
        plan = ps[0].setup_staging()
        self.assertTrue(plan.staging_required)
        self.assertEqual((plan.prefill_attn_tp_size, plan.decode_attn_tp_size), (2, 1))
        self.assertEqual([(t.decode_tp_rank, t.num_writers, t.writer.writer_index) for t in plan.targets], [(0, 2, 0)])
        self.assertEqual(ps[1].setup_staging().targets[0].writer.writer_index, 1)
        with ps[0].watch_watermark(0, timeout=WAIT) as wm:
            w0 = wm.next()
            assert w0 is not None
            self.assertEqual(w0.size_bytes, 64 << 20)
            room = room_id()
            self.client.engine.open_room(**open_fields(room, ps[0].rank.bootstrap_addr, prompt_len=100))
            claims = [p.await_destination(room, timeout=WAIT) for p in ps]
            dests = []
            for c in claims:
                ev = c.next()
                assert ev is not None and ev.destination is not None
                self.assertTrue(ev.destination.staging)
                dests.append(ev.destination)
            allocs = [p.allocate_staging(room, 0, 2) for p in ps]
            self.assertEqual(len({a.regions[0].alloc_id for a in allocs}), 1)  # one region, shared
            self.assertTrue(allocs[1].regions[0].existing)
            self.assertTrue(all(a.regions[0].writable for a in allocs))
            with self.assertRaises(decodeplane.InvalidArgumentError):
                ps[0].allocate_staging(room, 0, 1)
            first = ps[0].chunk_ready(room=room, chunk_index=0, page_offset=0, num_pages=2, last=True,
                                      aux=rooms_pb2.Aux(room_marker=room), incarnation=dests[0].incarnation)
            self.assertEqual((first.writers_arrived, first.num_writers, first.scattered), (1, 2, False))
            second = ps[1].chunk_ready(room=room, chunk_index=0, page_offset=0, num_pages=2, last=True,
                                       aux=rooms_pb2.Aux(room_marker=room), incarnation=dests[1].incarnation)
            self.assertTrue(second.scattered)
            for c in claims:
                end = c.next()
                assert end is not None and end.done is not None
                c.close()
            # The scatter freed the region: the watermark moves past it.
            while True:
                moved = wm.next()
                assert moved is not None
                if moved.live_allocations == 0 and (moved.round, moved.tail) != (w0.round, w0.tail):
                    break
            self.assertEqual((moved.head_round, moved.head), (moved.round, moved.tail))
        self.assertEqual(self.client.engine.get_room(room).phase, common_pb2.ROOM_PHASE_SUCCEEDED)




class AdmissionTest(DaemonCase):
    """A full admission queue is RESOURCE_EXHAUSTED with the daemon's
    RetryInfo; a keyed OpenRoom is retried after that delay."""

    SETS = ("admission.max_queued=1",)

    def test_queue_full_then_retried(self) -> None:
        from tests.test_restart import RetryLog

        addr = prefill_addr()  # never registered: a room waits in the queue
        waiting = room_id()
        self.client.engine.open_room(**open_fields(waiting, addr))
        no_retry = self.new_client(retry=decodeplane.RetryPolicy(max_attempts=1))
        with self.assertRaises(decodeplane.ResourceExhaustedError) as cm:
            no_retry.engine.open_room(**open_fields(room_id(), addr))
        self.assertEqual(cm.exception.retry_after, 1.0)
        self.assertIn("admission queue is full", cm.exception.message)
        with no_retry.engine.session(timeout=WAIT) as s:
            res = s.open([rooms_pb2.OpenRoomRequest(**open_fields(room_id(), addr))], timeout=WAIT)
            self.assertIsInstance(res[0].error, decodeplane.ResourceExhaustedError)
            self.assertEqual(res[0].error.retry_after, 1.0)  # type: ignore[union-attr]
        # Keyed: retried after the daemon's delay, by then the queue has room.
        for transport in decodeplane.Transport:
            c = self.new_client(transport=transport)
            log = RetryLog()
            freed = Background(lambda: log.first.wait(WAIT) and self.client.engine.abort_room(waiting))
            room = room_id()
            with log:
                if transport is decodeplane.Transport.UNARY:
                    got = c.engine.open_room(**open_fields(room, addr, idempotency_key=f"k{room}")).room
                else:
                    opened = Background(lambda: c.engine.open_and_wait(**open_fields(room, addr, idempotency_key=f"k{room}"),
                                                                       timeout=WAIT))
                    got = poll("the retried open", lambda: _exists(self.client, room) and self.client.engine.get_room(room))
            freed.outcome()
            self.assertEqual(got.room, room)
            self.assertTrue(any("retrying in 1.000s" in m for m in log.retries), log.retries)
            waiting = room  # the next round waits behind this one
            if transport is decodeplane.Transport.STREAMS:
                self.client.engine.abort_room(room)
                self.assertIsInstance(opened.failure(), decodeplane.RoomFailedError)
                waiting = room_id()
                self.client.engine.open_room(**open_fields(waiting, addr))


def _exists(c: decodeplane.Client, room: int) -> bool:
    try:
        c.engine.get_room(room)
        return True
    except decodeplane.NotFoundError:
        return False


class SessionLivenessTest(DaemonCase):
    """An idle prefill session pings, and the daemon counts the pings as
    the rank's heartbeats (2 s interval, one missed interval kills)."""

    SETS = ("timeouts.heartbeat_interval=2s", "timeouts.heartbeat_max_failures=1")

    def test_pings_are_heartbeats(self) -> None:
        p = self.registered()[0]
        registered = self.client.admin.status().prefills[0].last_heartbeat.ToNanoseconds()
        with p.session(timeout=WAIT) as s:
            self.assertEqual(s.welcome.heartbeat_interval.seconds, 2)
            poll("a heartbeat from the idle session's pings", lambda: self.client.admin.status().prefills[0]
                 .last_heartbeat.ToNanoseconds() > registered + 1_500_000_000, timeout=10)
            self.assertFalse(s.done)
            # Still alive past heartbeat_max_failures x interval (2 s) without an op.
            self.assertFalse(s.wait(3))
            self.assertEqual(p.heartbeat().incarnation, self.daemon.incarnation)
