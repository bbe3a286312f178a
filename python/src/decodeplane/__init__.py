"""decodeplane: the Python client of decodeplane, the decode-side control
plane for prefill/decode disaggregated LLM serving.

::

    import decodeplane

    with decodeplane.Client("127.0.0.1:7600", token=token) as client:
        room = client.engine.open_and_wait(rid="r1", bootstrap_addr="10.0.0.5:8998", room=7,
                                           prompt_len=1000, max_new_tokens=128)
        ...
        client.engine.release_room(7)

:class:`Client` owns one gRPC channel; its views are :attr:`Client.engine`
(the decode engine), :meth:`Client.prefill` (one prefill rank) and
:attr:`Client.admin` (operators); :class:`FleetPrefill` is a prefill rank of
a fleet of daemons, which hands each room off on the daemon that holds it
without being told which. Errors are typed (:mod:`decodeplane.errors`),
retries follow the Go client's rules (:mod:`decodeplane.retry`), and the
generated stubs are :mod:`decodeplane.v1` (``decodeplane.v1.rooms_pb2``, ...).
"""

from decodeplane.client import Client, TLSConfig, Transport
from decodeplane.errors import (
    AbortedError,
    AlreadyExistsError,
    CanceledError,
    DeadlineExceededError,
    DecodeplaneError,
    FailedPreconditionError,
    IncarnationChangedError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PageHeldError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RoomFailedError,
    StaleAttemptError,
    StaleIncarnationError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)
from decodeplane.retry import RetryPolicy
from decodeplane.admin import AdminAPI
from decodeplane.engine import (
    ENGINE_EVENTS_ALL,
    ENGINE_EVENTS_OUTCOME,
    EngineAPI,
    EngineSession,
    RoomSubscription,
    SessionResult,
    in_flight,
)
from decodeplane.prefill import Chunk, HeartbeatRunner, Prefill, PrefillSession, SessionClaim
from decodeplane.fleet import FleetDaemonState, FleetOffer, FleetPrefill
from decodeplane.streams import CapacityStream, ClaimEvent, DestinationStream, RoomWatch, WatermarkStream

__version__ = "0.1.0"

__all__ = [
    "Client", "TLSConfig", "Transport", "RetryPolicy",
    "AdminAPI", "EngineAPI", "EngineSession", "RoomSubscription", "SessionResult", "ENGINE_EVENTS_ALL",
    "ENGINE_EVENTS_OUTCOME", "in_flight", "Prefill", "PrefillSession", "SessionClaim", "Chunk", "HeartbeatRunner",
    "FleetPrefill", "FleetDaemonState", "FleetOffer",
    "ClaimEvent", "DestinationStream", "RoomWatch", "CapacityStream", "WatermarkStream",
    "DecodeplaneError", "NotFoundError", "AlreadyExistsError", "InvalidArgumentError", "FailedPreconditionError",
    "ResourceExhaustedError", "UnavailableError", "UnauthenticatedError", "PermissionDeniedError", "AbortedError",
    "DeadlineExceededError", "CanceledError", "UnimplementedError", "InternalError", "StaleIncarnationError",
    "StaleAttemptError", "PageHeldError", "IncarnationChangedError", "RoomFailedError",
]
