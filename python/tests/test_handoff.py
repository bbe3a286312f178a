"""Whole room hand-offs against the real daemon: over the unary API and
over both sessions, with TP 1 and TP 2 prefill layouts, aborts, failures
and acknowledgements, and resumes after the network dropped the streams."""

from __future__ import annotations

import threading

import decodeplane
from decodeplane.v1 import common_pb2
from tests.base import WAIT, Background, DaemonCase, Proxy, open_fields, poll, room_id

SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED


class HandOffTest(DaemonCase):
    def hand_off(self, client: decodeplane.Client, tp_size: int, chunk_pages: int) -> None:
        ps = self.registered(tp_size=tp_size, client=client)
        addr = ps[0].rank.bootstrap_addr
        room = room_id()
        sends = [Background(lambda p=p: p.send_room(room, chunk_pages=chunk_pages, output_ids=[42], timeout=WAIT))
                 for p in ps]
        got = client.engine.open_and_wait(**open_fields(room, addr, prompt_len=300), timeout=WAIT)
        self.assertEqual((got.room, got.phase, got.num_pages), (room, SUCCEEDED, 5))
        dests = [s.outcome() for s in sends]
        self.assertEqual([len(d.page_indices) for d in dests], [5] * tp_size)
        self.assertEqual([d.incarnation for d in dests], [self.daemon.incarnation] * tp_size)
        r = client.engine.get_room(room)
        self.assertEqual(len(r.coverage), tp_size)
        self.assertTrue(all(c.pages_landed == 5 and c.last_landed for c in r.coverage))
        self.assertEqual(r.chunks_done, tp_size * (-(-5 // chunk_pages) if chunk_pages else 1))
        rel = client.engine.release_room(room)
        self.assertEqual((rel.pages_released, rel.already_released), (5, False))
        self.assertTrue(client.engine.release_room(room).already_released)

    def test_unary_tp1(self) -> None:
        self.hand_off(self.new_client(transport=decodeplane.Transport.UNARY), 1, 2)

    def test_unary_tp2(self) -> None:
        self.hand_off(self.new_client(transport=decodeplane.Transport.UNARY), 2, 1)

    def test_streams_tp1(self) -> None:
        self.hand_off(self.client, 1, 0)
        s = self.client.engine._mux.live()
        self.assertIsNotNone(s, "open_and_wait did not use the shared engine session")
        assert s is not None
        self.assertEqual(s._outbox._max, 65, "packing was not negotiated")

    def test_streams_tp2(self) -> None:
        self.hand_off(self.client, 2, 2)
        self.assertIsNotNone(self.client.engine._mux.live())

    def test_report_room(self) -> None:
        for transport in decodeplane.Transport:
            c = self.new_client(transport=transport)
            p = self.registered(client=c)[0]
            room = room_id()
            moved: list[tuple[int, int]] = []

            def move(ch: decodeplane.Chunk, stop: threading.Event) -> int:
                moved.append((ch.index, ch.num_pages))
                return ch.bytes()

            send = Background(lambda: p.report_room(room, move=move, chunk_pages=2, timeout=WAIT))
            got = c.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr, prompt_len=200), timeout=WAIT)
            self.assertEqual(got.phase, SUCCEEDED)
            d = send.outcome()
            self.assertEqual(moved, [(0, 2), (1, 2)], transport)
            self.assertEqual(c.engine.get_room(room).bytes_transferred, 200 * d.token_bytes)
            c.engine.release_room(room)

    def test_move_failure_fails_the_room(self) -> None:
        p = self.registered()[0]
        room = room_id()

        def move(ch: decodeplane.Chunk, stop: threading.Event) -> int:
            raise OSError("rdma write failed")

        send = Background(lambda: p.report_room(room, move=move, timeout=WAIT))
        with self.assertRaises(decodeplane.RoomFailedError) as opened:
            self.client.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
        self.assertEqual(opened.exception.failure_code, common_pb2.FAILURE_CODE_TRANSFER_FAILED)
        err = send.failure()
        self.assertIsInstance(err, decodeplane.RoomFailedError)
        assert isinstance(err, decodeplane.RoomFailedError)
        self.assertIsInstance(err.cause, OSError)
        self.assertIn("rdma write failed", err.message)

    def test_abort_while_waiting(self) -> None:
        for transport in decodeplane.Transport:
            c = self.new_client(transport=transport)
            # TP 2, only rank 0 sends: the room waits for rank 1's KV.
            p = self.registered(tp_size=2, client=c)[0]
            room = room_id()
            opened = Background(lambda: c.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT))
            claim = Background(lambda: p.send_room(room, timeout=WAIT))
            poll("rank 0's KV landed", lambda: _exists(c, room) and any(
                cov.tp_rank == 0 and cov.last_landed for cov in c.engine.get_room(room).coverage))
            ab = c.engine.abort_room(room, "no longer wanted")
            self.assertEqual(ab.room.phase, common_pb2.ROOM_PHASE_FAILED)
            for bg in (opened, claim):
                e = bg.failure()
                self.assertIsInstance(e, decodeplane.RoomFailedError, transport)
                assert isinstance(e, decodeplane.RoomFailedError)
                self.assertEqual((e.room, e.failure_code, e.message),
                                 (room, common_pb2.FAILURE_CODE_ABORTED, "no longer wanted"))

    def test_abort_acknowledged(self) -> None:
        """A rank that moves its own bytes owes the room's end an ack: the
        hand-off stops writing and acks, and the pages drain at once."""
        p = self.registered()[0]
        room = room_id()
        blocked = threading.Event()

        def move(ch: decodeplane.Chunk, stop: threading.Event) -> int:
            if ch.index == 1:
                blocked.set()
                if not stop.wait(WAIT):
                    raise AssertionError("the hand-off never said stop")
            return ch.bytes()

        send = Background(lambda: p.report_room(room, move=move, chunk_pages=1, timeout=WAIT))
        self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr, prompt_len=100))
        self.assertTrue(blocked.wait(WAIT))
        self.client.engine.abort_room(room)
        err = send.failure()
        self.assertIsInstance(err, decodeplane.RoomFailedError)
        assert isinstance(err, decodeplane.RoomFailedError)
        self.assertTrue(err.ack_required)
        # Acked: the pages are back long before release.deferred_timeout (30 s).
        poll("the pages drained", lambda: self.client.admin.status().shards[0].draining_pages == 0, timeout=10)
        self.assertEqual(self.client.engine.get_room(room).waiting_for, "")


