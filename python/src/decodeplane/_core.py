"""Internals shared by the client's parts: deadlines, the sessions' send
queue (one writer, packing), a closable queue, and resumable server streams."""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Generic, Iterator, Optional, TypeVar

import grpc

from decodeplane.errors import DecodeplaneError, from_rpc_error, local_error

if TYPE_CHECKING:
    from decodeplane.client import Client

log = logging.getLogger("decodeplane")

T = TypeVar("T")
M = TypeVar("M")

#: gRPC metadata key and value of the sessions' packing negotiation.
PACK_KEY = "decodeplane-pack"
PACK_MORE = "more"
#: At most this many requests ride in one session message's ``more``.
MAX_REQUESTS_PER_MESSAGE = 64
#: A packed session message stays below this many bytes (the first goes whatever its size).
MAX_SESSION_MESSAGE_BYTES = 1 << 20


def op_name(method: str) -> str:
    """"/decodeplane.v1.Rooms/GetRoom" -> "GetRoom"."""
    return method.rsplit("/", 1)[-1]


class Deadline:
    """A point in time (monotonic) bounding a call and its retries; None: unbounded."""

    __slots__ = ("at",)

    def __init__(self, timeout: Optional[float]) -> None:
        self.at = None if timeout is None else time.monotonic() + max(timeout, 0.0)

    def remaining(self) -> Optional[float]:
        """Seconds left (>= 0), or None when unbounded."""
        if self.at is None:
            return None
        return max(self.at - time.monotonic(), 0.0)

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def passes_within(self, d: float) -> bool:
        """Whether the deadline comes within d seconds."""
        return self.at is not None and time.monotonic() + d >= self.at

    def cap(self, d: Optional[float]) -> Optional[float]:
        """min(d, remaining), None meaning unbounded."""
        r = self.remaining()
        if r is None:
            return d
        if d is None:
            return r
        return min(d, r)


#: The most of a deadline kept back for the answer's way back (with_deadline).
MAX_DEADLINE_RESERVE = 0.1
#: OpenRoomRequest.timeout's bounds, in milliseconds (rooms.proto).
_ROOM_TIMEOUT_MS = (1, 86_400_000)


def with_deadline(req: Any, deadline: Deadline) -> Any:
    """An OpenRoomRequest with the time ``deadline`` leaves as its
    ``timeout`` (the request's time budget: the daemon fails the room when
    it ends, naming the phase that used it): what is left now less a reserve
    for the answer's way back (a twentieth, at most 100 ms), in whole
    milliseconds. ``req`` itself when the deadline is unbounded or the
    request's own timeout is shorter; else a copy."""
    left = deadline.remaining()
    if left is None:
        return req
    budget_ms = int((left - min(left / 20, MAX_DEADLINE_RESERVE)) * 1000)
    budget_ms = min(max(budget_ms, _ROOM_TIMEOUT_MS[0]), _ROOM_TIMEOUT_MS[1])
    if req.HasField("timeout") and req.timeout.ToNanoseconds() <= budget_ms * 1_000_000:
        return req
    out = type(req)()
    out.CopyFrom(req)
    out.timeout.FromMilliseconds(budget_ms)
    return out


def wait_retry(op: str, delay: float, last: DecodeplaneError, deadline: Deadline, closed: threading.Event) -> None:
    """Sleeps ``delay`` before the next attempt of ``op``. Raises ``last`` at
    once when the deadline comes first (the retry could not succeed, and
    ``last`` says more than a deadline), or CanceledError when the client is
    closed meanwhile."""
    if deadline.passes_within(delay):
        raise last
    log.debug("%s: retrying in %.3fs after %s", op, delay, last)
    if closed.wait(delay):
        raise local_error(op, grpc.StatusCode.CANCELLED, f"the client is closed (while waiting to retry after: {last.message})")


