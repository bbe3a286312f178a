"""A test bench for the SGLang plugin: SGLang's schedulers as the stand-in
queues drive them (tests/standin), one thread per attention-TP rank, the
ranks of an engine in lockstep (rank 0's new requests and aborts are
broadcast at each step, as SGLang broadcasts them; polls are combined by
MIN), KV pools in SGLang's layout (per layer a K then a V buffer, token-major
pages of [page_size, heads, head_dim]) — the decode engine's and its
metadata buffers on shared memory (/dev/shm), as the shm mover needs —
against a real daemon and the real plugin.

``use_sglang()`` puts the stand-in on sys.path, or, with
DECODEPLANE_SGLANG_SRC naming a snapshot of SGLang's source, loads SGLang's
own modules where they import on this machine (tests/sglang_real.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin")
REAL_SRC_ENV = "DECODEPLANE_SGLANG_SRC"
WAIT = 30.0
#: A scheduler loop's pause between steps.
STEP = 0.002

_loaded: Optional[str] = None


def use_sglang() -> str:
    """Makes ``import sglang`` work for the tests: "standin" or "real"."""
    global _loaded
    if _loaded is not None:
        return _loaded
    src = os.environ.get(REAL_SRC_ENV)
    if src:
        from tests import sglang_real

        sglang_real.install(src)
        _loaded = "real"
    else:
        sys.path.insert(0, STANDIN)
        _loaded = "standin"
    return _loaded


# ---- rank groups ----


class ThreadGroup:
    """The attention-TP ranks of one engine, each a thread: MIN all-reduce and
    broadcast from rank 0 (a barrier, as gloo's collectives block)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._b = threading.Barrier(n, timeout=WAIT)
        self._slots: list[Any] = [None] * n

    def rank(self, r: int) -> "RankGroup":
        return RankGroup(self, r)

    def abort(self) -> None:
        self._b.abort()


class RankGroup:
    def __init__(self, g: ThreadGroup, r: int) -> None:
        self.g, self.r = g, r

    def _exchange(self, value: Any) -> list[Any]:
        self.g._slots[self.r] = value
        self.g._b.wait()
        out = list(self.g._slots)
        self.g._b.wait()
        return out

    def all_reduce_min(self, values: list[int]) -> list[int]:
        if self.g.n == 1:
            return list(values)
        cols = self._exchange(list(values))
        return [min(c) for c in zip(*cols)]

    def broadcast(self, value: Any) -> Any:
        return value if self.g.n == 1 else self._exchange(value)[0]


class LocalGroup:
    """The group poll_and_all_reduce reduces over inside one rank (the ranks'
    MIN is the ThreadGroup's)."""

    def all_reduce_min(self, values: list[int]) -> list[int]:
        return list(values)


# ---- pools ----


class Shm:
    """Files under a fresh directory of /dev/shm, mapped as numpy arrays."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="decodeplane-test-", dir="/dev/shm")
        self._n = itertools.count()

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        path = os.path.join(self.dir, f"buf{next(self._n)}")
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        with open(path, "wb") as f:
            f.truncate(max(n, 1))
        return np.memmap(path, dtype=dtype, mode="r+", shape=shape)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _memory(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


def _like(buf: Any, values: np.ndarray) -> Any:
    """values as a row of buf (a numpy array, or a torch tensor with SGLang's
    own MetadataBuffers)."""
    if isinstance(buf, np.ndarray):
        return values
    import torch

    return torch.from_numpy(np.asarray(values))


@dataclasses.dataclass(frozen=True)
class Model:
    """The KV shape of the tests' model (the daemon's OWNER_SETS pool)."""

    layers: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    page_size: int = 16
    hidden: int = 8


class KVPool:
    """One rank's KV buffers, SGLang's layout: K of every layer, then V."""

    def __init__(self, m: Model, pages: int, heads: int, zeros: Callable[[tuple[int, ...], Any], np.ndarray]) -> None:
        self.m, self.heads = m, heads
        shape = (pages * m.page_size, heads, m.head_dim)
        self.k = [zeros(shape, np.uint16) for _ in range(m.layers)]
        self.v = [zeros(shape, np.uint16) for _ in range(m.layers)]

    def buffers(self) -> list[np.ndarray]:
        return self.k + self.v

    def page_view(self, layer: int, kv: int) -> np.ndarray:
        a = (self.k if kv == 0 else self.v)[layer]
        return a.reshape(-1, self.m.page_size, self.heads, self.m.head_dim)


class Allocator:
    """Page-granular token allocator (SGLang's with page_size > 1)."""

    def __init__(self, pages: int, page_size: int) -> None:
        self.page_size = page_size
        self._free = list(range(pages))
        self._lock = threading.Lock()

    def available_size(self) -> int:
        with self._lock:
            return len(self._free) * self.page_size

    def alloc_pages(self, tokens: int) -> Optional[list[int]]:
        n = -(-tokens // self.page_size)
        with self._lock:
            if n > len(self._free):
                return None
            out, self._free = self._free[:n], self._free[n:]
            return out

    def free_pages(self, pages: list[int]) -> None:
        with self._lock:
            self._free.extend(pages)

    def free_first(self, pages: list[int]) -> None:
        """Frees pages to be handed out next (an engine that frees a failed
        request's pages too early, as a test makes it)."""
        with self._lock:
            self._free = list(pages) + self._free


class Slots:
    def __init__(self, n: int) -> None:
        self.n = n

    def available_size(self) -> int:
        return self.n

    def take(self) -> None:
        self.n -= 1

    def give(self) -> None:
        self.n += 1


def pattern(room: int, m: Model, tokens: int) -> np.ndarray:
    """The KV the prefill computes for a room: [layers, 2, tokens, kv_heads,
    head_dim] uint16, every byte depending on where it belongs."""
    L, T, H, D = m.layers, tokens, m.kv_heads, m.head_dim
    x = (np.uint64(room % 65521) * np.uint64(1000003)
         + np.arange(L, dtype=np.uint64).reshape(L, 1, 1, 1, 1) * np.uint64(7919)
         + np.arange(2, dtype=np.uint64).reshape(1, 2, 1, 1, 1) * np.uint64(104729)
         + np.arange(T, dtype=np.uint64).reshape(1, 1, T, 1, 1) * np.uint64(31)
         + np.arange(H, dtype=np.uint64).reshape(1, 1, 1, H, 1) * np.uint64(17)
         + np.arange(D, dtype=np.uint64).reshape(1, 1, 1, 1, D))
    return ((x * np.uint64(2654435761)) % np.uint64(65521)).astype(np.uint16)


def aux_values(room: int, m: Model) -> dict[str, Any]:
    """What the prefill writes into its metadata row for a room."""
    return {"first_token": room % 50000 + 1, "cached_tokens": room % 7,
            "hidden": (np.arange(m.hidden, dtype=np.float16) + np.float16(room % 13))}


@dataclasses.dataclass(eq=False)
class Req:
    """SGLang's Req, as far as the disaggregation queues read it."""

    rid: str
    bootstrap_room: int
    bootstrap_host: str
    bootstrap_port: int
    origin_input_ids: list[int]
    sampling_params: Any = dataclasses.field(default_factory=lambda: SimpleNamespace(max_new_tokens=16))
    output_ids: list[int] = dataclasses.field(default_factory=list)
    priority: Optional[int] = None
    disagg_prefill_dp_rank: Optional[int] = None
    finished_reason: Any = None
    metadata_buffer_index: int = -1
    kv_pages: Optional[list[int]] = None
    committed: Any = None
    cached_tokens: int = 0
    hidden_state: Any = None
    disagg_kv_sender: Any = None
    num_pages: int = 0
    failure: str = ""


@contextlib.contextmanager
def environ(**kv: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update(kv)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Rank:
    """One scheduler (one attention-TP rank) and its loop thread."""

    def __init__(self, engine: "Engine", r: int, group: ThreadGroup) -> None:
        self.e, self.r = engine, r
        self.tp_group = group.rank(r)
        self.gloo_group = engine.gloo()
        self.server_args = engine.server_args
        self.page_size = engine.m.page_size
        self.allocator = Allocator(engine.pages, engine.m.page_size)
        self.req_to_token_pool = Slots(engine.req_slots)
        self.metadata_allocator = engine.metadata_allocator_class(engine.meta_slots)
        self.metadata_buffers = engine.metadata_buffers(engine.zeros)
        self.heads = max(1, engine.m.kv_heads // engine.tp)
        self.pool = KVPool(engine.m, engine.pages, self.heads, engine.zeros)
        self.running_batch = SimpleNamespace(reqs=[])
        self.reqs: dict[str, Req] = {}
        self.outcomes: dict[str, Req] = {}
        self.released: list[tuple[str, list[int], float]] = []

    def fill_kv_args(self, kv_args: Any) -> None:
        bufs = self.pool.buffers()
        kv_args.kv_data_ptrs = [b.ctypes.data for b in bufs]
        kv_args.kv_data_lens = [b.nbytes for b in bufs]
        kv_args.kv_item_lens = [self.e.m.page_size * self.heads * self.e.m.head_dim * 2 for _ in bufs]
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata_buffers.get_buf_infos()
        kv_args.page_size = self.e.m.page_size
        kv_args.kv_head_num = self.heads
        kv_args.total_kv_head_num = self.e.m.kv_heads
        kv_args.engine_rank = self.r
        kv_args.system_dp_rank = 0
        kv_args.pp_rank = 0
        kv_args.prefill_start_layer = 0
        kv_args.state_types = []
        kv_args.state_data_ptrs, kv_args.state_data_lens, kv_args.state_item_lens = [], [], []
        kv_args.parallel = {"attn_tp_size": self.e.tp, "attn_tp_rank": self.r}

    def parallel(self) -> Any:
        """The rank's parallel context while its KV manager is built."""
        if _loaded == "real":
            from tests import sglang_real

            return sglang_real.parallel(self.e.tp, self.r)
        return contextlib.nullcontext()

    def set_metadata(self, req: Req) -> None:
        """The prefill's metadata row of a request (SGLang's set_buf)."""
        mb, i = self.metadata_buffers, req.metadata_buffer_index
        mb.output_ids[i, 0] = req.output_ids[0]
        mb.cached_tokens[i, 0] = req.cached_tokens
        mb.output_hidden_states[i] = _like(mb.output_hidden_states, req.hidden_state)
        mb.bootstrap_room[i, 0] = req.bootstrap_room

    def finish(self, req: Req) -> None:
        self.outcomes[req.rid] = req

    def release_kv_cache(self, req: Req) -> None:
        if req.kv_pages:
            self.released.append((req.rid, list(req.kv_pages), time.monotonic()))
            self.allocator.free_pages(req.kv_pages)
            self.req_to_token_pool.give()
            req.kv_pages = None


class Engine:
    """An engine of ``tp`` ranks stepping in lockstep."""

    role = ""

    def __init__(self, target: str, shm: Shm, namespace: str, *, tp: int = 1, m: Model = Model(), pages: int = 64,
                 req_slots: int = 16, meta_slots: int = 16, bootstrap_port: int = 8998, backend: str = "decodeplane",
                 env: Optional[dict[str, str]] = None) -> None:
        from sglang.srt.disaggregation import utils

        self.m, self.tp, self.pages, self.req_slots, self.meta_slots = m, tp, pages, req_slots, meta_slots
        self.bootstrap_port = bootstrap_port
        self.shm = shm
        self.server_args = self.make_server_args(backend, bootstrap_port)
        self.backend = utils.TransferBackend(backend)
        self.metadata_allocator_class = utils.ReqToMetadataIdxAllocator
        self._inbox: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._stop = threading.Event()
        self.error: Optional[BaseException] = None
        group = ThreadGroup(tp)
        self._group = group
        settings = {"DECODEPLANE_TARGET": target, "DECODEPLANE_SGLANG_SHM_DIR": shm.dir,
                    "DECODEPLANE_SGLANG_NAMESPACE": namespace, "DECODEPLANE_SGLANG_RPC_TIMEOUT": "10"}
        settings.update(env or {})
        with environ(**settings):
            self.ranks = [self.make_rank(r, group) for r in range(tp)]
        self._threads = [threading.Thread(target=self._loop, args=(rk,), name=f"{self.role}-tp{rk.r}", daemon=True)
                         for rk in self.ranks]
        for t in self._threads:
            t.start()

    def make_server_args(self, backend: str, bootstrap_port: int) -> Any:
        from sglang.srt.server_args import ServerArgs

        sa = ServerArgs()
        for k, v in dict(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=bootstrap_port,
                         disaggregation_transfer_backend=backend, dist_init_addr=None, nnodes=1, kv_cache_dtype="auto",
                         load_balance_method="follow_bootstrap_room", enable_dp_attention=False, dp_size=1, pp_size=1,
                         enable_dsa_cache_layer_split=False, disaggregation_decode_enable_radix_cache=False,
                         disable_radix_cache=True).items():
            setattr(sa, k, v)
        return sa

    @property
    def zeros(self) -> Callable[[tuple[int, ...], Any], np.ndarray]:
        return _memory

    def metadata_buffers(self, zeros: Callable[[tuple[int, ...], Any], np.ndarray]) -> Any:
        from sglang.srt.disaggregation.utils import MetadataBuffers

        if _loaded == "real":
            from tests import sglang_real

            return sglang_real.metadata_buffers(self.meta_slots, self.m.hidden, zeros)
        return MetadataBuffers(self.meta_slots, self.m.hidden, zeros=zeros)

    def gloo(self) -> Any:
        if _loaded == "real":
            from tests import sglang_real

            return sglang_real.gloo_group()
        return LocalGroup()

    def make_rank(self, r: int, group: ThreadGroup) -> Rank:  # pragma: no cover - per role
        raise NotImplementedError

    def _loop(self, rk: Rank) -> None:
        try:
            while not self._stop.is_set():
                batch: list[tuple[str, Any]] = []
                if rk.r == 0:
                    while True:
                        try:
                            batch.append(self._inbox.get_nowait())
                        except queue.Empty:
                            break
                for kind, arg in rk.tp_group.broadcast(batch):
                    self.apply(rk, kind, arg)
                self.step(rk)
                time.sleep(STEP)
        except threading.BrokenBarrierError:
            pass  # another rank failed or the engine stopped
        except BaseException as e:  # noqa: BLE001 - surfaced by check()
            self.error = e
            self._group.abort()

    def apply(self, rk: Rank, kind: str, arg: Any) -> None:  # pragma: no cover - per role
        raise NotImplementedError

    def step(self, rk: Rank) -> None:  # pragma: no cover - per role
        raise NotImplementedError

    def send(self, kind: str, arg: Any) -> None:
        self._inbox.put((kind, arg))

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the {self.role} engine's loop failed: {self.error!r}") from self.error

    def wait(self, what: str, fn: Callable[[], Any], timeout: float = WAIT) -> Any:
        end = time.monotonic() + timeout
        while True:
            self.check()
            v = fn()
            if v:
                return v
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.01)

    def outcome(self, rid: str, timeout: float = WAIT) -> list[Req]:
        """Every rank's request once each ended (committed or aborted)."""
        return self.wait(f"{self.role} request {rid} to end on every rank",
                         lambda: all(rid in rk.outcomes for rk in self.ranks) and [rk.outcomes[rid] for rk in self.ranks],
                         timeout)

    def manager(self, r: int = 0) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(WAIT)
        self._group.abort()
        for r in range(self.tp):
            try:
                m = self.manager(r)
            except Exception:  # noqa: BLE001
                continue
            for side in (getattr(m, "dp_decode", None), getattr(m, "dp_prefill", None)):
                if side is not None:
                    side.close()
