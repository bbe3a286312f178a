"""The decodeplane client: one :class:`Client` per daemon, owning one gRPC
channel, with role views for the decode engine (:attr:`Client.engine`), a
prefill rank (:meth:`Client.prefill`) and operators (:attr:`Client.admin`).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import grpc

from decodeplane._core import PACK_KEY, PACK_MORE, Deadline, op_name, wait_retry
from decodeplane.errors import from_rpc_error, local_error
from decodeplane.retry import RetryPolicy, retryable
from decodeplane.v1 import (
    admin_pb2_grpc,
    bootstrap_pb2,
    bootstrap_pb2_grpc,
    capacity_pb2_grpc,
    engine_session_pb2_grpc,
    fleet_pb2_grpc,
    prefill_session_pb2_grpc,
    rooms_pb2_grpc,
    staging_pb2_grpc,
)

__all__ = ["Client", "TLSConfig", "Transport", "KEEPALIVE_TIME", "KEEPALIVE_TIMEOUT"]

R = TypeVar("R")

#: The connection pings a daemon silent for this many seconds while calls
#: or streams are open (as the Go client), and drops the connection
#: :data:`KEEPALIVE_TIMEOUT` seconds after an unanswered ping: a daemon gone
#: without closing the connection fails the calls with UNAVAILABLE instead
#: of leaving them hanging until TCP gives up. The daemon accepts pings
#: every 5 s or more.
KEEPALIVE_TIME = 30.0
KEEPALIVE_TIMEOUT = 10.0


class Transport(enum.Enum):
    """How a client carries a room's hand-off: :meth:`EngineAPI.open_and_wait`
    on the decode side, :meth:`Prefill.send_room` and :meth:`Prefill.report_room`
    on the prefill side. Every other method is a unary RPC (or a server
    stream) whatever the transport; both drive the daemon's one state machine."""

    STREAMS = "streams"
    """The default: the rooms ride long-lived multiplexed streams
    (EngineSession.Session for the engine, PrefillSession.Session for a
    prefill rank, which is also the rank's heartbeat)."""
    UNARY = "unary"
    """One RPC per step: OpenRoom then WatchRoom; AwaitDestination, Transfer
    or ReportTransfer per chunk, AckRoomEnd. For peers that cannot hold a
    stream open, and for comparison."""


