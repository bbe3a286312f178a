"""The request's deadline: open_and_wait and open_room send what their
timeout leaves as OpenRoomRequest.timeout, and a room the daemon cannot
hand off in time fails before the caller's timeout, naming the phase."""

from __future__ import annotations

import time
import unittest

import decodeplane
from decodeplane._core import Deadline, with_deadline
from decodeplane.v1 import common_pb2, rooms_pb2
from tests.base import DaemonCase, open_fields, room_id


class WithDeadlineTest(unittest.TestCase):
    def test_budget(self) -> None:
        req = rooms_pb2.OpenRoomRequest(room=7)
        self.assertIs(with_deadline(req, Deadline(None)), req, "no deadline: the request as it is")
        got = with_deadline(req, Deadline(10.0))
        self.assertFalse(req.HasField("timeout"), "the caller's request was changed")
        # 10 s less the reserve (100 ms), less the time this took (a loaded machine: up to 90 ms).
        self.assertTrue(9_800 <= got.timeout.ToMilliseconds() <= 9_900, got.timeout)
        self.assertTrue(900 <= with_deadline(req, Deadline(1.0)).timeout.ToMilliseconds() <= 950)
        self.assertEqual(with_deadline(req, Deadline(0.0)).timeout.ToMilliseconds(), 1, "at least 1 ms")
        self.assertEqual(with_deadline(req, Deadline(3 * 86_400.0)).timeout.ToMilliseconds(), 86_400_000, "at most 24 h")
        own = rooms_pb2.OpenRoomRequest(room=7)
        own.timeout.FromSeconds(3)
        self.assertIs(with_deadline(own, Deadline(10.0)), own, "a shorter timeout of the request's own is kept")
        self.assertTrue(1_800 <= with_deadline(own, Deadline(2.0)).timeout.ToMilliseconds() <= 1_900)


class DeadlineTest(DaemonCase):
    def test_open_and_wait_fails_in_time_naming_the_phase(self) -> None:
        for transport in decodeplane.Transport:
            c = self.new_client(transport=transport)
            p = self.registered(client=c)[0]  # registered; it never claims
            room = room_id()
            start = time.monotonic()
            with self.assertRaises(decodeplane.RoomFailedError) as failed:
                c.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=2.0)
            took = time.monotonic() - start
            e = failed.exception
            self.assertEqual(e.failure_code, common_pb2.FAILURE_CODE_DEADLINE_EXCEEDED, transport)
            self.assertIn("in KVPoll.WaitingForInput, phase admitted", e.message)
            self.assertLess(took, 2.0, f"{transport}: the failure came after the caller's timeout")
            r = c.engine.get_room(room)
            # What was left when the open went out (at least 2 s less the
            # time the call took), less the reserve for the answer (100 ms).
            ms = r.timeout.ToMilliseconds()
            self.assertTrue((1.9 - took) * 1000 - 1 <= ms <= 1_900, (ms, took))
            self.assertEqual([pt.phase for pt in r.phase_times][-1], common_pb2.ROOM_PHASE_ADMITTED)

    def test_open_room_sends_its_timeout(self) -> None:
        p = self.registered()[0]
        room = room_id()
        start = time.monotonic()
        r = self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr), timeout=5.0).room
        took = time.monotonic() - start
        # 5 s less the reserve (100 ms), less at most the time the call took.
        ms = r.timeout.ToMilliseconds()
        self.assertTrue((4.9 - took) * 1000 - 1 <= ms <= 4_900, (ms, took))
        self.client.engine.abort_room(room)
        room = room_id()
        r = self.client.engine.open_room(**open_fields(room, p.rank.bootstrap_addr)).room
        self.assertFalse(r.HasField("timeout"), "the client's default call timeout is not a budget")
        self.client.engine.abort_room(room)


if __name__ == "__main__":
    unittest.main()
