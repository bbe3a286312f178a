"""The engine as the page owner (kv_pool.owner: engine) against the real
daemon: DeclareDestination (unary, the shared session, an EngineSession of
the caller's), ReportCapacity (unary and on the session), the typed
PAGE_HELD refusal, a room's last event (pages_reusable) ending the watch
and the session's subscription only once a failed room drained, and the
engine's resync of the hand-offs in flight after a kill -9."""

from __future__ import annotations

import unittest

import decodeplane
from decodeplane.v1 import capacity_pb2, common_pb2, rooms_pb2
from tests.base import PATIENT, WAIT, DaemonCase, Background, open_fields, poll, prefill_addr, registration, room_id
from tests.daemon import OWNER_SETS, Daemon

PAGE = 16
QUEUED = common_pb2.ROOM_PHASE_QUEUED
ADMITTED = common_pb2.ROOM_PHASE_ADMITTED
FAILED = common_pb2.ROOM_PHASE_FAILED
SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED


def owner_registration(addr: str, tp_size: int = 1, tp_rank: int = 0) -> "decodeplane.v1.bootstrap_pb2.RegisterPrefillRequest":
    return registration(addr, tp_size, tp_rank, page_size=PAGE)


def declaration(room: int, first: int, n: int, slot: int) -> rooms_pb2.DeclareDestinationRequest:
    return rooms_pb2.DeclareDestinationRequest(room=room, page_indices=list(range(first, first + n)), metadata_slot=slot)


class OwnerCase(DaemonCase):
    SETS = OWNER_SETS

    def queued_room(self, p: decodeplane.Prefill, prompt_len: int = 4 * PAGE) -> int:
        """A room opened for p's instance, waiting for its declaration."""
        room = room_id()
        self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr, prompt_len=prompt_len))
        poll("the room waits for its declaration", lambda: self.client.engine.get_room(room).phase == QUEUED)
        return room


class DeclareTest(OwnerCase):
    def test_declare_unary_and_on_sessions(self) -> None:
        p = self.registered(page_size=PAGE)[0]
        # Unary (no shared session is up).
        room = self.queued_room(p)
        resp = self.client.engine.declare_destination(declaration(room, 0, 4, 0))
        self.assertFalse(resp.already)
        self.assertEqual(resp.room.phase, ADMITTED)
        self.assertTrue(self.client.engine.declare_destination(declaration(room, 0, 4, 0)).already)
        send = Background(lambda: p.report_room(room, timeout=WAIT))
        self.assertEqual(self.client.engine.wait_room(room, SUCCEEDED, timeout=WAIT).phase, SUCCEEDED)
        self.assertEqual(list(send.outcome().page_indices), [0, 1, 2, 3])
        self.client.engine.release_room(room)
        # On an EngineSession of the caller's: the declare op.
        with self.client.engine.session() as s:
            room = room_id()
            sub = s.subscribe(room)
            [opened] = s.open([rooms_pb2.OpenRoomRequest(**open_fields(room, p.rank.bootstrap_addr, prompt_len=2 * PAGE))])
            self.assertIsNone(opened.error)
            poll("queued", lambda: self.client.engine.get_room(room).phase == QUEUED)
            got = s.declare(declaration(room, 8, 2, 1))
            self.assertEqual(got.room.phase, ADMITTED)
            send = Background(lambda: p.report_room(room, timeout=WAIT))
            phases = []
            while (ev := sub.next(WAIT)) is not None and ev.event.transition.phase != SUCCEEDED:
                phases.append(ev.event.transition.phase)
            self.assertIn(ADMITTED, phases)
            send.outcome()
            s.release(room)
        # On open_and_wait's shared session, when it is up.
        room = room_id()
        waited = Background(lambda: self.client.engine.open_and_wait(
            **open_fields(room, p.rank.bootstrap_addr, prompt_len=PAGE), timeout=WAIT))
        poll("the shared session", lambda: self.client.engine._mux.live() is not None
             and self.client.engine.get_room(room).phase == QUEUED)
        self.assertEqual(self.client.engine.declare_destination(room=room, page_indices=[20], metadata_slot=2).room.phase,
                         ADMITTED)
        p.report_room(room, timeout=WAIT)
        self.assertEqual(waited.outcome().phase, SUCCEEDED)
        self.client.engine.release_room(room)

    def test_declaration_errors(self) -> None:
        p = self.registered(page_size=PAGE)[0]
        room = self.queued_room(p)
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.declare_destination(declaration(room, 0, 3, 0))
        self.assertEqual(cm.exception.field, "page_indices")
        with self.assertRaises(decodeplane.NotFoundError):
            self.client.engine.declare_destination(declaration(room_id(), 0, 4, 0))
        self.client.engine.abort_room(room)

    def test_page_held(self) -> None:
        p = self.registered(page_size=PAGE)[0]
        holder, other = self.queued_room(p), self.queued_room(p)
        self.client.engine.declare_destination(declaration(holder, 30, 4, 5))
        # Unary: the typed refusal, naming the page and the holder.
        with self.assertRaises(decodeplane.PageHeldError) as cm:
            self.client.engine.declare_destination(declaration(other, 32, 4, 6))
        e = cm.exception
        self.assertEqual((e.reason, e.what, e.index, e.holder, e.draining), ("PAGE_HELD", "page", 32, holder, False))
        self.assertIsInstance(e, decodeplane.FailedPreconditionError)
        self.assertIn(f"still held by room {holder}", e.message)
        # On an EngineSession: the same refusal, without the ErrorInfo.
        with self.client.engine.session() as s:
            with self.assertRaises(decodeplane.FailedPreconditionError) as cs:
                s.declare(declaration(other, 40, 4, 5))
            self.assertNotIsInstance(cs.exception, decodeplane.PageHeldError)
            self.assertIn("metadata slot 5 is still held", cs.exception.message)
        # Through the shared session: typed again (the unary RPC is asked).
        waited = Background(lambda: self.client.engine.open_and_wait(
            **open_fields(room_id(), prefill_addr(), prompt_len=PAGE), timeout=WAIT))
        poll("the shared session", lambda: self.client.engine._mux.live() is not None)
        with self.assertRaises(decodeplane.PageHeldError) as cm:
            self.client.engine.declare_destination(declaration(other, 33, 4, 6))
        self.assertEqual((cm.exception.index, cm.exception.holder), (33, holder))
        self.assertEqual(self.client.engine.get_room(other).phase, QUEUED)
        for r in (holder, other):
            self.client.engine.abort_room(r)
        self.client.close()
        self.assertIsInstance(waited.failure(), decodeplane.DecodeplaneError)


