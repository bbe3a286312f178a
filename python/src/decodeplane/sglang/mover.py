"""How a prefill rank's KV bytes reach the decode engine's buffers.

The plugin's sender hands each chunk SGLang sends (``send(kv_indices)``) to
a :class:`Mover`, then reports the chunk to decodeplane with
ReportTransfer (its bytes by the daemon's layout, the room marker on the
last chunk): decodeplane never sees the bytes, it proves every page of
every required rank landed, and the room succeeds only then.

Built in: the delegated mover (``DECODEPLANE_SGLANG_MOVER=delegated``,
:mod:`decodeplane.sglang.delegated`): decodeplane's transfer agent writes
the chunk, sent with the Transfer op instead of being reported; and
:class:`ShmMover` (``DECODEPLANE_SGLANG_MOVER=shm``): both engines
keep their buffers in host shared memory on one host (a CPU test setup,
or engines whose pools live in ``/dev/shm``); each decode rank publishes
where its buffers are (a manifest, :mod:`decodeplane.sglang.buffers`) and
the prefill rank copies its pages into them itself, page by page and
buffer by buffer as SGLang's transfer code computes them (``src +
prefill_page × item_len → dst + decode_page × item_len``, the rank's heads'
share of each token row when the TP sizes differ), then the aux rows of
the last chunk, the room marker last.

A site plugs its own transfer engine (Mooncake, NIXL, ...) with
``DECODEPLANE_SGLANG_MOVER=module:callable``: ``callable(settings)``
returns a Mover whose :meth:`Mover.move` writes the chunk with that engine
(and returns once it landed, or raises), and whose ``start_decode`` /
``start_prefill`` exchange what that engine needs (its registered memory,
session ids); decodeplane still claims, reports, proves coverage, times
out, aborts and releases.
"""

from __future__ import annotations

import abc
import ctypes
import importlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from decodeplane.sglang.buffers import (
    Buffer,
    BufferError,
    EngineBuffers,
    locate,
    manifest_path,
    read_manifest,
    readable,
    write_manifest,
)
from decodeplane.sglang.config import Settings
from decodeplane.v1 import rooms_pb2

__all__ = ["Mover", "ChunkJob", "RankBuffers", "ShmMover", "MoveStopped", "load_mover"]


class MoveStopped(Exception):
    """The room ended while the chunk was being written: the mover stopped
    (the rank acknowledges the end once nothing writes any more)."""


@dataclass(frozen=True)
class RankBuffers:
    """One engine rank and its buffers, as a Mover starts with them."""

    dp_rank: int
    tp_rank: int
    buffers: EngineBuffers
    #: The prefill rank's first layer (its PP stage's), 0 on decode.
    start_layer: int = 0
    #: SGLang's state types (Mamba, SWA, ...) the engine transfers.
    state_types: Sequence[str] = ()
    #: A decode rank's daemon as its fleet advertises it (GetFleet's own
    #: entry); "" when the daemon did not name itself.
    daemon: str = ""


@dataclass
class ChunkJob:
    """One chunk of one room for one prefill rank: destination pages
    ``[page_offset, page_offset + len(src_pages))`` of ``destination``
    from the rank's pages ``src_pages``; on the last chunk also its aux
    row ``aux_index`` (and the room marker). ``stop`` is set when the room
    ended while the rank may write: stop writing at once."""

    room: int
    destination: rooms_pb2.Destination
    page_offset: int
    src_pages: np.ndarray
    last: bool
    aux_index: Optional[int] = None
    state_indices: Optional[list[Any]] = None
    stop: threading.Event = field(default_factory=threading.Event)
    #: The advertised address of the decode daemon that holds the room, in a
    #: fleet (DECODEPLANE_SGLANG_FLEET): which decode instance the
    #: destination's ranks are (the decode rank's RankBuffers.daemon); ""
    #: when the rank claims every room on DECODEPLANE_TARGET.
    daemon: str = ""

    @property
    def dst_pages(self) -> np.ndarray:
        d = self.destination.page_indices
        return np.asarray(d[self.page_offset:self.page_offset + len(self.src_pages)], dtype=np.int64)


class Mover(abc.ABC):
    """Moves chunks into the decode engine's buffers (see the module
    documentation). One per SGLang scheduler process; ``move`` is called
    from the plugin's mover threads, one chunk of a room at a time."""

    def start_decode(self, rank: RankBuffers) -> None:
        """Called once by each decode rank with its buffers: make them
        reachable by the prefill ranks' ``move``."""

    def start_prefill(self, rank: RankBuffers) -> None:
        """Called once by each prefill rank with its own buffers."""

    @abc.abstractmethod
    def move(self, job: ChunkJob) -> None:
        """Writes the chunk into every non-dummy target of the destination;
        returns once it landed. Raises MoveStopped when ``job.stop`` was set
        (nothing more is written), any other exception for a failed write
        (the room fails with its message)."""

    def transfer_request(self, job: ChunkJob) -> Optional[rooms_pb2.TransferRequest]:
        """None: :meth:`move` writes the chunk and the plugin reports it.
        A TransferRequest: the daemon's transfer agent moves the chunk, which
        the plugin sends with the Transfer op (the delegated mover,
        :mod:`decodeplane.sglang.delegated`)."""
        return None

    def chunk_failed(self) -> None:
        """Called when a chunk of :meth:`transfer_request` failed."""

    def close(self) -> None:
        """Releases what the mover holds."""


