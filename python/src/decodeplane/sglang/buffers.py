"""An SGLang engine's transfer buffers as the plugin sees them: the regions
behind the pointers SGLang registers (``KVArgs.kv_data_ptrs``,
``aux_data_ptrs``), where they live (a shared-memory file this process
maps, found in ``/proc/self/maps``), and the manifest a decode rank
publishes so that prefill ranks on the same host can map the same bytes.

SGLang's layout: one KV buffer per layer, every layer's K buffer then every
layer's V buffer (then a draft model's), page ``p`` of a buffer at ``p ×
item_len``, token-major inside (token, head, dim); one row of
``aux_item_len`` bytes per metadata slot in each aux buffer, the last aux
buffer being the ``bootstrap_room`` column whose row starts with the room
marker (8 bytes, little-endian).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["Region", "Buffer", "EngineBuffers", "BufferError", "find_region", "readable", "manifest_path",
           "write_manifest", "read_manifest", "MANIFEST_VERSION"]

#: The manifest format's version (a reader refuses others).
MANIFEST_VERSION = 1


class BufferError(RuntimeError):
    """A buffer the plugin cannot use, saying what is missing."""


@dataclass(frozen=True)
class Region:
    """Bytes ``[offset, offset + length)`` of the file at ``path``."""

    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class Buffer:
    """One registered buffer: its address in this process, its size, the
    size of one item (a page of one layer, or one aux row), and its region
    when it lives in a shared-memory file."""

    ptr: int
    length: int
    item_len: int
    region: Optional[Region] = None


@dataclass
class EngineBuffers:
    """A rank's KV and aux buffers (``kv`` in SGLang's order, ``aux`` with the
    marker column last)."""

    page_size: int
    kv: list[Buffer]
    aux: list[Buffer]
    heads_per_rank: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def from_kv_args(kv_args: object) -> "EngineBuffers":
        """The buffers SGLang's KVArgs lists (pointers, lengths, item lengths)."""
        def triples(prefix: str) -> list[Buffer]:
            ptrs = list(getattr(kv_args, f"{prefix}_data_ptrs", None) or [])
            lens = list(getattr(kv_args, f"{prefix}_data_lens", None) or [])
            items = list(getattr(kv_args, f"{prefix}_item_lens", None) or [])
            if not (len(ptrs) == len(lens) == len(items)):
                raise BufferError(f"decodeplane: KVArgs lists {len(ptrs)} {prefix} pointers, {len(lens)} lengths and "
                                  f"{len(items)} item lengths: they must match")
            return [Buffer(int(p), int(n), int(i)) for p, n, i in zip(ptrs, lens, items)]

        page_size = int(getattr(kv_args, "page_size", 0) or 0)
        if page_size <= 0:
            raise BufferError("decodeplane: KVArgs.page_size is not set")
        heads = int(getattr(kv_args, "kv_head_num", 0) or 0)
        return EngineBuffers(page_size=page_size, kv=triples("kv"), aux=triples("aux"), heads_per_rank=heads)


def _maps(text: Optional[str]) -> list[tuple[int, int, str, int, str]]:
    if text is None:
        with open("/proc/self/maps") as f:
            text = f.read()
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        path = parts[5].strip() if len(parts) == 6 else ""
        out.append((lo, hi, parts[1], int(parts[2], 16), path))
    return out


def find_region(ptr: int, length: int, maps: Optional[str] = None) -> Optional[Region]:
    """The shared-memory file region behind ``[ptr, ptr + length)``: a
    read-write shared mapping of a regular file (not a device) that holds
    the whole range, or None. ``maps`` is /proc/self/maps's text (read when
    None)."""
    for lo, hi, perms, off, path in _maps(maps):
        if not (lo <= ptr and ptr + length <= hi):
            continue
        if not path.startswith("/") or path.endswith(" (deleted)") or perms[:2] != "rw" or perms[3:4] != "s":
            return None
        if path.startswith("/dev/") and not path.startswith("/dev/shm/"):
            return None
        return Region(path, off + (ptr - lo), length)
    return None


def readable(ptr: int, length: int, maps: Optional[str] = None) -> bool:
    """Whether ``[ptr, ptr + length)`` lies in one readable mapping of host
    memory (not a device file such as a GPU's)."""
    for lo, hi, perms, _off, path in _maps(maps):
        if lo <= ptr and ptr + length <= hi:
            return perms[:1] == "r" and not (path.startswith("/dev/") and not path.startswith("/dev/shm/"))
    return False


