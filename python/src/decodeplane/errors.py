"""Typed errors of the decodeplane client.

Every error the client raises is a :class:`DecodeplaneError`, itself a
:class:`grpc.RpcError`: ``err.code()`` is the gRPC status code (a
:class:`grpc.StatusCode`), ``err.details()`` the daemon's message, so code
written against plain gRPC keeps working. Each status code has its family
(:class:`NotFoundError`, :class:`InvalidArgumentError`, ...), and the
daemon's ``google.rpc.ErrorInfo`` reasons have their own classes
(:class:`StaleIncarnationError`, :class:`StaleAttemptError`,
:class:`PageHeldError`). Catch the
class, never match the message text::

    try:
        room = client.engine.open_and_wait(rid="r1", room=7, ...)
    except decodeplane.RoomFailedError as e:
        log.warning("room %d failed: %s: %s", e.room, e.failure_code_name, e.message)
    except decodeplane.ResourceExhaustedError as e:
        retry_later(e.retry_after)
    except decodeplane.UnavailableError:
        ...  # draining or unreachable: use another decode instance

The status details come from the ``grpc-status-details-bin`` trailer (a
``google.rpc.Status``), decoded by the client itself: no ``grpcio-status``
or ``googleapis-common-protos`` is needed.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

import grpc

from decodeplane._vendor import rpc_status_pb2
from decodeplane.v1 import common_pb2

__all__ = [
    "DecodeplaneError",
    "NotFoundError",
    "AlreadyExistsError",
    "InvalidArgumentError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "UnavailableError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "AbortedError",
    "DeadlineExceededError",
    "CanceledError",
    "UnimplementedError",
    "InternalError",
    "StaleIncarnationError",
    "StaleAttemptError",
    "PageHeldError",
    "IncarnationChangedError",
    "RoomFailedError",
    "ERROR_DOMAIN",
    "REASON_STALE_INCARNATION",
    "REASON_STALE_ATTEMPT",
    "REASON_PAGE_HELD",
]

#: The ErrorInfo domain of decodeplane's error details.
ERROR_DOMAIN = "decodeplane.v1"
#: ErrorInfo reason of a request naming an earlier daemon incarnation.
REASON_STALE_INCARNATION = "STALE_INCARNATION"
#: ErrorInfo reason of an AckRoomEnd naming an attempt that is not the room's current one.
REASON_STALE_ATTEMPT = "STALE_ATTEMPT"
#: ErrorInfo reason of a DeclareDestination naming a page, row or slot another room's hand-off still holds.
REASON_PAGE_HELD = "PAGE_HELD"

_STATUS_DETAILS_KEY = "grpc-status-details-bin"
_ERROR_INFO_TYPE = "google.rpc.ErrorInfo"
_RETRY_INFO_TYPE = "google.rpc.RetryInfo"

# A field path: "prompt_len", "rank.bootstrap_addr", "open.rooms[3].prompt_len".
_FIELD_RE = re.compile(r"[a-z][a-z0-9_]*(?:\[\d+\])?(?:\.[a-z][a-z0-9_]*(?:\[\d+\])?)*")


def _line_field(line: str) -> str:
    """The field a line of an INVALID_ARGUMENT message names: the daemon's
    "field: reason" at the start of the line, or a dotted or indexed path
    after a context ("resync (...): rooms[0].page_indices: ...")."""
    parts = line.split(": ")
    for i, part in enumerate(parts[:-1]):
        if _FIELD_RE.fullmatch(part) and (i == 0 or "." in part or "[" in part):
            return part
    return ""


class DecodeplaneError(grpc.RpcError):
    """An RPC failure, or a failure the client derived from one.

    Attributes:
        op: the RPC or helper that failed, e.g. ``"OpenRoom"``.
        message: the daemon's message (for INVALID_ARGUMENT it names the
            field; for FAILED_PRECONDITION and room failures it uses SGLang's
            wording where SGLang has one).
        reason, domain, error_metadata: the ``google.rpc.ErrorInfo`` of the
            status, when it has one (``reason`` ``""`` otherwise).
        retry_after: the ``google.rpc.RetryInfo`` delay in seconds, or None.
        cause: the error this one was derived from, if any (also ``__cause__``).
    """

    #: The status code of the family; instances may carry another code of
    #: the same family (OUT_OF_RANGE is an InvalidArgumentError).
    default_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        op: str = "",
        code: Optional[grpc.StatusCode] = None,
        reason: str = "",
        domain: str = "",
        error_metadata: Optional[Mapping[str, str]] = None,
        retry_after: Optional[float] = None,
        trailing_metadata: Sequence[tuple[str, Any]] = (),
        cause: Optional[BaseException] = None,
    ) -> None:
        self._code = code if code is not None else self.default_code
        self.op = op
        self.message = message
        self.reason = reason
        self.domain = domain
        self.error_metadata: dict[str, str] = dict(error_metadata or {})
        self.retry_after = retry_after
        self.cause = cause
        self._trailing = tuple(trailing_metadata)
        # True when the error is a stream's end seen by an op on it, not
        # the daemon's answer to that op (the client may send it again).
        self._stream_end = False
        super().__init__(self.__str__())
        if cause is not None:
            self.__cause__ = cause

    def code(self) -> grpc.StatusCode:
        """The gRPC status code."""
        return self._code

    def details(self) -> str:
        """The status message (as :meth:`grpc.Call.details`)."""
        return self.message

    def trailing_metadata(self) -> tuple[tuple[str, Any], ...]:
        """The call's trailing metadata, when the error came from a call."""
        return self._trailing

    def __str__(self) -> str:
        prefix = f"{self.op}: " if self.op else ""
        return f"{prefix}{self._code.name.lower().replace('_', ' ')}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self._code.name}, op={self.op!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickles with every attribute (an engine may hand errors between
        # processes): the default would rebuild from the message alone.
        state = dict(self.__dict__)
        state.pop("__cause__", None)
        return (_restore, (type(self), state))


