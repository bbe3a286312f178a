"""Retry policy and the per-RPC retry classes (the Go client's ``retry.go``).

Only two answers are ever retried: UNAVAILABLE, and RESOURCE_EXHAUSTED
carrying a ``google.rpc.RetryInfo`` (the daemon's admission queue is full).
The wait honours the daemon's RetryInfo delay when it gives one, else it
backs off exponentially with jitter. INVALID_ARGUMENT, FAILED_PRECONDITION,
NOT_FOUND, ALREADY_EXISTS and every other code are never retried.

Which RPCs may be retried is fixed per RPC, in :data:`RETRY_TABLE`, from the
contract in each RPC's proto comment:

* retried: reads, and writes the daemon deduplicates (GetStatus, GetFleet,
  RegisterPrefill, Heartbeat, DeregisterPrefill, BindRoom, LookupDPRanks, GetRoom, ListRooms,
  AbortRoom, ReleaseRoom, AckRoomEnd, DeclareDestination, RegisterEngineLayout,
  ReportCapacity,
  Transfer and ReportTransfer — (room, rank, chunk_index) is the daemon's
  idempotency key —, the Staging RPCs);
  the streams AwaitDestination, WatchRoom and WatchWatermark are re-opened
  when they break;
* OpenRoom: only when the request carries an ``idempotency_key``;
* never: Drain, ReportRunning, RetractRoom, ContinueGeneration, Resync, the
  two sessions (the client's shared sessions re-open themselves, see
  :mod:`decodeplane.engine` and :mod:`decodeplane.prefill`) and
  WatchCapacity (its end is how a router learns the daemon is gone).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any, Optional

import grpc

from decodeplane.errors import DecodeplaneError
from decodeplane.v1 import (
    admin_pb2,
    bootstrap_pb2,
    capacity_pb2,
    engine_session_pb2,
    fleet_pb2,
    prefill_session_pb2,
    rooms_pb2,
    staging_pb2,
)

__all__ = ["RetryPolicy", "RetryClass", "RETRY_TABLE", "all_methods", "retryable"]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds automatic retries.

    Attributes:
        max_attempts: every attempt of one call, the first included (1 turns
            retries off). For streams and sessions it counts consecutive
            failed (re-)opens: a stream that delivered something new starts
            afresh.
        initial_backoff: seconds before the second attempt when the daemon
            gave no RetryInfo. It doubles after each attempt, with jitter
            (each wait is drawn from ``[b/2, b]``).
        max_backoff: cap of the doubling, in seconds. A RetryInfo delay from
            the daemon is honoured as given, even above it.
    """

    max_attempts: int = 4
    initial_backoff: float = 0.05
    max_backoff: float = 1.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts {self.max_attempts} must be >= 1")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"RetryPolicy backoffs must not be negative (initial {self.initial_backoff}, max {self.max_backoff})")
        if self.max_backoff < self.initial_backoff:
            raise ValueError(f"RetryPolicy.max_backoff {self.max_backoff} is below initial_backoff {self.initial_backoff}")

    def backoff(self, n: int) -> float:
        """The jittered wait in seconds after the n-th failed attempt (n >= 1)."""
        b = self.initial_backoff
        for _ in range(1, n):
            if b >= self.max_backoff:
                break
            b *= 2
        b = min(b, self.max_backoff)
        return random.uniform(b / 2, b) if b > 0 else 0.0

    def retry_delay(self, err: DecodeplaneError, attempt: int) -> Optional[float]:
        """How long to wait before retrying after ``err`` (the ``attempt``-th
        failure), or None when ``err`` is not retried: UNAVAILABLE (the
        RetryInfo delay when given, else the backoff) and RESOURCE_EXHAUSTED
        only with a RetryInfo (without one it is the gRPC stack refusing,
        e.g. a message too large)."""
        code = err.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return err.retry_after if err.retry_after is not None else self.backoff(attempt)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.retry_after is not None:
            return err.retry_after
        return None


class RetryClass(enum.Enum):
    """When an RPC may be sent again automatically."""

    NEVER = "never"
    """Not idempotent, or a blind repeat could do harm: the caller decides."""
    SAFE = "safe"
    """Reads, and writes the daemon deduplicates."""
    IF_KEYED = "if_keyed"
    """Safe only when the request carries an idempotency key."""


def _m(module: Any, service: str, method: str) -> str:
    svc = module.DESCRIPTOR.services_by_name[service]
    return f"/{svc.full_name}/{svc.methods_by_name[method].name}"


