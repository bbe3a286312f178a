"""Shared helpers of the tests: a daemon per test module, unique rooms and
prefill addresses, registrations, a TCP proxy whose connections can be cut,
and polling with a deadline."""

from __future__ import annotations

import itertools
import socket
import threading
import time
import unittest
from typing import Any, Callable, Optional, TypeVar

import decodeplane
from decodeplane.v1 import bootstrap_pb2
from tests.daemon import Daemon

T = TypeVar("T")

_rooms = itertools.count(1000)
_addrs = itertools.count(1)

#: The bound of every wait in the tests.
WAIT = 30.0


def room_id() -> int:
    """A room no other test of the run uses."""
    return next(_rooms)


def prefill_addr() -> str:
    """A prefill bootstrap address no other test of the run uses."""
    return f"10.0.{next(_addrs)}.1:8998"


def registration(addr: str, tp_size: int = 1, tp_rank: int = 0, **kw: Any) -> bootstrap_pb2.RegisterPrefillRequest:
    """A prefill rank's registration against the embedded defaults (GQA,
    page 64, bf16)."""
    par = bootstrap_pb2.ParallelInfo(attn_tp_size=tp_size, attn_tp_rank=tp_rank, pp_size=1,
                                     **kw.pop("parallel", {}))
    return bootstrap_pb2.RegisterPrefillRequest(
        bootstrap_addr=addr, rank_endpoint=f"{addr.split(':')[0]}:{9000 + tp_rank}", parallel=par,
        page_size=kw.pop("page_size", 64), kv_cache_dtype=kw.pop("kv_cache_dtype", "bf16"), **kw)


def open_fields(room: int, addr: str, prompt_len: int = 100, **kw: Any) -> dict[str, Any]:
    """OpenRoom's fields for a room of ``prompt_len`` tokens."""
    return dict(rid=f"r-{room}", bootstrap_addr=addr, room=room, prompt_len=prompt_len,
                max_new_tokens=kw.pop("max_new_tokens", 16), **kw)


def poll(what: str, fn: Callable[[], Optional[T]], timeout: float = WAIT, every: float = 0.02) -> T:
    """Calls fn until it returns something other than None (or False), at
    most ``timeout`` seconds; fails with ``what`` then."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v is not None and v is not False:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Background(threading.Thread):
    """Runs fn on a thread; join() returns its result or raises its exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "test-background") -> None:
        super().__init__(name=name, daemon=True)
        self._fn = fn
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def outcome(self, timeout: float = WAIT) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"{self.name} did not finish within {timeout}s")
        if self.error is not None:
            raise self.error
        return self.result

    def failure(self, timeout: float = WAIT) -> BaseException:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"{self.name} did not finish within {timeout}s")
        if self.error is None:
            raise AssertionError(f"{self.name} succeeded ({self.result!r}), an error was expected")
        return self.error


class Proxy:
    """A loopback TCP proxy to ``upstream`` whose connections :meth:`cut`
    drops at once (a network failure under the client's streams)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._up = (host, int(port))
        self._lis = socket.socket()
        self._lis.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lis.bind(("127.0.0.1", 0))
        self._lis.listen(64)
        self.addr = f"127.0.0.1:{self._lis.getsockname()[1]}"
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.accepted = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._lis.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self._up)
            except OSError:
                c.close()
                continue
            with self._lock:
                self._socks += [c, u]
                self.accepted += 1
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drops every open connection (new ones are accepted)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._lis.close()
        self.cut()


#: A retry policy that outlasts gRPC's reconnection to a restarted daemon
#: (grpc-core's channel backoff: a few seconds).
PATIENT = decodeplane.RetryPolicy(max_attempts=40, initial_backoff=0.05, max_backoff=0.5)


class DaemonCase(unittest.TestCase):
    """A test case with one daemon for the whole class (``SETS`` are its
    ``--set`` flags) and a client for each test."""

    SETS: tuple[str, ...] = ()
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon(*cls.SETS).start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    def setUp(self) -> None:
        self.client = self.new_client()

    def new_client(self, **kw: Any) -> decodeplane.Client:
        kw.setdefault("timeout", WAIT)
        c = decodeplane.Client(kw.pop("target", self.daemon.addr), **kw)
        self.addCleanup(c.close)
        return c

    def registered(self, tp_size: int = 1, client: Optional[decodeplane.Client] = None,
                   **kw: Any) -> list[decodeplane.Prefill]:
        """A fresh prefill instance of tp_size ranks, every rank registered."""
        c = client or self.client
        addr = prefill_addr()
        ps = [c.prefill(registration(addr, tp_size, r, **kw)) for r in range(tp_size)]
        for p in ps:
            p.register()
            self.addCleanup(p.close)
        return ps