def _restore(cls: type[DecodeplaneError], state: dict[str, Any]) -> DecodeplaneError:
    e = cls.__new__(cls)
    e.__dict__.update(state)
    Exception.__init__(e, str(e))
    return e


class NotFoundError(DecodeplaneError):
    """NOT_FOUND: the room or prefill rank is unknown (never opened, forgotten
    after its retention, or, for Heartbeat, declared dead: register again)."""

    default_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(DecodeplaneError):
    """ALREADY_EXISTS: the room is already open (under another idempotency key, or without one)."""

    default_code = grpc.StatusCode.ALREADY_EXISTS


class InvalidArgumentError(DecodeplaneError):
    """INVALID_ARGUMENT (and OUT_OF_RANGE): a request field is wrong.

    ``field`` is the field the message names first (``"prompt_len"``,
    ``"rank.bootstrap_addr"``, ``"open.rooms[0].prompt_len"``,
    ``"rooms[0].page_indices"``), ``fields`` every field named, one per line
    of the message; ``""`` / empty when the message names none (SGLang's
    "Request ... exceeds the maximum number of tokens").
    """

    default_code = grpc.StatusCode.INVALID_ARGUMENT

    @property
    def fields(self) -> list[str]:
        """Every field path the message names, in order."""
        return [f for f in (_line_field(line) for line in self.message.splitlines()) if f]

    @property
    def field(self) -> str:
        """The first field path the message names, or ``""``."""
        fs = self.fields
        return fs[0] if fs else ""


