"""Daemon restarts (IncarnationChangedError where the Go client raises it),
retries on UNAVAILABLE, and the engine's resync after a restart."""

from __future__ import annotations

import logging
import threading
import unittest

import decodeplane
from decodeplane.v1 import common_pb2, rooms_pb2
from tests.base import PATIENT, WAIT, Background, open_fields, poll, prefill_addr, registration, room_id
from tests.daemon import Daemon, free_port


class RetryLog(logging.Handler):
    """Counts the client's retries (its DEBUG records on the "decodeplane" logger)."""

    def __init__(self, on_first: "threading.Event | None" = None) -> None:
        super().__init__(logging.DEBUG)
        self.retries: list[str] = []
        self.first = on_first or threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "retrying in" in msg:
            self.retries.append(msg)
            self.first.set()

    def __enter__(self) -> "RetryLog":
        log = logging.getLogger("decodeplane")
        self._level = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger("decodeplane")
        log.removeHandler(self)
        log.setLevel(self._level)


class RestartTest(unittest.TestCase):
    def setUp(self) -> None:
        self.daemon = Daemon().start()
        self.addCleanup(self.daemon.stop)
        self.client = decodeplane.Client(self.daemon.addr, timeout=WAIT, retry=PATIENT)
        self.addCleanup(self.client.close)

    def restart(self) -> tuple[int, int]:
        old = self.daemon.incarnation
        self.daemon.kill()
        self.daemon.start()
        self.assertNotEqual(self.daemon.incarnation, old)
        return old, self.daemon.incarnation

    def test_watch_and_open_and_wait(self) -> None:
        addr = prefill_addr()  # never registered: the rooms wait for their prefill
        watched, waited = room_id(), room_id()
        self.client.engine.open_room(**open_fields(watched, addr))
        w = self.client.engine.watch_room(watched, timeout=WAIT)
        first = w.next()
        assert first is not None
        opened = Background(lambda: self.client.engine.open_and_wait(**open_fields(waited, addr), timeout=WAIT))
        poll("the open answered", lambda: (x := self.client.engine._mux.rooms.get(waited)) is not None and x.opened)
        old, new = self.restart()
        with self.assertRaises(decodeplane.IncarnationChangedError) as cm:
            w.next()
        e = cm.exception
        self.assertEqual((e.room, e.old, e.new, e.watch), (watched, old, new, True))
        self.assertIsInstance(e.cause, decodeplane.NotFoundError)
        err = opened.failure()
        self.assertIsInstance(err, decodeplane.IncarnationChangedError)
        assert isinstance(err, decodeplane.IncarnationChangedError)
        self.assertEqual((err.room, err.old, err.new, err.watch), (waited, old, new, True))

    def test_prefill_after_restart(self) -> None:
        changes: list[tuple[int, int]] = []
        p = self.client.prefill(registration(prefill_addr()), on_incarnation_change=lambda o, n: changes.append((o, n)))
        self.addCleanup(p.close)
        p.register()
        room = room_id()
        send = Background(lambda: p.send_room(room, timeout=WAIT))
        got = self.client.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
        dest = send.outcome()
        self.assertEqual(got.phase, common_pb2.ROOM_PHASE_SUCCEEDED)
        old, new = self.restart()
        # A chunk of the old incarnation's destination is refused, nothing changes.
        with self.assertRaises(decodeplane.StaleIncarnationError) as st:
            p.transfer(room=room, chunk_index=0, page_offset=0, num_pages=1, attempt=1, incarnation=dest.incarnation)
        self.assertEqual((st.exception.old, st.exception.new), (old, new))
        # The next hand-off finds out at its session's hello and says so.
        with self.assertRaises(decodeplane.IncarnationChangedError) as cm:
            p.send_room(room_id(), timeout=WAIT)
        self.assertEqual((cm.exception.old, cm.exception.new), (old, new))
        self.assertEqual(changes, [(old, new)])
        self.assertEqual(p.incarnation, new)
        # Registered again, the rank hands rooms off on the new daemon.
        self.assertEqual(p.register().incarnation, new)
        room = room_id()
        send = Background(lambda: p.send_room(room, timeout=WAIT))
        self.client.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
        self.assertEqual(send.outcome().incarnation, new)

    def test_heartbeat_registers_again(self) -> None:
        for transport in decodeplane.Transport:
            c = decodeplane.Client(self.daemon.addr, timeout=WAIT, retry=PATIENT, transport=transport)
            self.addCleanup(c.close)
            errors: list[BaseException] = []
            p = c.prefill(registration(prefill_addr()), heartbeat_every=0.2, on_heartbeat_error=errors.append)
            hb = p.start_heartbeat()
            self.addCleanup(hb.stop, WAIT)
            poll("the first registration", lambda: p.registration is not None)
            old, new = self.restart()
            poll(f"the registration with the new daemon ({transport})",
                 lambda: p.registration is not None and p.registration.incarnation == new)
            self.assertTrue(hb.running)
            self.assertTrue(any(isinstance(e, (decodeplane.NotFoundError, decodeplane.IncarnationChangedError,
                                               decodeplane.UnavailableError)) for e in errors), errors)
            hb.stop(WAIT)
            self.assertIsNone(hb.error)