class CapacityTest(OwnerCase):
    def test_report_capacity(self) -> None:
        with self.client.admin.watch_capacity(min_interval=0.05, keepalive=1, timeout=WAIT) as w:
            first = w.next()
            assert first is not None
            self.assertEqual(first.shards[0].blocked_by, "engine_unreported")
            self.client.engine.report_capacity(tokens_free=640, pages_free=40, req_slots_free=7, metadata_slots_free=9,
                                               queue_depth=2, running=3)
            got = poll("the unary report", lambda: (u := w.next()) is not None and u.shards[0].tokens_free == 640 and u)
            sh = got.shards[0]
            self.assertEqual((sh.pages_free, sh.req_slots_free, sh.running), (40, 7, 3))
            self.assertGreaterEqual(sh.queue_depth, 2)
            with self.client.engine.session() as s:
                s.capacity(capacity_pb2.ReportCapacityRequest(tokens_free=320, pages_free=20, running=1))
            poll("the session's report", lambda: (u := w.next()) is not None and u.shards[0].tokens_free == 320)
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            self.client.engine.report_capacity(decode_dp_rank=5)
        self.assertIn("decode_dp_rank", cm.exception.message)

    def test_daemon_owner_refuses(self) -> None:
        d = Daemon().start()
        self.addCleanup(d.stop)
        c = self.new_client(target=d.addr)
        with self.assertRaises(decodeplane.FailedPreconditionError):
            c.engine.report_capacity(tokens_free=1)
        addr = prefill_addr()
        room = room_id()
        c.engine.open_room(**open_fields(room, addr))
        with self.assertRaises(decodeplane.FailedPreconditionError) as cm:
            c.engine.declare_destination(declaration(room, 0, 2, 0))
        self.assertNotIsInstance(cm.exception, decodeplane.PageHeldError)