@dataclass(frozen=True)
class TLSConfig:
    """TLS for the channel.

    Attributes:
        ca: PEM CA bundle (a path, or the bytes) that signs the daemon's
            certificate; None uses the system roots.
        cert, key: PEM client certificate (chain) and its private key (paths
            or bytes), for mutual TLS (``server.tls.client_ca_file``).
        server_name: the name to verify in the daemon's certificate, instead
            of the target's host.
    """

    ca: Union[str, bytes, None] = None
    cert: Union[str, bytes, None] = None
    key: Union[str, bytes, None] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials (reads the files now)."""
        if (self.cert is None) != (self.key is None):
            raise ValueError("TLSConfig: cert and key go together (mutual TLS)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca), private_key=_read(self.key), certificate_chain=_read(self.cert))


def _read(v: Union[str, bytes, None]) -> Optional[bytes]:
    if v is None or isinstance(v, bytes):
        return v
    with open(v, "rb") as f:
        return f.read()


class Client:
    """A client of one decodeplane daemon.

    ``target`` is a gRPC target: ``"127.0.0.1:7600"``,
    ``"dns:///decodeplane:7600"``, ``"unix:///run/decodeplane.sock"``.
    Building the client does not connect: the first call does, and a daemon
    that cannot be reached is :class:`~decodeplane.UnavailableError` there.

    Args:
        tls: TLS for the channel (default: plaintext, which suits a daemon on
            loopback or behind a local proxy).
        token: the daemon's bootstrap token
            (SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN), sent as
            ``authorization: Bearer <token>`` with every call; mutating calls
            need it when the daemon has one. It is sent on a plaintext channel
            too (in clear text), so that a daemon on loopback can require it.
        retry: the retry policy (:class:`RetryPolicy`; which RPCs are retried
            and on which codes is fixed, see :mod:`decodeplane.retry`).
        timeout: the default bound, in seconds, of each unary call (its
            retries included) when the method is given none; None: unbounded.
            Streams, sessions and the waiting helpers take their own timeout
            (None: as long as the daemon's own timeouts let the room live).
        transport: :class:`Transport` (default STREAMS).
        auto_idempotency_key: give every OpenRoom without an idempotency key a
            random one (kept across that call's retries), so that OpenRoom is
            retried on UNAVAILABLE like the other RPCs.
        options: extra gRPC channel options, applied after the client's own
            (keepalive: :data:`KEEPALIVE_TIME`, :data:`KEEPALIVE_TIMEOUT`).

    A client is safe for use from any number of threads; build one per
    daemon and share it, and :meth:`close` it when done (or use it as a
    context manager). Nothing needs asyncio: the sessions run one reader
    thread each, and their ops return values or
    :class:`concurrent.futures.Future`.
    """

    def __init__(
        self,
        target: str,
        *,
        tls: Optional[TLSConfig] = None,
        token: Optional[str] = None,
        retry: Optional[RetryPolicy] = None,
        timeout: Optional[float] = None,
        transport: Transport = Transport.STREAMS,
        auto_idempotency_key: bool = False,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if token is not None and (token == "" or any(c in token for c in " \t\r\n")):
            raise ValueError("Client: token must be non-empty and without whitespace")
        if not isinstance(transport, Transport):
            raise ValueError(f"Client: transport {transport!r} is not a Transport")
        self.target = target
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        self._transport = transport
        self._auto_key = auto_idempotency_key
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        opts: list[tuple[str, Any]] = [
            ("grpc.keepalive_time_ms", int(KEEPALIVE_TIME * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT * 1000)),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if tls is not None and tls.server_name:
            opts.append(("grpc.ssl_target_name_override", tls.server_name))
        opts.extend(options)
        if tls is not None:
            self._channel = grpc.secure_channel(target, tls.credentials(), options=opts)
        else:
            self._channel = grpc.insecure_channel(target, options=opts)
        self._md: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._admin_stub = admin_pb2_grpc.AdminStub(self._channel)
        self._boot_stub = bootstrap_pb2_grpc.BootstrapStub(self._channel)
        self._rooms_stub = rooms_pb2_grpc.RoomsStub(self._channel)
        self._fleet_stub = fleet_pb2_grpc.FleetStub(self._channel)
        self._capacity_stub = capacity_pb2_grpc.CapacityStub(self._channel)
        self._staging_stub = staging_pb2_grpc.StagingStub(self._channel)
        self._engine_session_stub = engine_session_pb2_grpc.EngineSessionStub(self._channel)
        self._prefill_session_stub = prefill_session_pb2_grpc.PrefillSessionStub(self._channel)
        self._closers: list[Callable[[], None]] = []
        # Imported here: the views import this module.
        from decodeplane.admin import AdminAPI
        from decodeplane.engine import EngineAPI

        self._engine = EngineAPI(self)
        self._admin = AdminAPI(self)

    # ---- views ----

    @property
    def engine(self) -> "EngineAPI":  # noqa: F821 - imported lazily
        """The decode engine's view: rooms, the engine session, open_and_wait."""
        return self._engine

    @property
    def admin(self) -> "AdminAPI":  # noqa: F821
        """The operator's view: status, drain, rooms, fleet, capacity."""
        return self._admin

    def prefill(self, registration: Optional[bootstrap_pb2.RegisterPrefillRequest] = None, *,
                heartbeat_every: Optional[float] = None,
                on_heartbeat_error: Optional[Callable[[BaseException], None]] = None,
                on_incarnation_change: Optional[Callable[[int, int], None]] = None,
                **fields: Any) -> "Prefill":  # noqa: F821
        """The prefill side of one rank, described by its registration (a
        ``RegisterPrefillRequest``, or its fields as keywords). See
        :class:`decodeplane.prefill.Prefill`."""
        from decodeplane.prefill import Prefill

        reg = build(bootstrap_pb2.RegisterPrefillRequest, registration, fields)
        return Prefill(self, reg, heartbeat_every=heartbeat_every, on_heartbeat_error=on_heartbeat_error,
                       on_incarnation_change=on_incarnation_change)

    @property
    def channel(self) -> grpc.Channel:
        """The gRPC channel, for services this package does not wrap (the
        standard health service). Calls made on it directly need
        :attr:`call_metadata` for the token."""
        return self._channel

    @property
    def call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call carries (the bearer token, if any)."""
        return self._md

    @property
    def retry_policy(self) -> RetryPolicy:
        return self._retry

    @property
    def transport(self) -> Transport:
        return self._transport

    # ---- lifecycle ----

    def close(self) -> None:
        """Ends the shared sessions (waiting calls end with CanceledError) and
        closes the channel; later calls fail with CanceledError. Idempotent."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            closers = list(self._closers)
        for c in reversed(closers):
            try:
                c()
            except Exception:  # noqa: BLE001 - closing goes on
                pass
        self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _on_close(self, fn: Callable[[], None]) -> None:
        with self._close_lock:
            self._closers.append(fn)

    def _check_open(self, op: str) -> None:
        if self._closed.is_set():
            raise local_error(op, grpc.StatusCode.CANCELLED, "the client is closed")

    def _metadata(self, pack: bool = False) -> tuple[tuple[str, str], ...]:
        return self._md + ((PACK_KEY, PACK_MORE),) if pack else self._md

    # ---- calls ----

    def _deadline(self, timeout: Optional[float]) -> Deadline:
        return Deadline(timeout if timeout is not None else self._timeout)

    def _invoke(self, method: str, call: Callable[..., R], request: Any, timeout: Optional[float] = None,
                deadline: Optional[Deadline] = None) -> R:
        """Runs one unary RPC under the retry policy: its answer, or a
        typed error."""
        op = op_name(method)
        self._check_open(op)
        dl = deadline if deadline is not None else self._deadline(timeout)
        again = retryable(method, request)
        attempt = 1
        while True:
            try:
                return call(request, metadata=self._md, timeout=dl.remaining())
            except grpc.RpcError as rpc_err:
                err = from_rpc_error(op, rpc_err)
            if self._closed.is_set():
                raise local_error(op, grpc.StatusCode.CANCELLED, "the client is closed") from err
            if not again or attempt >= self._retry.max_attempts:
                raise err
            d = self._retry.retry_delay(err, attempt)
            if d is None:
                raise err
            wait_retry(op, d, err, dl, self._closed)
            attempt += 1


def build(cls: type[R], request: Optional[R], fields: dict[str, Any]) -> R:
    """A request: ``request`` as given (not modified), or one made from the
    keyword fields; not both."""
    if request is not None:
        if fields:
            raise TypeError(f"give a {cls.__name__} or its fields as keywords, not both")
        if not isinstance(request, cls):
            raise TypeError(f"expected a {cls.__name__}, got {type(request).__name__}")
        return request
    return cls(**fields)


def copy_of(msg: R) -> R:
    """A deep copy of a protobuf message."""
    out = type(msg)()
    out.CopyFrom(msg)  # type: ignore[attr-defined]
    return out