class RetryTest(unittest.TestCase):
    def test_unavailable_is_retried_then_raised(self) -> None:
        c = decodeplane.Client(f"127.0.0.1:{free_port()}", timeout=WAIT,
                               retry=decodeplane.RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.1))
        self.addCleanup(c.close)
        with RetryLog() as log:
            with self.assertRaises(decodeplane.UnavailableError):
                c.admin.status()
        self.assertEqual(len(log.retries), 2, log.retries)  # 3 attempts
        with RetryLog() as log:
            with self.assertRaises(decodeplane.UnavailableError):
                c.engine.open_room(**open_fields(room_id(), prefill_addr()))
        self.assertEqual(log.retries, [], "an OpenRoom without an idempotency key is never retried")
        with RetryLog() as log:
            with self.assertRaises(decodeplane.UnavailableError):
                c.engine.open_room(**open_fields(room_id(), prefill_addr(), idempotency_key="k"))
        self.assertEqual(len(log.retries), 2)
        with RetryLog() as log:
            with self.assertRaises(decodeplane.UnavailableError):
                c.admin.drain()
        self.assertEqual(log.retries, [], "Drain is never retried")

    def test_retry_reaches_a_daemon_that_comes_up(self) -> None:
        port = free_port()
        d = Daemon(port=port)
        self.addCleanup(d.stop)
        c = decodeplane.Client(d.addr, timeout=WAIT, retry=PATIENT)
        self.addCleanup(c.close)
        first = threading.Event()
        starter = threading.Thread(target=lambda: first.wait(WAIT) and d.start(), daemon=True)
        starter.start()
        with RetryLog(first) as log:
            st = c.admin.status()
        starter.join(WAIT)
        self.assertEqual(st.incarnation, d.incarnation)
        self.assertGreaterEqual(len(log.retries), 1)


class ResyncTest(unittest.TestCase):
    def test_resync(self) -> None:
        d = Daemon("engine.resync_timeout=1m").start()
        self.addCleanup(d.stop)
        c = decodeplane.Client(d.addr, timeout=WAIT)
        self.addCleanup(c.close)
        self.assertTrue(c.admin.status().readiness.startswith("waiting for the decode engine's resync"))
        room = room_id()
        declared = rooms_pb2.ResyncRoom(room=room, rid="r", prompt_len=100, output_len=10, max_new_tokens=16,
                                        decode_dp_rank=0, req_slot=1, page_indices=[3, 4])
        with self.assertRaises(decodeplane.InvalidArgumentError) as cm:
            c.engine.resync([rooms_pb2.ResyncRoom(room=room_id(), rid="r", prompt_len=100, output_len=10,
                                                  max_new_tokens=16, req_slot=2, page_indices=[5])])
        self.assertEqual(cm.exception.field, "rooms[0].page_indices")
        resp = c.engine.resync([declared])
        self.assertEqual((resp.adopted, resp.declared, resp.pages, resp.admitting), (1, 1, 2, True))
        r = c.engine.get_room(room, include_pages=True)
        self.assertEqual((r.phase, list(r.page_indices)), (common_pb2.ROOM_PHASE_SUCCEEDED, [3, 4]))
        self.assertEqual(c.engine.release_room(room).pages_released, 2)
        self.assertEqual(c.admin.status().readiness, "serving")


if __name__ == "__main__":
    unittest.main()
