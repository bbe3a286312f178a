"""Behaviour the real daemon cannot show on demand: a daemon without the
sessions (an older one answers UNIMPLEMENTED) gets the unary API, as the Go
client does. A minimal in-process Rooms service stands in for it."""

from __future__ import annotations

import threading
import time
import unittest
from concurrent import futures
from typing import Iterator

import grpc

import decodeplane
from decodeplane.v1 import bootstrap_pb2, common_pb2, rooms_pb2, rooms_pb2_grpc
from tests.base import WAIT, Background

INCARNATION = 0x5EED


class OldRooms(rooms_pb2_grpc.RoomsServicer):
    """Rooms without EngineSession and PrefillSession."""

    def __init__(self) -> None:
        self.landed = threading.Event()
        self.transfers: list[rooms_pb2.TransferRequest] = []
        self.opened: list[int] = []

    def OpenRoom(self, request: rooms_pb2.OpenRoomRequest, context: grpc.ServicerContext) -> rooms_pb2.OpenRoomResponse:
        self.opened.append(request.room)
        return rooms_pb2.OpenRoomResponse(room=rooms_pb2.Room(room=request.room, phase=common_pb2.ROOM_PHASE_ADMITTED))

    def WatchRoom(self, request: rooms_pb2.WatchRoomRequest, context: grpc.ServicerContext) -> Iterator[rooms_pb2.RoomEvent]:
        room = rooms_pb2.Room(room=request.room, phase=common_pb2.ROOM_PHASE_ADMITTED)
        t = common_pb2.Transition(phase=common_pb2.ROOM_PHASE_ADMITTED)
        t.at.FromNanoseconds(1)
        yield rooms_pb2.RoomEvent(room=room, transition=t, incarnation=INCARNATION)
        self.landed.wait(WAIT)
        room.phase = common_pb2.ROOM_PHASE_SUCCEEDED
        t = common_pb2.Transition(phase=common_pb2.ROOM_PHASE_SUCCEEDED)
        t.at.FromNanoseconds(2)
        yield rooms_pb2.RoomEvent(room=room, transition=t, incarnation=INCARNATION)

    def AwaitDestination(self, request: rooms_pb2.AwaitDestinationRequest,
                         context: grpc.ServicerContext) -> Iterator[rooms_pb2.DestinationEvent]:
        yield rooms_pb2.DestinationEvent(destination=rooms_pb2.Destination(
            room=request.room, page_indices=[4], page_size=64, fill_len=10, attempt=1, incarnation=INCARNATION))
        self.landed.wait(WAIT)
        yield rooms_pb2.DestinationEvent(done=rooms_pb2.RoomDone(poll=common_pb2.KV_POLL_SUCCESS,
                                                                 phase=common_pb2.ROOM_PHASE_SUCCEEDED))

    def Transfer(self, request: rooms_pb2.TransferRequest, context: grpc.ServicerContext) -> rooms_pb2.TransferResponse:
        self.transfers.append(request)
        if request.last:
            self.landed.set()
        return rooms_pb2.TransferResponse(poll=common_pb2.KV_POLL_SUCCESS)


class UnimplementedFallbackTest(unittest.TestCase):
    def setUp(self) -> None:
        self.rooms = OldRooms()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        rooms_pb2_grpc.add_RoomsServicer_to_server(self.rooms, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.addCleanup(self.server.stop, None)
        self.client = decodeplane.Client(f"127.0.0.1:{port}", timeout=WAIT)
        self.addCleanup(self.client.close)

    def test_open_and_wait_and_send_room(self) -> None:
        p = self.client.prefill(bootstrap_pb2.RegisterPrefillRequest(
            bootstrap_addr="10.0.0.1:8998", parallel=bootstrap_pb2.ParallelInfo(attn_tp_size=1, pp_size=1)))
        send = Background(lambda: p.send_room(7, output_ids=[11], timeout=WAIT))
        room = self.client.engine.open_and_wait(rid="r", room=7, bootstrap_addr="10.0.0.1:8998", prompt_len=10,
                                                max_new_tokens=1, timeout=WAIT)
        self.assertEqual((room.room, room.phase), (7, common_pb2.ROOM_PHASE_SUCCEEDED))
        dest = send.outcome()
        self.assertEqual(dest.incarnation, INCARNATION)
        self.assertEqual(self.rooms.opened, [7])
        self.assertEqual([(t.room, t.last, t.aux.room_marker, list(t.aux.output_ids), t.incarnation)
                          for t in self.rooms.transfers], [(7, True, 7, [11], INCARNATION)])
        # The unary path holds for a minute before the session is tried again.
        self.assertGreater(self.client.engine._mux.unary_until, time.monotonic() + 50)


if __name__ == "__main__":
    unittest.main()