def load_mover(settings: Settings) -> Mover:
    """The mover ``DECODEPLANE_SGLANG_MOVER`` names."""
    if settings.mover == "shm":
        return ShmMover(settings)
    if settings.mover == "delegated":
        from decodeplane.sglang.delegated import DelegatedMover

        return DelegatedMover(settings)
    mod, _, attr = settings.mover.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise BufferError(f"decodeplane: DECODEPLANE_SGLANG_MOVER={settings.mover!r}: cannot load it ({e})") from None
    m = obj(settings)
    if not isinstance(m, Mover):
        raise BufferError(f"decodeplane: DECODEPLANE_SGLANG_MOVER={settings.mover!r} returned {type(m).__name__}, "
                          "not a decodeplane.sglang.mover.Mover")
    return m


def _host_bytes(b: Buffer) -> np.ndarray:
    return np.frombuffer((ctypes.c_uint8 * b.length).from_address(b.ptr), dtype=np.uint8)


class _Mapped:
    """A decode rank's buffers mapped here, as of one manifest."""

    def __init__(self, path: str, stamp: tuple[int, int], bufs: EngineBuffers) -> None:
        self.path, self.stamp, self.bufs = path, stamp, bufs
        self.kv = [self._map(b) for b in bufs.kv]
        self.aux = [self._map(b) for b in bufs.aux]

    @staticmethod
    def _map(b: Buffer) -> np.ndarray:
        assert b.region is not None
        return np.memmap(b.region.path, dtype=np.uint8, mode="r+", offset=b.region.offset, shape=(b.length,))