def _exists(c: decodeplane.Client, room: int) -> bool:
    try:
        c.engine.get_room(room)
        return True
    except decodeplane.NotFoundError:
        return False


class SessionsTest(DaemonCase):
    def test_engine_session(self) -> None:
        p = self.registered()[0]
        addr = p.rank.bootstrap_addr
        rooms = [room_id(), room_id()]
        with self.client.engine.session(timeout=WAIT) as s:
            subs = {r: s.subscribe(r) for r in rooms}
            res = s.open([self.client.engine._keyed(_req(r, addr)) for r in rooms]
                         + [_req(room_id(), addr, prompt_len=0)], timeout=WAIT)
            self.assertEqual(s._outbox._max, 65)
            self.assertEqual([r.error for r in res[:2]], [None, None])
            self.assertEqual([r.open.room.room for r in res[:2]], rooms)  # type: ignore[union-attr]
            self.assertEqual(res[0].incarnation, self.daemon.incarnation)
            bad = res[2].error
            self.assertIsInstance(bad, decodeplane.InvalidArgumentError)
            assert isinstance(bad, decodeplane.InvalidArgumentError)
            self.assertEqual(bad.field, "open.rooms[2].prompt_len")
            for r in rooms:
                self.assertIsNotNone(p.send_room(r, timeout=WAIT))
            for r in rooms:
                seqs, phases = [], []
                while not phases or phases[-1] != SUCCEEDED:
                    ev = subs[r].next(WAIT)
                    assert ev is not None
                    self.assertEqual(ev.room, r)
                    seqs.append(ev.seq)
                    phases.append(ev.event.transition.phase)
                self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "a room's events come in order, none skipped")
            self.assertEqual(s.cursors(), {rooms[0]: seqs[-1] if r == rooms[0] else s.cursors()[rooms[0]],
                                           rooms[1]: seqs[-1]})
            rel = s.release(rooms[0], timeout=WAIT)
            self.assertEqual(rel.pages_released, 2)
            ab = s.abort(rooms[1], "done", timeout=WAIT)
            self.assertEqual(ab.room.failure.message, "done")
            with self.assertRaises(decodeplane.NotFoundError):
                s.release(room_id(), timeout=WAIT)
            for r, phase in ((rooms[0], common_pb2.ROOM_PHASE_RELEASED), (rooms[1], common_pb2.ROOM_PHASE_FAILED)):
                last = subs[r].next(WAIT)
                assert last is not None
                self.assertTrue(last.event.terminal)
                self.assertEqual(last.event.transition.phase, phase)
                self.assertIsNone(subs[r].next(WAIT))
            self.assertEqual(s.cursors(), {})
            s.close_send()
            self.assertIsNone(s.next(WAIT))  # the daemon ended the stream OK
            self.assertIsNone(s.error)

    def test_engine_session_resume(self) -> None:
        p = self.registered()[0]
        room = room_id()
        first = self.client.engine.session(timeout=WAIT)
        res = first.open([_req(room, p.rank.bootstrap_addr)], timeout=WAIT)
        self.assertIsNone(res[0].error)
        ev = first.next(WAIT)
        assert ev is not None
        self.assertEqual(ev.seq, 1)
        cursors = first.cursors()
        self.assertEqual(cursors, {room: 1})
        first.close()
        self.assertIsInstance(first.error, decodeplane.CanceledError)
        p.send_room(room, timeout=WAIT)  # the room goes on meanwhile
        with self.client.engine.session(timeout=WAIT) as second:
            res = second.resume(cursors, timeout=WAIT)
            self.assertEqual([(r.room, r.error) for r in res], [(room, None)])
            seqs = []
            while True:
                ev = second.next(WAIT)
                assert ev is not None
                seqs.append(ev.seq)
                if ev.event.transition.phase == SUCCEEDED:
                    break
            self.assertEqual(seqs, list(range(2, 2 + len(seqs))), "the resume re-delivers exactly what was missed")
            gone = second.resume({room_id(): 0}, timeout=WAIT)
            self.assertIsInstance(gone[0].error, decodeplane.NotFoundError)
        self.client.engine.release_room(room)

    def test_prefill_session(self) -> None:
        p = self.registered()[0]
        room = room_id()
        with self.assertRaises(decodeplane.NotFoundError):
            self.client.prefill(p._reg.__class__(bootstrap_addr="10.255.0.1:1", rank_endpoint="10.255.0.1:2",
                                                  parallel=p._reg.parallel, page_size=64,
                                                  kv_cache_dtype="bf16")).session(timeout=WAIT)
        with p.session(timeout=WAIT) as s:
            self.assertEqual(s.welcome.incarnation, self.daemon.incarnation)
            self.assertEqual(s._outbox._max, 65)
            claim = s.claim(room, timeout=WAIT)
            self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr, prompt_len=100))
            ev = claim.next(WAIT)
            assert ev is not None and ev.destination is not None
            d = ev.destination
            with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
                s.chunk(room=room, chunk_index=0, page_offset=7, num_pages=1, attempt=1, incarnation=d.incarnation,
                        timeout=WAIT)
            self.assertEqual(cm.exception.field, "page_offset")  # "chunk." is the session's prefix
            with self.assertRaises(decodeplane.StaleIncarnationError):
                s.chunk(room=room, chunk_index=0, page_offset=0, num_pages=1, incarnation=d.incarnation ^ 1,
                        timeout=WAIT)
            f = s.chunk_async(room=room, chunk_index=0, page_offset=0, num_pages=1, attempt=1,
                              incarnation=d.incarnation)
            self.assertEqual(f.result(WAIT).bytes, 64 * d.token_bytes)
            f = s.report_async(room=room, chunk_index=1, page_offset=1, num_pages=1, last=True, success=True,
                               bytes=(100 - 64) * d.token_bytes, metadata_room_marker=room, attempt=1,
                               incarnation=d.incarnation)
            self.assertEqual(f.result(WAIT).poll, common_pb2.KV_POLL_SUCCESS)
            end = claim.next(WAIT)
            assert end is not None and end.done is not None
            self.assertEqual(end.done.phase, SUCCEEDED)
            self.assertFalse(s.ack(room=room, attempt=1, incarnation=d.incarnation, timeout=WAIT).owed)
            with self.assertRaises(decodeplane.StaleAttemptError):
                s.ack(room=room, attempt=3, incarnation=d.incarnation, timeout=WAIT)
            # A hand-off over this very session.
            other = room_id()
            send = Background(lambda: p.send_room_session(s, other, chunk_pages=1, timeout=WAIT))
            got = self.client.engine.open_and_wait(**open_fields(other, p.rank.bootstrap_addr), timeout=WAIT)
            self.assertEqual(got.phase, SUCCEEDED)
            self.assertEqual(len(send.outcome().page_indices), 2)
        self.assertTrue(s.done)

    def test_heartbeat_keeps_the_session(self) -> None:
        p = self.registered()[0]
        hb = p.start_heartbeat()
        try:
            s = poll("the heartbeat's session", p._mux.live)
            self.assertEqual(s.welcome.incarnation, self.daemon.incarnation)
            room = room_id()
            send = Background(lambda: p.send_room(room, timeout=WAIT))
            self.client.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
            send.outcome()
            self.assertIs(p._mux.live(), s, "the hand-off used the heartbeat's session")
        finally:
            hb.stop(WAIT)
        self.assertFalse(hb.running)
        self.assertIsNone(hb.error)
        self.assertIsNone(p._mux.live(), "the last user closed the session")