def all_methods() -> list[str]:
    """The full method name ("/decodeplane.v1.Rooms/OpenRoom") of every RPC of
    every service in decodeplane.v1."""
    out = []
    for mod in (admin_pb2, bootstrap_pb2, capacity_pb2, engine_session_pb2, fleet_pb2, prefill_session_pb2,
                rooms_pb2, staging_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for method in svc.methods:
                out.append(f"/{svc.full_name}/{method.name}")
    return sorted(out)


_S, _N, _K = RetryClass.SAFE, RetryClass.NEVER, RetryClass.IF_KEYED

#: The retry class of every RPC of decodeplane.v1 (the Go client's retryTable,
#: plus Staging from staging.proto's "Safe to retry"). An RPC missing here is
#: never retried; a test fails until every RPC is classified.
RETRY_TABLE: dict[str, RetryClass] = {
    # Admin. Drain is idempotent on the daemon, but stopping admission is an
    # operator's decision: a repeat is left to the operator.
    _m(admin_pb2, "Admin", "GetStatus"): _S,
    _m(admin_pb2, "Admin", "Drain"): _N,
    # Bootstrap: registration is idempotent per rank; heartbeats and bindings
    # overwrite; lookups read.
    _m(bootstrap_pb2, "Bootstrap", "RegisterPrefill"): _S,
    _m(bootstrap_pb2, "Bootstrap", "Heartbeat"): _S,
    # A second deregistration finds nothing to remove (deregistered false).
    _m(bootstrap_pb2, "Bootstrap", "DeregisterPrefill"): _S,
    _m(bootstrap_pb2, "Bootstrap", "BindRoom"): _S,
    _m(bootstrap_pb2, "Bootstrap", "LookupDPRanks"): _S,
    # Rooms. OpenRoom: a repeat without a key would see ALREADY_EXISTS for a
    # room the first attempt opened; with a key the daemon answers existing.
    _m(rooms_pb2, "Rooms", "OpenRoom"): _K,
    # Streams are re-opened; the daemon re-delivers the destination or the
    # room's timeline.
    _m(rooms_pb2, "Rooms", "AwaitDestination"): _S,
    _m(rooms_pb2, "Rooms", "WatchRoom"): _S,
    # (room, rank, chunk_index) is the daemon's idempotency key.
    _m(rooms_pb2, "Rooms", "Transfer"): _S,
    _m(rooms_pb2, "Rooms", "ReportTransfer"): _S,
    _m(rooms_pb2, "Rooms", "GetRoom"): _S,
    _m(rooms_pb2, "Rooms", "ListRooms"): _S,
    _m(rooms_pb2, "Rooms", "AbortRoom"): _S,
    _m(rooms_pb2, "Rooms", "AckRoomEnd"): _S,  # idempotent per rank and generation
    _m(rooms_pb2, "Rooms", "ReleaseRoom"): _S,
    # The same declaration again answers already; a refused one changed nothing.
    _m(rooms_pb2, "Rooms", "DeclareDestination"): _S,
    # The same layout again answers already; a different one is refused
    # while hand-offs hold pages, changing nothing.
    _m(rooms_pb2, "Rooms", "RegisterEngineLayout"): _S,
    # The engine re-reports absolute lengths on its own schedule; retracting
    # or resuming twice changes what happens; a repeated Resync sees
    # ALREADY_EXISTS for the rooms the first attempt adopted.
    _m(rooms_pb2, "Rooms", "ReportRunning"): _N,
    _m(rooms_pb2, "Rooms", "RetractRoom"): _N,
    _m(rooms_pb2, "Rooms", "ContinueGeneration"): _N,
    _m(rooms_pb2, "Rooms", "Resync"): _N,
    # Staging: "Safe to retry" (SetupStaging reads; (room, chunk_index, decode
    # rank) keys AllocateStaging, (room, chunk_index, rank) ChunkReady; each
    # WatchWatermark stream starts with the current state).
    _m(staging_pb2, "Staging", "SetupStaging"): _S,
    _m(staging_pb2, "Staging", "AllocateStaging"): _S,
    _m(staging_pb2, "Staging", "ChunkReady"): _S,
    _m(staging_pb2, "Staging", "WatchWatermark"): _S,
    # Fleet: a read of the daemon's cached view.
    _m(fleet_pb2, "Fleet", "GetFleet"): _S,
    # Capacity: safe to repeat, but not re-opened by the client: the end of
    # the stream is how a router learns that the daemon stopped.
    _m(capacity_pb2, "Capacity", "WatchCapacity"): _N,
    # Each report replaces the last.
    _m(capacity_pb2, "Capacity", "ReportCapacity"): _S,
    # Sessions: a session opened by hand is not re-opened; the client's
    # shared sessions open new ones and resume (engine) or claim again
    # (prefill).
    _m(engine_session_pb2, "EngineSession", "Session"): _N,
    _m(prefill_session_pb2, "PrefillSession", "Session"): _N,
}


def retryable(method: str, request: Any) -> bool:
    """Whether ``method`` may be retried for ``request``."""
    cls = RETRY_TABLE.get(method, RetryClass.NEVER)
    if cls is RetryClass.SAFE:
        return True
    if cls is RetryClass.IF_KEYED:
        return bool(getattr(request, "idempotency_key", ""))
    return False