class FailedPreconditionError(DecodeplaneError):
    """FAILED_PRECONDITION: the call does not apply now (the room is not in the
    right phase; the prefill's layout cannot serve this decode side)."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(DecodeplaneError):
    """RESOURCE_EXHAUSTED: the daemon is out of room (admission queue full, a
    session's slow consumer cut). ``retry_after`` is the daemon's delay, if sent."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(DecodeplaneError):
    """UNAVAILABLE: the daemon is draining, unreachable, or its transfer agent is down."""

    default_code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(DecodeplaneError):
    """UNAUTHENTICATED: the daemon has a bootstrap token and the call did not carry it."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(DecodeplaneError):
    """PERMISSION_DENIED (a proxy in front of the daemon may return it)."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


class AbortedError(DecodeplaneError):
    """ABORTED: a chunk failed and the room is now failed (Transfer, ReportTransfer, ChunkReady)."""

    default_code = grpc.StatusCode.ABORTED


class DeadlineExceededError(DecodeplaneError):
    """DEADLINE_EXCEEDED: the call's timeout passed."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class CanceledError(DecodeplaneError):
    """CANCELLED: the call was cancelled, or the client (or the object) was closed."""

    default_code = grpc.StatusCode.CANCELLED


class UnimplementedError(DecodeplaneError):
    """UNIMPLEMENTED: the daemon does not serve this RPC (an older daemon)."""

    default_code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(DecodeplaneError):
    """INTERNAL, UNKNOWN, DATA_LOSS: a bug in the daemon or a corrupted answer."""

    default_code = grpc.StatusCode.INTERNAL


class IncarnationChangedError(DecodeplaneError):
    """The daemon restarted (its incarnation changed).

    For a prefill hand-off or claim: the destination it held belongs to an
    earlier incarnation and is void (its pages may already be another
    room's); nothing more is written or reported for it. Register again
    (:meth:`Prefill.run_heartbeat` does it) and claim again. For the decode
    side (``watch`` true: a room watch, :meth:`EngineAPI.wait_room`,
    :meth:`EngineAPI.open_and_wait`): the room was opened at incarnation
    ``old`` and is gone with it; open it again.

    Attributes:
        room: the room concerned (0: not about one room).
        old: the incarnation of the void destination, registration or room.
        new: the daemon's incarnation as the client learned it (0 if unknown).
        watch: the error ends a room watch on the decode side.
    """

    default_code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(
        self,
        message: str = "",
        *,
        room: int = 0,
        old: int = 0,
        new: int = 0,
        watch: bool = False,
        op: str = "",
        cause: Optional[BaseException] = None,
        **kw: Any,
    ) -> None:
        self.room = room
        self.old = old
        self.new = new
        self.watch = watch
        if not message:
            message = incarnation_message(room, old, new, watch)
        super().__init__(message, op=op, cause=cause, **kw)


def incarnation_message(room: int, old: int, new: int, watch: bool) -> str:
    """The text of an :class:`IncarnationChangedError` (as the Go client words it)."""
    if watch:
        return (f"room {room}: opened at decodeplane incarnation {old:x} (now {new:x}): "
                "the daemon restarted and the room is gone; open it again")
    if room == 0:
        return (f"decodeplane incarnation {old:x} (now {new:x}) is gone: the daemon restarted; "
                "register again and claim again")
    return (f"room {room}: destination of decodeplane incarnation {old:x} (now {new:x}) is void: "
            "the daemon restarted; register again and claim again")


class StaleIncarnationError(FailedPreconditionError, IncarnationChangedError):
    """The daemon refused a request naming an earlier incarnation
    (FAILED_PRECONDITION, ErrorInfo reason ``STALE_INCARNATION``).

    ``old`` is the incarnation the request named, ``new`` the daemon's own
    (from the ErrorInfo metadata ``incarnation`` and ``daemon_incarnation``,
    0 when absent). Nothing changed on the daemon.
    """

    default_code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str, **kw: Any) -> None:
        md = kw.get("error_metadata") or {}
        old = _hex(md.get("incarnation", ""))
        new = _hex(md.get("daemon_incarnation", ""))
        IncarnationChangedError.__init__(self, message, old=old, new=new, **kw)


class StaleAttemptError(FailedPreconditionError):
    """AckRoomEnd named an attempt that is not the room's current one
    (FAILED_PRECONDITION, ErrorInfo reason ``STALE_ATTEMPT``); nothing changed."""


class PageHeldError(FailedPreconditionError):
    """DeclareDestination named a page, metadata row or state slot that
    another room's hand-off still holds (FAILED_PRECONDITION, ErrorInfo
    reason ``PAGE_HELD``); nothing changed. The engine reused it too early:
    a prefill rank may still write into it until the holder's last event
    (``pages_reusable``).

    Attributes (from the ErrorInfo metadata; empty / -1 / 0 when absent):
        what: ``"page"``, ``"metadata slot"``, or the state type's slot.
        index: the page, row or slot.
        holder: the room that holds it.
        draining: the holder failed and waits for its prefill ranks'
            acknowledgements (AckRoomEnd) or release.deferred_timeout.
    """

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        md = self.error_metadata
        self.what = md.get("what", "")
        self.index = _int(md.get("index", ""), -1)
        self.holder = _int(md.get("holder", ""), 0)
        self.draining = md.get("draining", "") == "true"


def _int(s: str, default: int) -> int:
    try:
        return int(s)
    except ValueError:
        return default


class RoomFailedError(DecodeplaneError):
    """A room ended in ROOM_PHASE_FAILED (aborted, timed out, a chunk failed,
    the prefill was lost, ...), as a stream or a helper saw it.

    Its ``code()`` is ABORTED, or the code of the RPC that revealed the
    failure (``cause``: e.g. a Transfer answered ABORTED).

    Attributes:
        room: the bootstrap room.
        failure_code: the :class:`decodeplane.v1.common_pb2.FailureCode` value.
        message: the daemon's reason, in SGLang's wording where SGLang has one.
        from_another_rank: another prefill rank reported the failure.
        ack_required: the claim said this rank must acknowledge the room's
            end (AckRoomEnd) once it stopped writing; the hand-offs do it.
    """

    default_code = grpc.StatusCode.ABORTED

    def __init__(
        self,
        room: int,
        failure: Optional[common_pb2.Failure] = None,
        *,
        ack_required: bool = False,
        op: str = "",
        cause: Optional[BaseException] = None,
    ) -> None:
        self.room = room
        self.failure_code = int(failure.code) if failure is not None else 0
        self.from_another_rank = bool(failure.from_another_rank) if failure is not None else False
        self.ack_required = ack_required
        code = cause.code() if isinstance(cause, DecodeplaneError) else None
        super().__init__(failure.message if failure is not None else "", op=op, code=code, cause=cause)

    @property
    def failure_code_name(self) -> str:
        """The failure code's name, e.g. ``"FAILURE_CODE_ABORTED"``."""
        try:
            return common_pb2.FailureCode.Name(self.failure_code)
        except ValueError:
            return str(self.failure_code)

    def __str__(self) -> str:
        return f"room {self.room} failed ({self.failure_code_name}): {self.message}"


_FAMILY: dict[grpc.StatusCode, type[DecodeplaneError]] = {
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.ABORTED: AbortedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CanceledError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.UNKNOWN: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
}

_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}