class ResumeTest(DaemonCase):
    """The network drops the streams (a proxy cuts its connections): the
    client re-opens them and nothing is lost or seen twice."""

    def setUp(self) -> None:
        super().setUp()
        self.proxy = Proxy(self.daemon.addr)
        self.addCleanup(self.proxy.close)
        self.via = self.new_client(target=self.proxy.addr,
                                   retry=decodeplane.RetryPolicy(max_attempts=6, initial_backoff=0.05, max_backoff=0.3))

    def test_watch_room(self) -> None:
        p = self.registered()[0]
        room = room_id()
        self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr))
        with self.via.engine.watch_room(room, history=True, timeout=WAIT) as w:
            first = w.next()
            assert first is not None
            self.assertEqual(first.transition.phase, common_pb2.ROOM_PHASE_WAITING_PREFILL)
            self.proxy.cut()
            p.send_room(room, timeout=WAIT)
            phases = []
            while not phases or phases[-1] != SUCCEEDED:
                ev = w.next()
                assert ev is not None
                phases.append(ev.transition.phase)
        self.assertGreaterEqual(self.proxy.accepted, 2)
        self.assertEqual(len(phases), len(set(phases)), f"a transition came twice: {phases}")
        self.assertNotIn(common_pb2.ROOM_PHASE_WAITING_PREFILL, phases)

    def test_open_and_wait(self) -> None:
        p = self.registered()[0]
        room = room_id()
        opened = Background(lambda: self.via.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr),
                                                                  timeout=WAIT))
        # Cut once the client has the open's answer (an open whose answer is
        # lost is not sent again without an idempotency key).
        poll("the open answered", lambda: (w := self.via.engine._mux.rooms.get(room)) is not None and w.opened)
        before = self.proxy.accepted
        self.proxy.cut()
        p.send_room(room, timeout=WAIT)
        got = opened.outcome()
        self.assertEqual((got.room, got.phase), (room, SUCCEEDED))
        self.assertGreater(self.proxy.accepted, before, "the session was not re-opened")

    def test_send_room(self) -> None:
        p = self.registered(client=self.via)[0]
        room = room_id()
        send = Background(lambda: p.send_room(room, timeout=WAIT))
        poll("the claim waiting", lambda: self.client.admin.status().pending_claims == 1)
        before = self.proxy.accepted
        self.proxy.cut()
        got = self.client.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
        self.assertEqual(got.phase, SUCCEEDED)
        self.assertEqual(send.outcome().room, room)
        self.assertGreater(self.proxy.accepted, before, "the prefill session was not re-opened")


def _req(room: int, addr: str, **kw: object):  # type: ignore[no-untyped-def]
    from decodeplane.v1 import rooms_pb2

    return rooms_pb2.OpenRoomRequest(**open_fields(room, addr, **kw))  # type: ignore[arg-type]