def locate(bufs: EngineBuffers, what: str, maps: Optional[str] = None) -> EngineBuffers:
    """``bufs`` with every buffer's shared-memory region; raises BufferError
    naming the first buffer that is not in a shared-memory file."""
    text = maps
    if text is None:
        with open("/proc/self/maps") as f:
            text = f.read()

    def one(kind: str, i: int, b: Buffer) -> Buffer:
        r = find_region(b.ptr, b.length, text)
        if r is None:
            raise BufferError(
                f"decodeplane: the {what}'s {kind} buffer {i} (address {b.ptr:#x}, {b.length} bytes) is not in a "
                "shared-memory file this process maps read-write (it is GPU memory or private host memory): the shm "
                "mover needs host shared memory (/dev/shm); GPU buffers need a GPU transfer agent that opens CUDA IPC "
                "handles, which decodeplane does not ship, or a site mover (DECODEPLANE_SGLANG_MOVER=module:callable, "
                "e.g. one that writes with Mooncake or NIXL)")
        return Buffer(b.ptr, b.length, b.item_len, r)

    return EngineBuffers(bufs.page_size, [one("KV", i, b) for i, b in enumerate(bufs.kv)],
                         [one("aux", i, b) for i, b in enumerate(bufs.aux)], bufs.heads_per_rank, dict(bufs.extra))


def manifest_path(shm_dir: str, namespace: str, dp_rank: int, tp_rank: int, daemon: str = "") -> str:
    """Where decode rank (dp_rank, tp_rank) publishes its buffers; with
    ``daemon`` (the advertised address of the rank's decode daemon, in a
    fleet), the manifest of that daemon's rank (the address escaped
    injectively into the name: every byte but [A-Za-z0-9.-] as _xx)."""
    if daemon:
        key = re.sub(r"[^A-Za-z0-9.-]", lambda m: "".join(f"_{b:02x}" for b in m.group().encode()), daemon)
        return os.path.join(shm_dir, f"{namespace}-decode-{key}-dp{dp_rank}-tp{tp_rank}.json")
    return os.path.join(shm_dir, f"{namespace}-decode-dp{dp_rank}-tp{tp_rank}.json")


def write_manifest(path: str, bufs: EngineBuffers) -> None:
    """Publishes a located rank's buffers (atomically: a reader sees the old
    manifest or the new one)."""
    def enc(bs: Sequence[Buffer]) -> list[dict[str, object]]:
        out = []
        for b in bs:
            assert b.region is not None
            out.append({"path": b.region.path, "offset": b.region.offset, "length": b.length, "item_len": b.item_len})
        return out

    doc = {"version": MANIFEST_VERSION, "page_size": bufs.page_size, "heads_per_rank": bufs.heads_per_rank,
           "kv": enc(bufs.kv), "aux": enc(bufs.aux)}
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_manifest(path: str) -> EngineBuffers:
    """A decode rank's published buffers (regions only: the addresses are the
    decode process's). Raises BufferError when it is missing or malformed."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise BufferError(f"decodeplane: no decode buffer manifest at {path}: is the decode rank running on this host "
                          "with the same DECODEPLANE_SGLANG_SHM_DIR and DECODEPLANE_SGLANG_NAMESPACE?") from None
    except (OSError, ValueError) as e:
        raise BufferError(f"decodeplane: cannot read the decode buffer manifest {path}: {e}") from None
    try:
        if doc["version"] != MANIFEST_VERSION:
            raise BufferError(f"decodeplane: manifest {path} is version {doc['version']}, this plugin reads "
                              f"{MANIFEST_VERSION}: run one plugin version on both sides")

        def dec(items: list[dict[str, object]]) -> list[Buffer]:
            return [Buffer(0, int(i["length"]), int(i["item_len"]),  # type: ignore[call-overload]
                           Region(str(i["path"]), int(i["offset"]), int(i["length"])))  # type: ignore[call-overload]
                    for i in items]

        return EngineBuffers(int(doc["page_size"]), dec(doc["kv"]), dec(doc["aux"]), int(doc.get("heads_per_rank", 0)))
    except (KeyError, TypeError, ValueError) as e:
        raise BufferError(f"decodeplane: manifest {path} is malformed ({e!r})") from None