class PagesReusableTest(OwnerCase):
    SETS = OWNER_SETS + ("release.deferred_timeout=30s",)

    def test_failed_room_ends_at_pages_reusable(self) -> None:
        """A room aborted while its prefill rank may still write: the watch,
        the session and a declaration of its pages all wait for the rank's
        acknowledgement."""
        p = self.registered(page_size=PAGE)[0]
        room = self.queued_room(p, prompt_len=2 * PAGE)
        self.client.engine.declare_destination(declaration(room, 50, 2, 10))
        claim = p.await_destination(room, timeout=WAIT)
        ev = claim.next()
        assert ev is not None and ev.destination is not None
        dest = ev.destination
        # The rank moved (and reported) its first page itself: it may write on.
        p.report_transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, success=True,
                          bytes=decodeplane.Chunk(dest, 0, 0, 1, False).bytes(), attempt=dest.attempt,
                          incarnation=dest.incarnation)
        watch = self.client.engine.watch_room(room, timeout=WAIT)
        with self.client.engine.session() as s:
            sub = s.subscribe(room)
            s.resume({room: 0})
            self.client.engine.abort_room(room, "gone")
            term = poll("the terminal event", lambda: (e := watch.next()) is not None and e.terminal and e)
            self.assertEqual(term.transition.phase, FAILED)
            self.assertFalse(term.pages_reusable)
            # Its pages are held, draining: a declaration naming one is refused.
            other = self.queued_room(p, prompt_len=PAGE)
            with self.assertRaises(decodeplane.PageHeldError) as cm:
                self.client.engine.declare_destination(declaration(other, 51, 1, 11))
            self.assertEqual((cm.exception.holder, cm.exception.draining), (room, True))
            with self.assertRaises(decodeplane.RoomFailedError) as failed:
                claim.next()
            self.assertTrue(failed.exception.ack_required)
            p.ack_room_end(room, dest)
            last = watch.next()
            assert last is not None
            self.assertTrue(last.pages_reusable)
            self.assertEqual(last.transition.phase, FAILED)
            self.assertIsNone(watch.next())
            seen = []
            while (e := sub.next(WAIT)) is not None:
                seen.append(e.event)
            self.assertTrue(seen[-1].pages_reusable)
            self.assertEqual(sum(1 for e in seen if e.terminal), 1)
        self.assertEqual(self.client.engine.declare_destination(declaration(other, 51, 1, 10)).room.phase, ADMITTED)
        self.client.engine.abort_room(other)


class ResyncInFlightTest(unittest.TestCase):
    def test_kill_and_resync_in_flight(self) -> None:
        d = Daemon(*OWNER_SETS, "engine.resync_timeout=20s", "release.deferred_timeout=30s").start()
        self.addCleanup(d.stop)
        c = decodeplane.Client(d.addr, timeout=WAIT, retry=PATIENT)
        self.addCleanup(c.close)
        p = c.prefill(owner_registration(prefill_addr()))
        self.addCleanup(p.close)
        p.register()
        c.engine.resync([])  # done: the first daemon admits at once
        room = room_id()
        c.engine.open_room(**open_fields(room, p.rank.bootstrap_addr, prompt_len=2 * PAGE))
        poll("queued", lambda: c.engine.get_room(room).phase == QUEUED)
        decl = declaration(room, 4, 2, 3)
        c.engine.declare_destination(decl)
        claim = p.await_destination(room, timeout=WAIT)
        ev = claim.next()
        assert ev is not None and ev.destination is not None
        dest = ev.destination
        old = d.incarnation
        d.kill()
        d.start()
        self.assertNotEqual(d.incarnation, old)
        # The rank's destination is void: a report naming it is refused.
        p.register()
        with self.assertRaises(decodeplane.StaleIncarnationError):
            p.report_transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, success=True,
                              bytes=decodeplane.Chunk(dest, 0, 0, 1, False).bytes(), attempt=dest.attempt,
                              incarnation=dest.incarnation)
        resp = c.engine.resync([decodeplane.in_flight(decl, rid=f"r-{room}", prompt_len=2 * PAGE, max_new_tokens=16,
                                                      bootstrap_addr=p.rank.bootstrap_addr, prefill_dp_rank=0)])
        self.assertEqual((resp.adopted, resp.admitting), (1, True))
        r = c.engine.get_room(room)
        self.assertEqual((r.phase, r.failure.code), (FAILED, common_pb2.FAILURE_CODE_SHUTDOWN))
        watch = c.engine.watch_room(room, history=True, timeout=WAIT)
        other = room_id()
        c.engine.open_room(**open_fields(other, p.rank.bootstrap_addr, prompt_len=PAGE))
        poll("queued", lambda: c.engine.get_room(other).phase == QUEUED)
        with self.assertRaises(decodeplane.PageHeldError) as cm:
            c.engine.declare_destination(declaration(other, 5, 1, 9))
        self.assertTrue(cm.exception.draining)
        # The rank stopped writing: it acknowledges to the new daemon (incarnation 0).
        p.ack_room_end(room, rooms_pb2.Destination(attempt=dest.attempt))
        events = list(watch)
        self.assertTrue(events[-1].pages_reusable)
        self.assertEqual(c.engine.declare_destination(declaration(other, 5, 1, 9)).room.phase, ADMITTED)
        c.engine.abort_room(other)