def status_code(value: int) -> grpc.StatusCode:
    """The :class:`grpc.StatusCode` of a numeric ``google.rpc.Code``."""
    return _BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN)


def _hex(s: str) -> int:
    try:
        return int(s, 16)
    except ValueError:
        return 0


def make_error(
    op: str,
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str = "",
    domain: str = "",
    error_metadata: Optional[Mapping[str, str]] = None,
    retry_after: Optional[float] = None,
    trailing_metadata: Sequence[tuple[str, Any]] = (),
) -> DecodeplaneError:
    """The typed error for a status: its family's class, or the class of its
    ErrorInfo reason (STALE_INCARNATION, STALE_ATTEMPT, PAGE_HELD)."""
    if code == grpc.StatusCode.OK:
        code, message = grpc.StatusCode.UNKNOWN, message or "no error status"
    cls: type[DecodeplaneError] = _FAMILY.get(code, InternalError)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if reason == REASON_STALE_INCARNATION:
            cls = StaleIncarnationError
        elif reason == REASON_STALE_ATTEMPT:
            cls = StaleAttemptError
        elif reason == REASON_PAGE_HELD:
            cls = PageHeldError
    return cls(message, op=op, code=code, reason=reason, domain=domain, error_metadata=error_metadata,
               retry_after=retry_after, trailing_metadata=trailing_metadata)


