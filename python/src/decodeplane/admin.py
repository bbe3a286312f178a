"""The operator's view of a daemon (:attr:`decodeplane.Client.admin`):
Admin (GetStatus, Drain), the room reads (GetRoom, ListRooms), Fleet
(GetFleet) and Capacity (WatchCapacity)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Optional

import grpc
from google.protobuf import duration_pb2

from decodeplane.client import build
from decodeplane.errors import from_rpc_error
from decodeplane.streams import CapacityStream
from decodeplane.v1 import admin_pb2, capacity_pb2, common_pb2, fleet_pb2, rooms_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["AdminAPI", "RoomReads"]

_GET_STATUS = "/decodeplane.v1.Admin/GetStatus"
_DRAIN = "/decodeplane.v1.Admin/Drain"
_GET_FLEET = "/decodeplane.v1.Fleet/GetFleet"
_GET_ROOM = "/decodeplane.v1.Rooms/GetRoom"
_LIST_ROOMS = "/decodeplane.v1.Rooms/ListRooms"
_WATCH_CAPACITY = "/decodeplane.v1.Capacity/WatchCapacity"


def duration(seconds: float) -> duration_pb2.Duration:
    """A Duration of ``seconds``."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


class RoomReads:
    """GetRoom and ListRooms, shared by the engine's and the operator's views."""

    _c: "Client"

    def get_room(self, room: int, *, include_pages: bool = False, timeout: Optional[float] = None) -> rooms_pb2.Room:
        """A room's state and timeline (and its pages with ``include_pages``).
        NotFoundError for an unknown room. Retried on UNAVAILABLE."""
        req = rooms_pb2.GetRoomRequest(room=room, include_pages=include_pages)
        return self._c._invoke(_GET_ROOM, self._c._rooms_stub.GetRoom, req, timeout)

    def list_rooms(self, request: Optional[rooms_pb2.ListRoomsRequest] = None, *, timeout: Optional[float] = None,
                   phases: Iterable["common_pb2.RoomPhase.ValueType"] = (), **fields: Any) -> rooms_pb2.ListRoomsResponse:
        """Live and recently finished rooms, filtered (a ListRoomsRequest, or
        its fields as keywords: ``phases``, ``bootstrap_addr``, ``limit``,
        ``live_only``, ``newest_first``). Retried on UNAVAILABLE."""
        if request is None:
            fields = dict(fields, phases=list(phases))
        req = build(rooms_pb2.ListRoomsRequest, request, fields)
        return self._c._invoke(_LIST_ROOMS, self._c._rooms_stub.ListRooms, req, timeout)


class AdminAPI(RoomReads):
    """The operator's calls. Get it from :attr:`decodeplane.Client.admin`."""

    def __init__(self, client: "Client") -> None:
        self._c = client

    def status(self, *, timeout: Optional[float] = None) -> admin_pb2.GetStatusResponse:
        """The daemon's version, readiness, incarnation, effective
        configuration and a summary of rooms, shards and prefills.
        Retried on UNAVAILABLE."""
        return self._c._invoke(_GET_STATUS, self._c._admin_stub.GetStatus, admin_pb2.GetStatusRequest(), timeout)

    def drain(self, *, timeout: Optional[float] = None) -> admin_pb2.DrainResponse:
        """Stops the daemon admitting rooms (OpenRoom then fails with
        UnavailableError) and flips its health to NOT_SERVING; rooms in
        flight finish. Idempotent on the daemon, but never retried
        automatically. Needs the token when the daemon has one."""
        return self._c._invoke(_DRAIN, self._c._admin_stub.Drain, admin_pb2.DrainRequest(), timeout)

    def get_fleet(self, *, timeout: Optional[float] = None) -> fleet_pb2.GetFleetResponse:
        """Every decode daemon and prefill instance of the daemon's registry
        (with the memory registry: the daemon itself and the prefills
        registered with it). Needs the token when the daemon has one.
        Retried on UNAVAILABLE."""
        return self._c._invoke(_GET_FLEET, self._c._fleet_stub.GetFleet, fleet_pb2.GetFleetRequest(), timeout)

    def watch_capacity(self, *, min_interval: Optional[float] = None, keepalive: Optional[float] = None,
                       timeout: Optional[float] = None) -> CapacityStream:
        """The daemon's capacity per decode DP shard: the current figures at
        once, then an update when a figure changed (at most one per
        ``min_interval`` seconds) and at least one per ``keepalive`` seconds.
        None keeps the daemon's defaults (0.1 s, 10 s); the daemon refuses
        values outside 0.01..60 s and 1..600 s with InvalidArgumentError
        naming the field. Not re-opened when it ends (see CapacityStream).
        Needs the token when the daemon has one. ``timeout`` bounds the whole
        stream."""
        op = "WatchCapacity"
        self._c._check_open(op)
        req = capacity_pb2.WatchCapacityRequest()
        if min_interval:
            req.min_interval.CopyFrom(duration(min_interval))
        if keepalive:
            req.keepalive_interval.CopyFrom(duration(keepalive))
        try:
            call = self._c._capacity_stub.WatchCapacity(req, metadata=self._c._metadata(), timeout=timeout)
        except grpc.RpcError as e:  # pragma: no cover - the call starts lazily
            raise from_rpc_error(op, e) from None
        return CapacityStream(call, op)

