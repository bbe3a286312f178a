"""Tests of the client's parts that need no daemon: the retry table and
policy, the status details decoding, the error classes, chunking and the
send queue's packing."""

from __future__ import annotations

import threading
import unittest

import grpc
from google.protobuf import any_pb2, duration_pb2

import decodeplane
from decodeplane import errors
from decodeplane._core import Outbox
from decodeplane._vendor import rpc_status_pb2
from decodeplane.prefill import chunks
from decodeplane.retry import RETRY_TABLE, RetryClass, RetryPolicy, all_methods, retryable
from decodeplane.v1 import engine_session_pb2, rooms_pb2


def _any(type_name: str, msg: object) -> any_pb2.Any:
    return any_pb2.Any(type_url=f"type.googleapis.com/{type_name}", value=msg.SerializeToString())  # type: ignore[attr-defined]


class FakeCallError(grpc.RpcError):
    """What grpc raises: an RpcError that is a Call."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing: tuple = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailing


class RetryTest(unittest.TestCase):
    def test_every_rpc_is_classified(self) -> None:
        methods = all_methods()
        self.assertGreaterEqual(len(methods), 28)
        self.assertIn("/decodeplane.v1.Rooms/OpenRoom", methods)
        self.assertIn("/decodeplane.v1.PrefillSession/Session", methods)
        missing = [m for m in methods if m not in RETRY_TABLE]
        self.assertEqual(missing, [], "RPCs without a retry class: classify them in decodeplane/retry.py")
        self.assertEqual(sorted(RETRY_TABLE), methods, "the table names RPCs the protos do not have")

    def test_classes(self) -> None:
        self.assertTrue(retryable("/decodeplane.v1.Rooms/Transfer", rooms_pb2.TransferRequest()))
        self.assertFalse(retryable("/decodeplane.v1.Rooms/OpenRoom", rooms_pb2.OpenRoomRequest(room=1)))
        self.assertTrue(retryable("/decodeplane.v1.Rooms/OpenRoom", rooms_pb2.OpenRoomRequest(room=1, idempotency_key="k")))
        self.assertFalse(retryable("/decodeplane.v1.Rooms/ReportRunning", rooms_pb2.ReportRunningRequest()))
        self.assertFalse(retryable("/decodeplane.v1.Admin/Drain", None))
        self.assertEqual(RETRY_TABLE["/decodeplane.v1.Capacity/WatchCapacity"], RetryClass.NEVER)

    def test_policy(self) -> None:
        p = RetryPolicy(max_attempts=5, initial_backoff=0.1, max_backoff=0.3)
        for n, (lo, hi) in enumerate([(0.05, 0.1), (0.1, 0.2), (0.15, 0.3), (0.15, 0.3)], start=1):
            for _ in range(50):
                b = p.backoff(n)
                self.assertTrue(lo <= b <= hi, f"backoff({n}) = {b} not in [{lo}, {hi}]")
        unavailable = errors.make_error("X", grpc.StatusCode.UNAVAILABLE, "down")
        self.assertTrue(0.05 <= p.retry_delay(unavailable, 1) <= 0.1)
        told = errors.make_error("X", grpc.StatusCode.UNAVAILABLE, "down", retry_after=2.5)
        self.assertEqual(p.retry_delay(told, 1), 2.5)
        full = errors.make_error("X", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", retry_after=0.7)
        self.assertEqual(p.retry_delay(full, 3), 0.7)
        too_big = errors.make_error("X", grpc.StatusCode.RESOURCE_EXHAUSTED, "message too large")
        self.assertIsNone(p.retry_delay(too_big, 1))
        for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                     grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL):
            self.assertIsNone(p.retry_delay(errors.make_error("X", code, "no"), 1), code)
        with self.assertRaises(ValueError):
            RetryPolicy(max_attempts=0)
        with self.assertRaises(ValueError):
            RetryPolicy(initial_backoff=2, max_backoff=1)


class ErrorsTest(unittest.TestCase):
    def trailer(self, *details: any_pb2.Any) -> tuple:
        st = rpc_status_pb2.Status(code=9, message="m", details=list(details))
        return (("grpc-status-details-bin", st.SerializeToString()),)

    def test_stale_incarnation_from_trailer(self) -> None:
        info = rpc_status_pb2.ErrorInfo(reason="STALE_INCARNATION", domain="decodeplane.v1",
                                        metadata={"incarnation": "1f", "daemon_incarnation": "2e"})
        e = errors.from_rpc_error("Transfer", FakeCallError(grpc.StatusCode.FAILED_PRECONDITION, "stale",
                                                             self.trailer(_any("google.rpc.ErrorInfo", info))))
        self.assertIsInstance(e, decodeplane.StaleIncarnationError)
        self.assertIsInstance(e, decodeplane.FailedPreconditionError)
        self.assertIsInstance(e, decodeplane.IncarnationChangedError)
        self.assertIsInstance(e, grpc.RpcError)
        self.assertEqual((e.old, e.new), (0x1F, 0x2E))
        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(e.details(), "stale")
        self.assertEqual((e.reason, e.domain, e.op), ("STALE_INCARNATION", "decodeplane.v1", "Transfer"))

    def test_retry_info_and_attempt(self) -> None:
        ri = rpc_status_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000))
        e = errors.from_rpc_error("OpenRoom", FakeCallError(grpc.StatusCode.RESOURCE_EXHAUSTED, "full",
                                                            self.trailer(_any("google.rpc.RetryInfo", ri))))
        self.assertIsInstance(e, decodeplane.ResourceExhaustedError)
        self.assertEqual(e.retry_after, 1.5)
        info = rpc_status_pb2.ErrorInfo(reason="STALE_ATTEMPT", domain="decodeplane.v1")
        e = errors.from_rpc_error("AckRoomEnd", FakeCallError(grpc.StatusCode.FAILED_PRECONDITION, "old",
                                                              self.trailer(_any("google.rpc.ErrorInfo", info))))
        self.assertIsInstance(e, decodeplane.StaleAttemptError)
        self.assertNotIsInstance(e, decodeplane.IncarnationChangedError)
        info = rpc_status_pb2.ErrorInfo(reason="PAGE_HELD", domain="decodeplane.v1", metadata={
            "what": "metadata slot", "index": "7", "holder": "41", "draining": "true"})
        e = errors.from_rpc_error("DeclareDestination", FakeCallError(grpc.StatusCode.FAILED_PRECONDITION, "held",
                                                                      self.trailer(_any("google.rpc.ErrorInfo", info))))
        self.assertIsInstance(e, decodeplane.PageHeldError)
        assert isinstance(e, decodeplane.PageHeldError)
        self.assertEqual((e.what, e.index, e.holder, e.draining), ("metadata slot", 7, 41, True))
        bare = errors.make_error("DeclareDestination", grpc.StatusCode.FAILED_PRECONDITION, "held", reason="PAGE_HELD")
        assert isinstance(bare, decodeplane.PageHeldError)
        self.assertEqual((bare.what, bare.index, bare.holder, bare.draining), ("", -1, 0, False))

    def test_families_and_fields(self) -> None:
        cases = {
            grpc.StatusCode.NOT_FOUND: decodeplane.NotFoundError,
            grpc.StatusCode.OUT_OF_RANGE: decodeplane.InvalidArgumentError,
            grpc.StatusCode.UNKNOWN: decodeplane.InternalError,
            grpc.StatusCode.CANCELLED: decodeplane.CanceledError,
            grpc.StatusCode.UNAVAILABLE: decodeplane.UnavailableError,
        }
        for code, cls in cases.items():
            self.assertIsInstance(errors.from_rpc_error("X", FakeCallError(code, "x")), cls, code)
        e = errors.make_error("OpenRoom", grpc.StatusCode.INVALID_ARGUMENT,
                              "open.rooms[0].prompt_len: must be > 0\nrid: is required")
        self.assertEqual(e.fields, ["open.rooms[0].prompt_len", "rid"])
        u = errors.unprefix(e, "open.rooms[0].")
        self.assertIsInstance(u, decodeplane.InvalidArgumentError)
        self.assertEqual(u.field, "prompt_len")
        self.assertEqual(u.message, "prompt_len: must be > 0\nrid: is required")
        resync = errors.make_error("Resync", grpc.StatusCode.INVALID_ARGUMENT,
                                   "resync (0 rooms of this call adopted before it): rooms[0].page_indices: adopt room 5: "
                                   "1 pages for 110 tokens, want 2: invalid request")
        self.assertEqual(resync.field, "rooms[0].page_indices")
        sglang = errors.make_error("OpenRoom", grpc.StatusCode.INVALID_ARGUMENT,
                                   "Request r1 exceeds the maximum number of tokens: 9 > 8")
        self.assertEqual(sglang.field, "")
        self.assertIn("invalid argument: Request r1", str(sglang))


class PickleTest(unittest.TestCase):
    def test_errors_pickle_with_their_attributes(self) -> None:
        import pickle

        from decodeplane.v1 import common_pb2

        stale = errors.make_error("Transfer", grpc.StatusCode.FAILED_PRECONDITION, "stale", reason="STALE_INCARNATION",
                                  error_metadata={"incarnation": "a", "daemon_incarnation": "b"})
        failed = decodeplane.RoomFailedError(7, common_pb2.Failure(code=common_pb2.FAILURE_CODE_ABORTED, message="gone"),
                                             ack_required=True)
        for e in (stale, failed, errors.make_error("OpenRoom", grpc.StatusCode.RESOURCE_EXHAUSTED, "full", retry_after=1.0)):
            back = pickle.loads(pickle.dumps(e))
            self.assertIs(type(back), type(e))
            self.assertEqual((back.code(), back.message, back.op, str(back)), (e.code(), e.message, e.op, str(e)))
        back = pickle.loads(pickle.dumps(stale))
        self.assertEqual((back.old, back.new, back.reason), (0xA, 0xB, "STALE_INCARNATION"))
        back = pickle.loads(pickle.dumps(failed))
        self.assertEqual((back.room, back.failure_code, back.ack_required), (7, common_pb2.FAILURE_CODE_ABORTED, True))


class ChunkTest(unittest.TestCase):
    def test_chunks_and_bytes(self) -> None:
        d = rooms_pb2.Destination(page_indices=[5, 6, 7], page_size=64, fill_len=150, token_bytes=10, state_bytes=3)
        cs = chunks(d, 2)
        self.assertEqual([(c.index, c.page_offset, c.num_pages, c.last) for c in cs], [(0, 0, 2, False), (1, 2, 1, True)])
        self.assertEqual(cs[0].pages(), [5, 6])
        self.assertEqual(cs[0].bytes(), 128 * 10)
        self.assertEqual(cs[1].bytes(), (150 - 128) * 10 + 3)
        self.assertEqual([c.num_pages for c in chunks(d)], [3])
        empty = chunks(rooms_pb2.Destination())
        self.assertEqual([(c.num_pages, c.last) for c in empty], [(0, True)])


class OutboxTest(unittest.TestCase):
    def test_packs_what_was_queued_meanwhile(self) -> None:
        box: Outbox[engine_session_pb2.EngineRequest] = Outbox()
        box.set_max(3)
        for seq in range(1, 6):
            box.push(engine_session_pb2.EngineRequest(seq=seq))
        box.close()
        got = [(m.seq, [x.seq for x in m.more]) for m in box]
        self.assertEqual(got, [(1, [2, 3]), (4, [5])])
        self.assertEqual(box.last_written, 5)

    def test_idle_message_and_order(self) -> None:
        box: Outbox[engine_session_pb2.EngineRequest] = Outbox(
            idle=0.01, idle_message=lambda: engine_session_pb2.EngineRequest(seq=0))
        it = iter(box)
        self.assertEqual(next(it).seq, 0)  # nothing queued for 10 ms: the idle message
        box.push(engine_session_pb2.EngineRequest(seq=7))
        self.assertEqual(next(it).seq, 7)
        t = threading.Timer(0.05, box.close)
        t.start()
        rest = list(it)
        self.assertTrue(all(m.seq == 0 for m in rest))
        t.join()
        self.assertFalse(box.push(engine_session_pb2.EngineRequest(seq=8)))


if __name__ == "__main__":
    unittest.main()


#: Where each RPC is reached from a Client (``c``) and a Prefill (``p``):
#: a new RPC fails the test until the client wraps it.
RPC_METHODS = {
    "/decodeplane.v1.Admin/GetStatus": "c.admin.status",
    "/decodeplane.v1.Admin/Drain": "c.admin.drain",
    "/decodeplane.v1.Bootstrap/RegisterPrefill": "p.register",
    "/decodeplane.v1.Bootstrap/Heartbeat": "p.heartbeat",
    "/decodeplane.v1.Bootstrap/DeregisterPrefill": "p.deregister",
    "/decodeplane.v1.Bootstrap/BindRoom": "p.bind_room",
    "/decodeplane.v1.Bootstrap/LookupDPRanks": "c.engine.lookup_dp_ranks",
    "/decodeplane.v1.Rooms/OpenRoom": "c.engine.open_room",
    "/decodeplane.v1.Rooms/AwaitDestination": "p.await_destination",
    "/decodeplane.v1.Rooms/Transfer": "p.transfer",
    "/decodeplane.v1.Rooms/ReportTransfer": "p.report_transfer",
    "/decodeplane.v1.Rooms/WatchRoom": "c.engine.watch_room",
    "/decodeplane.v1.Rooms/GetRoom": "c.engine.get_room",
    "/decodeplane.v1.Rooms/AbortRoom": "c.engine.abort_room",
    "/decodeplane.v1.Rooms/ReleaseRoom": "c.engine.release_room",
    "/decodeplane.v1.Rooms/ListRooms": "c.admin.list_rooms",
    "/decodeplane.v1.Rooms/ReportRunning": "c.engine.report_running",
    "/decodeplane.v1.Rooms/RetractRoom": "c.engine.retract_room",
    "/decodeplane.v1.Rooms/ContinueGeneration": "c.engine.continue_generation",
    "/decodeplane.v1.Rooms/Resync": "c.engine.resync",
    "/decodeplane.v1.Rooms/AckRoomEnd": "p.ack_room_end",
    "/decodeplane.v1.Rooms/DeclareDestination": "c.engine.declare_destination",
    "/decodeplane.v1.Rooms/RegisterEngineLayout": "c.engine.register_engine_layout",
    "/decodeplane.v1.Staging/SetupStaging": "p.setup_staging",
    "/decodeplane.v1.Staging/AllocateStaging": "p.allocate_staging",
    "/decodeplane.v1.Staging/ChunkReady": "p.chunk_ready",
    "/decodeplane.v1.Staging/WatchWatermark": "p.watch_watermark",
    "/decodeplane.v1.Fleet/GetFleet": "c.admin.get_fleet",
    "/decodeplane.v1.Capacity/WatchCapacity": "c.admin.watch_capacity",
    "/decodeplane.v1.Capacity/ReportCapacity": "c.engine.report_capacity",
    "/decodeplane.v1.EngineSession/Session": "c.engine.session",
    "/decodeplane.v1.PrefillSession/Session": "p.session",
}


class ReachTest(unittest.TestCase):
    def test_every_rpc_has_a_method(self) -> None:
        self.assertEqual(sorted(RPC_METHODS), all_methods())
        with decodeplane.Client("127.0.0.1:1") as c:
            p = c.prefill(bootstrap_addr="10.0.0.1:8998")
            for rpc, path in RPC_METHODS.items():
                obj: object = {"c": c, "p": p}[path[0]]
                for part in path.split(".")[1:]:
                    obj = getattr(obj, part)
                self.assertTrue(callable(obj), rpc)