class ShmMover(Mover):
    """Copies chunks into decode buffers in host shared memory on this host
    (see the module documentation)."""

    def __init__(self, settings: Settings) -> None:
        self._s = settings
        self._lock = threading.Lock()
        self._decode: dict[tuple[str, int, int], _Mapped] = {}
        self._src_kv: list[np.ndarray] = []
        self._src_aux: list[np.ndarray] = []
        self._src: Optional[RankBuffers] = None

    def start_decode(self, rank: RankBuffers) -> None:
        if rank.state_types:
            raise BufferError(f"decodeplane: the shm mover does not move state buffers ({', '.join(rank.state_types)}): "
                              "use a site mover for hybrid models")
        located = locate(rank.buffers, f"decode rank dp {rank.dp_rank} tp {rank.tp_rank}")
        os.makedirs(self._s.shm_dir, exist_ok=True)
        write_manifest(manifest_path(self._s.shm_dir, self._s.namespace, rank.dp_rank, rank.tp_rank), located)
        if rank.daemon:  # for the prefill ranks of a fleet, which know the room's daemon
            write_manifest(manifest_path(self._s.shm_dir, self._s.namespace, rank.dp_rank, rank.tp_rank, rank.daemon),
                           located)

    def start_prefill(self, rank: RankBuffers) -> None:
        if rank.state_types:
            raise BufferError(f"decodeplane: the shm mover does not move state buffers ({', '.join(rank.state_types)}): "
                              "use a site mover for hybrid models")
        for kind, bs in (("KV", rank.buffers.kv), ("aux", rank.buffers.aux)):
            for i, b in enumerate(bs):
                if not readable(b.ptr, b.length):
                    raise BufferError(
                        f"decodeplane: the prefill rank's {kind} buffer {i} (address {b.ptr:#x}, {b.length} bytes) is not "
                        "host memory this process can read (GPU memory?): the shm mover copies from host memory; GPU "
                        "buffers need a site mover (DECODEPLANE_SGLANG_MOVER=module:callable)")
        self._src = rank
        self._src_kv = [_host_bytes(b) for b in rank.buffers.kv]
        self._src_aux = [_host_bytes(b) for b in rank.buffers.aux]

    def _target(self, dp: int, tp: int, daemon: str) -> _Mapped:
        path = manifest_path(self._s.shm_dir, self._s.namespace, dp, tp, daemon)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            read_manifest(path)  # raises the message that says what is missing
            raise
        stamp = (st.st_ino, st.st_mtime_ns)
        with self._lock:
            m = self._decode.get((daemon, dp, tp))
            if m is None or m.stamp != stamp:
                m = _Mapped(path, stamp, read_manifest(path))
                self._decode[(daemon, dp, tp)] = m
            return m

    def move(self, job: ChunkJob) -> None:
        src = self._src
        if src is None:
            raise BufferError("decodeplane: the shm mover was not started with the prefill rank's buffers")
        d = job.destination
        for t in d.targets:
            if t.dummy:
                continue
            dst = self._target(d.decode_dp_rank, t.decode_tp_rank, job.daemon)
            self._copy_kv(job, src, dst, t)
            if job.last:
                self._copy_aux(job, dst)

    def _copy_kv(self, job: ChunkJob, src: RankBuffers, dst: _Mapped, t: rooms_pb2.DecodeTarget) -> None:
        ps = src.buffers.page_size
        if dst.bufs.page_size != ps:
            raise BufferError(f"decodeplane: page size {ps} here, {dst.bufs.page_size} on the decode rank")
        layers = _layer_map(len(src.buffers.kv), len(dst.bufs.kv), src.start_layer)
        sp, dp = np.asarray(job.src_pages, dtype=np.int64), job.dst_pages
        if len(sp) == 0:
            return
        for i, j in enumerate(layers):
            if job.stop.is_set():
                raise MoveStopped()
            sb, db = src.buffers.kv[i], dst.bufs.kv[j]
            s_arr = self._src_kv[i][:(sb.length // sb.item_len) * sb.item_len].reshape(-1, sb.item_len)
            d_arr = dst.kv[j][:(db.length // db.item_len) * db.item_len].reshape(-1, db.item_len)
            if _whole(sb, db, src.buffers, dst.bufs, t):
                d_arr[dp] = s_arr[sp]
                continue
            hs, hd = src.buffers.heads_per_rank, dst.bufs.heads_per_rank
            if hs <= 0 or hd <= 0 or sb.item_len % (ps * hs) or db.item_len % (ps * hd) \
                    or sb.item_len // (ps * hs) != db.item_len // (ps * hd):
                raise BufferError(f"decodeplane: cannot slice heads between item lengths {sb.item_len} ({hs} heads) "
                                  f"and {db.item_len} ({hd} heads) of page size {ps}")
            hb = sb.item_len // (ps * hs)
            n = t.num_heads or min(hs, hd)
            s4 = s_arr.reshape(-1, ps, hs, hb)
            d4 = d_arr.reshape(-1, ps, hd, hb)
            d4[dp, :, t.dst_head_start:t.dst_head_start + n, :] = s4[sp, :, t.src_head_start:t.src_head_start + n, :]

    def _copy_aux(self, job: ChunkJob, dst: _Mapped) -> None:
        if job.aux_index is None:
            raise BufferError(f"decodeplane: room {job.room}: the last chunk has no metadata row (init() gave none)")
        if len(self._src_aux) != len(dst.aux):
            raise BufferError(f"decodeplane: {len(self._src_aux)} aux buffers here, {len(dst.aux)} on the decode rank")
        slot = job.destination.metadata_slot
        src = self._src
        assert src is not None
        for k, (s_arr, d_arr) in enumerate(zip(self._src_aux, dst.aux)):
            row = src.buffers.aux[k].item_len
            if dst.bufs.aux[k].item_len != row:
                raise BufferError(f"decodeplane: aux buffer {k} rows are {row} bytes here, "
                                  f"{dst.bufs.aux[k].item_len} on the decode rank")
            s_row = s_arr[job.aux_index * row:(job.aux_index + 1) * row]
            d_row = d_arr[slot * row:(slot + 1) * row]
            if k < len(dst.aux) - 1:
                d_row[:] = s_row
            else:  # the marker column: its row after the marker, then the marker, last
                d_row[8:] = s_row[8:]
                d_row[:8] = np.frombuffer(int(job.room).to_bytes(8, "little"), dtype=np.uint8)

    def close(self) -> None:
        with self._lock:
            self._decode.clear()


def _whole(sb: Buffer, db: Buffer, s: EngineBuffers, d: EngineBuffers, t: rooms_pb2.DecodeTarget) -> bool:
    """Whether a page moves whole (the prefill rank's heads are the decode
    rank's, or there are no heads: MLA)."""
    if sb.item_len != db.item_len or t.src_head_start or t.dst_head_start:
        return False
    if t.num_heads == 0 or s.heads_per_rank <= 0 or d.heads_per_rank <= 0:
        return True
    return t.num_heads == s.heads_per_rank == d.heads_per_rank


def _layer_map(ns: int, nd: int, start: int) -> list[int]:
    """Decode buffer index of each prefill KV buffer: the same, or, for a
    prefill PP stage holding layers [start, start + ns/2), its K and V
    buffers among the decode rank's."""
    if ns == nd and start == 0:
        return list(range(ns))
    if ns % 2 or nd % 2 or start + ns // 2 > nd // 2:
        raise BufferError(f"decodeplane: {ns} KV buffers here (first layer {start}), {nd} on the decode rank: "
                          "cannot map them")
    hs, hd = ns // 2, nd // 2
    return [start + j for j in range(hs)] + [hd + start + j for j in range(hs)]
