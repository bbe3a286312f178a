"""The server streams: a prefill rank's claim (AwaitDestination), a room's
watch (WatchRoom), a router's capacity stream (WatchCapacity) and the
staging watermark (WatchWatermark).

Each is read from one thread (iterate it, or call :meth:`next`) and may be
closed from any thread; each is a context manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import grpc

from decodeplane._core import Resumable
from decodeplane.errors import (
    DecodeplaneError,
    IncarnationChangedError,
    NotFoundError,
    RoomFailedError,
    StaleIncarnationError,
    local_error,
)
from decodeplane.v1 import capacity_pb2, rooms_pb2, staging_pb2

if TYPE_CHECKING:
    from decodeplane.client import Client

__all__ = ["ClaimEvent", "DestinationStream", "RoomWatch", "CapacityStream", "WatermarkStream"]


@dataclass(frozen=True)
class ClaimEvent:
    """One event of a claim: the destination, or the room's successful end.
    Exactly one field is set; the room's failure is raised as a
    :class:`~decodeplane.RoomFailedError`.

    A dummy destination (``destination.dummy``, MLA's extra prefill ranks)
    has no pages: the rank sends nothing and waits for the end.
    """

    destination: Optional[rooms_pb2.Destination] = None
    done: Optional[rooms_pb2.RoomDone] = None


class _Stream:
    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class DestinationStream(_Stream):
    """An AwaitDestination stream (:meth:`decodeplane.prefill.Prefill.await_destination`).

    :meth:`next` returns the destination, then the room's end
    (``ClaimEvent.done``); the room's failure is a RoomFailedError
    (``ack_required`` as the daemon said). A stream cut by the network is
    re-opened under the retry policy: the daemon re-delivers the
    destination, which is not returned twice.

    The stream is bound to one daemon incarnation: the request's, else the
    first destination's. A destination of another one (the daemon restarted
    and the re-opened stream reached the new process), or the daemon's
    STALE_INCARNATION refusal, ends it with an IncarnationChangedError.
    """

    def __init__(self, stream: Resumable[rooms_pb2.DestinationEvent], room: int, incarnation: int) -> None:
        self._s = stream
        self.room = room
        self.incarnation = incarnation
        self._seen = False
        self._attempt = 0

    def next(self) -> Optional[ClaimEvent]:
        """The next event; None after the room's end was returned (or the
        stream was closed normally)."""
        s = self._s
        while True:
            try:
                ev = s.recv()
            except StopIteration:
                return None
            except StaleIncarnationError as e:
                old = self.incarnation or e.old
                raise s.replace_err(IncarnationChangedError(room=self.room, old=old, new=e.new, op=e.op, cause=e))
            which = ev.WhichOneof("event")
            if which == "destination":
                dst = ev.destination
                inc = dst.incarnation
                if inc:
                    if not self.incarnation:
                        self.incarnation = inc
                    elif inc != self.incarnation:
                        raise s.end(IncarnationChangedError(room=self.room, old=self.incarnation, new=inc, op=s.op))
                if self._seen and dst.attempt == self._attempt:
                    continue  # re-delivered after a re-open
                self._seen, self._attempt = True, dst.attempt
                s.progressed()
                return ClaimEvent(destination=dst)
            if which == "done":
                s.end(StopIteration())
                return ClaimEvent(done=ev.done)
            if which == "failure":
                raise s.end(RoomFailedError(self.room, ev.failure, ack_required=ev.ack_required, op=s.op))
            # An event this client does not know (a newer daemon): skipped.

    def __iter__(self) -> Iterator[ClaimEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        """Ends the stream. The daemon keeps a claim whose destination was
        delivered; closing before that withdraws it."""
        self._s.close()


def _ts(t: object) -> tuple[int, int]:
    return (t.seconds, t.nanos)  # type: ignore[attr-defined]


class RoomWatch(_Stream):
    """A WatchRoom stream (:meth:`decodeplane.engine.EngineAPI.watch_room`).

    :meth:`next` returns the room's events in order: the terminal one has
    ``terminal`` set (a failure is an event here, with ``room.failure``);
    the last has ``pages_reusable`` set — the terminal event itself, or, for
    a room that failed while a prefill rank could still write into its
    pages, one more event (the phase unchanged) once they are reusable (an
    engine that owns its pages reuses a failed room's pages only then);
    after it :meth:`next` returns None. A broken stream is re-opened (asking
    for the whole history) and transitions already returned are skipped.
    Read the phase from ``event.transition``: replayed events carry the
    room's current state in ``event.room``.

    The watch is bound to the daemon incarnation of its first event: when
    the daemon restarted (a re-opened watch gets an event of another
    incarnation, or the room is not found and GetStatus gives another
    incarnation), the room died with the old process and :meth:`next`
    raises IncarnationChangedError (``watch`` true), not the new daemon's
    NOT_FOUND.
    """

    def __init__(self, client: "Client", stream: Resumable[rooms_pb2.RoomEvent], room: int, timeout: Optional[float]) -> None:
        self._c = client
        self._s = stream
        self.room = room
        self.incarnation = 0
        self._timeout = timeout
        self._last: Optional[tuple[int, int]] = None
        self._at_last: list[bytes] = []

    def next(self) -> Optional[rooms_pb2.RoomEvent]:
        """The next event, or None after the last one (``pages_reusable``)."""
        s = self._s
        while True:
            try:
                ev = s.recv()
            except StopIteration:
                return None
            except NotFoundError as e:
                if self.incarnation:
                    try:
                        st = self._c.admin.status(timeout=10.0)
                    except DecodeplaneError:
                        raise e
                    if st.incarnation and st.incarnation != self.incarnation:
                        raise s.replace_err(IncarnationChangedError(
                            room=self.room, old=self.incarnation, new=st.incarnation, watch=True, op=s.op, cause=e))
                raise
            if ev.incarnation:
                if not self.incarnation:
                    self.incarnation = ev.incarnation
                elif ev.incarnation != self.incarnation:
                    raise s.end(IncarnationChangedError(room=self.room, old=self.incarnation, new=ev.incarnation,
                                                        watch=True, op=s.op))
            if not self._fresh(ev):
                continue
            s.progressed()
            if ev.pages_reusable:
                s.end(StopIteration())
            return ev

    def _fresh(self, ev: rooms_pb2.RoomEvent) -> bool:
        # Transitions come in time order: after a re-open (which replays the
        # timeline) everything older than the newest returned is skipped.
        if not ev.HasField("transition") or not ev.transition.HasField("at"):
            return True
        at = _ts(ev.transition.at)
        raw = ev.transition.SerializeToString(deterministic=True)
        if self._last is None or at > self._last:
            self._last, self._at_last = at, [raw]
            return True
        if at < self._last or raw in self._at_last:
            return False
        self._at_last.append(raw)
        return True

    def __iter__(self) -> Iterator[rooms_pb2.RoomEvent]:
        while True:
            ev = self.next()
            if ev is None:
                return
            yield ev

    def close(self) -> None:
        self._s.close()


class CapacityStream(_Stream):
    """A WatchCapacity stream (:meth:`decodeplane.admin.AdminAPI.watch_capacity`).

    It is not re-opened when it ends: its end is what tells a router that
    the daemon stopped (the last update had ``ready`` false) or cannot be
    reached; open it again (each new stream starts with the current
    figures). :meth:`next` returns None after the daemon ended it.
    """

    def __init__(self, call: object, op: str) -> None:
        self._call = call
        self._op = op
        self._err: Optional[BaseException] = None
        self._closed = False

    def next(self) -> Optional[capacity_pb2.CapacityUpdate]:
        if self._err is not None:
            if isinstance(self._err, StopIteration):
                return None
            raise self._err
        try:
            return next(self._call)  # type: ignore[call-overload]
        except StopIteration:
            self._err = StopIteration()
            return None
        except grpc.RpcError as e:
            from decodeplane.errors import from_rpc_error

            err = from_rpc_error(self._op, e)
            if self._closed:
                err = local_error(self._op, grpc.StatusCode.CANCELLED, "the stream is closed")
            self._err = err
            raise err from None

    def __iter__(self) -> Iterator[capacity_pb2.CapacityUpdate]:
        while True:
            u = self.next()
            if u is None:
                return
            yield u

    def close(self) -> None:
        self._closed = True
        self._call.cancel()  # type: ignore[attr-defined]


class WatermarkStream(_Stream):
    """A WatchWatermark stream (:meth:`decodeplane.prefill.Prefill.watch_watermark`):
    the current watermark of every selected ring, then every change (events
    coalesce: a slow reader gets the latest state). A broken stream is
    re-opened under the retry policy (it starts again with the current
    state)."""

    def __init__(self, stream: Resumable[staging_pb2.Watermark]) -> None:
        self._s = stream

    def next(self) -> Optional[staging_pb2.Watermark]:
        try:
            w = self._s.recv()
        except StopIteration:
            return None
        self._s.progressed()
        return w

    def __iter__(self) -> Iterator[staging_pb2.Watermark]:
        while True:
            w = self.next()
            if w is None:
                return
            yield w

    def close(self) -> None:
        self._s.close()