def parse_status_details(raw: bytes) -> tuple[str, str, dict[str, str], Optional[float]]:
    """Decodes a ``grpc-status-details-bin`` trailer (a ``google.rpc.Status``):
    the ErrorInfo's reason, domain and metadata, and the RetryInfo delay in
    seconds (None without one). Details of other types are ignored."""
    st = rpc_status_pb2.Status.FromString(raw)
    reason, domain, md, retry = "", "", {}, None
    for any_ in st.details:
        name = any_.type_url.rsplit("/", 1)[-1]
        if name == _ERROR_INFO_TYPE:
            info = rpc_status_pb2.ErrorInfo.FromString(any_.value)
            reason, domain, md = info.reason, info.domain, dict(info.metadata)
        elif name == _RETRY_INFO_TYPE:
            ri = rpc_status_pb2.RetryInfo.FromString(any_.value)
            if ri.HasField("retry_delay"):
                retry = max(ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9, 0.0)
    return reason, domain, md, retry


def from_rpc_error(op: str, err: BaseException) -> DecodeplaneError:
    """The typed error for an exception raised by a gRPC call (a
    :class:`grpc.RpcError` that is also a :class:`grpc.Call`), with the
    status details of its trailer. A DecodeplaneError is returned as is."""
    if isinstance(err, DecodeplaneError):
        return err
    code_fn = getattr(err, "code", None)
    if not callable(code_fn):
        return InternalError(f"{type(err).__name__}: {err}", op=op, cause=err)
    code = code_fn() or grpc.StatusCode.UNKNOWN
    details_fn = getattr(err, "details", None)
    message = (details_fn() if callable(details_fn) else "") or ""
    trailing_fn = getattr(err, "trailing_metadata", None)
    trailing = tuple(trailing_fn() or ()) if callable(trailing_fn) else ()
    reason, domain, md, retry = "", "", {}, None
    for key, value in trailing:
        if key == _STATUS_DETAILS_KEY and isinstance(value, (bytes, bytearray)):
            try:
                reason, domain, md, retry = parse_status_details(bytes(value))
            except Exception:  # noqa: BLE001 - a corrupt trailer leaves the status as is
                pass
    e = make_error(op, code, message, reason=reason, domain=domain, error_metadata=md, retry_after=retry,
                   trailing_metadata=trailing)
    e.__cause__ = None
    return e


def local_error(op: str, code: grpc.StatusCode, message: str) -> DecodeplaneError:
    """An error the client raises itself, with the code the daemon would have used."""
    return make_error(op, code, message)


def with_op(op: str, err: DecodeplaneError) -> DecodeplaneError:
    """``err`` as raised by ``op``: the same class, code, message and details."""
    if err.op == op:
        return err
    return _copy(err, op=op)


def unprefix(err: DecodeplaneError, prefix: str) -> DecodeplaneError:
    """``err`` with a session op's field prefix (``"open.rooms[0]."``,
    ``"chunk."``) removed from each line of its message: as the unary RPC
    words it."""
    if prefix not in err.message:
        return err
    msg = "\n".join(line[len(prefix):] if line.startswith(prefix) else line for line in err.message.split("\n"))
    return _copy(err, message=msg)


def _copy(err: DecodeplaneError, *, op: Optional[str] = None, message: Optional[str] = None) -> DecodeplaneError:
    if isinstance(err, (RoomFailedError, IncarnationChangedError)) and not isinstance(err, StaleIncarnationError):
        return err
    e = make_error(op if op is not None else err.op, err.code(), message if message is not None else err.message,
                   reason=err.reason, domain=err.domain, error_metadata=err.error_metadata,
                   retry_after=err.retry_after, trailing_metadata=err.trailing_metadata())
    e._stream_end = err._stream_end
    return e