class ClosableQueue(Generic[T]):
    """A FIFO whose put blocks while ``bound`` items wait (None: unbounded)
    and whose close wakes every waiter. get raises :class:`Closed` once it
    is closed and empty, TimeoutError when its timeout passes."""

    class Closed(Exception):
        """The queue is closed and empty."""

    def __init__(self, bound: Optional[int] = None) -> None:
        self._items: Deque[T] = collections.deque()
        self._cond = threading.Condition()
        self._bound = bound
        self._closed = False

    def put(self, item: T) -> bool:
        """Queues item, waiting for room; False (dropped) once closed."""
        with self._cond:
            while self._bound is not None and len(self._items) >= self._bound and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self, timeout: Optional[float] = None) -> T:
        with self._cond:
            end = None if timeout is None else time.monotonic() + timeout
            while not self._items:
                if self._closed:
                    raise ClosableQueue.Closed()
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError()
                self._cond.wait(left)
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def get_nowait(self) -> Optional[T]:
        with self._cond:
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        """Refuses new items; what is queued can still be taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


class Outbox(Generic[M]):
    """A session's send queue: the request iterator gRPC's sending thread
    consumes, so there is one writer and messages go out in queue order.

    When gRPC asks for the next message it gets the first queued one with
    the ones queued behind it in its ``more`` field (at most ``max - 1``,
    within :data:`MAX_SESSION_MESSAGE_BYTES`): the messages queued while the
    previous one was being written share one message (a group commit, no
    timer). ``max`` is 1 until the daemon's response header says it reads
    packed requests (:meth:`set_max`). With ``idle`` set, a message made by
    ``idle_message`` goes out after ``idle`` seconds without any (a
    session's keep-alive ping).
    """

    _END = object()

    def __init__(self, idle: Optional[float] = None, idle_message: Optional[Callable[[], M]] = None) -> None:
        self._cond = threading.Condition()
        self._items: Deque[Any] = collections.deque()
        self._closed = False
        self._ended = False
        self._max = 1
        self._idle = idle
        self._idle_message = idle_message
        self.last_written = 0  # the highest seq handed to gRPC (0: none)

    def push(self, msg: M, add: Optional[Callable[[], bool]] = None) -> bool:
        """Queues msg after ``add`` (run under the queue's lock, so in the
        order of the writes: it numbers the message) returned true. False:
        the queue was closed or add refused; nothing queued."""
        with self._cond:
            if self._closed or (add is not None and not add()):
                return False
            self._items.append(msg)
            self._cond.notify_all()
            return True

    def set_max(self, n: int) -> None:
        """How many requests one message carries, the first included."""
        with self._cond:
            self._max = n

    def close(self) -> None:
        """No more messages: the iterator ends (half-closing the stream) once
        what is queued was taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self) -> None:
        """Drops what is queued and ends the iterator at once."""
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()

    def __iter__(self) -> Iterator[M]:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    if not self._cond.wait(self._idle) and self._idle is not None and self._idle_message is not None:
                        if not self._items and not self._closed:
                            self._items.append(self._idle_message())
                if not self._items:
                    self._ended = True
                    return
                first = self._items.popleft()
                more = []
                size = first.ByteSize()
                while self._items and len(more) + 1 < self._max:
                    nxt = self._items[0]
                    size += nxt.ByteSize()
                    if size > MAX_SESSION_MESSAGE_BYTES:
                        break
                    more.append(self._items.popleft())
                for m in [first, *more]:
                    seq = getattr(m, "seq", 0)
                    if seq > self.last_written:
                        self.last_written = seq
            if more:
                first.more.extend(more)
            yield first


class Resumable(Generic[M]):
    """A server stream re-opened, under the client's retry policy, when it
    breaks with a retryable code or ends early (the daemon ends these
    streams with a final event). Read it from one thread; close from any."""

    def __init__(self, client: "Client", method: str, again: bool, deadline: Deadline,
                 open_call: Callable[[bool, Optional[float]], Any], ends_with_event: bool = True) -> None:
        self._c = client
        self.op = op_name(method)
        self._again = again
        self._deadline = deadline
        self._open = open_call
        self._ends_with_event = ends_with_event
        self._lock = threading.Lock()
        self._cur: Any = None
        self._opened = False
        self._failures = 0
        self.err: Optional[BaseException] = None  # sticky: StopIteration after a normal end
        self._closed = False
        self._connect()

    def _connect(self) -> None:
        with self._lock:
            if self._closed:
                raise local_error(self.op, grpc.StatusCode.CANCELLED, "the stream is closed")
            self._c._check_open(self.op)
            self._cur = self._open(self._opened, self._deadline.remaining())
            self._opened = True

    def recv(self) -> M:
        """The next message; raises StopIteration after a normal end, else
        the stream's error."""
        while True:
            if self.err is not None:
                raise self.err
            if self._cur is None:
                try:
                    self._connect()
                except DecodeplaneError as e:
                    self.end(e)
                    raise
            try:
                return next(self._cur)
            except StopIteration:
                if not self._ends_with_event:
                    self.end(StopIteration())
                    raise
                e = local_error(self.op, grpc.StatusCode.UNAVAILABLE, "the stream ended before the room's end")
            except grpc.RpcError as rpc_err:
                e = from_rpc_error(self.op, rpc_err)
                if self._closed:
                    e = local_error(self.op, grpc.StatusCode.CANCELLED, "the stream is closed")
            self._cur = None
            self._backoff(e)

    def progressed(self) -> None:
        """The caller got something it had not seen: the retry budget starts afresh."""
        self._failures = 0

    def _backoff(self, e: DecodeplaneError) -> None:
        self._failures += 1
        if self._closed or not self._again or self._failures >= self._c._retry.max_attempts:
            raise self.end(e)
        d = self._c._retry.retry_delay(e, self._failures)
        if d is None:
            raise self.end(e)
        try:
            wait_retry(self.op, d, e, self._deadline, self._c._closed)
        except DecodeplaneError as w:
            raise self.end(w)

    def end(self, err: BaseException) -> BaseException:
        """Makes err the stream's final answer (unless it ended already) and
        releases the call."""
        if self.err is None:
            self.err = err
        self._cancel_call()
        return self.err

    def replace_err(self, err: BaseException) -> BaseException:
        self.err = err
        self._cancel_call()
        return err

    def _cancel_call(self) -> None:
        with self._lock:
            cur = self._cur
        if cur is not None:
            cur.cancel()

    def close(self) -> None:
        """Ends the stream (from any thread)."""
        self._closed = True
        self._cancel_call()
        if self.err is None:
            self.err = local_error(self.op, grpc.StatusCode.CANCELLED, "the stream is closed")
