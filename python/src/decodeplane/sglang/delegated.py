"""The delegated mover (``DECODEPLANE_SGLANG_MOVER=delegated``): decodeplane's
transfer agent writes every chunk into the decode engine's own buffers.

Both engines keep their buffers in host shared memory on the agent's host
(``/dev/shm``, or any file the engine maps shared under a directory the
agent admits: ``decodeplane-agent --shared-memory-dirs``). The plugin
finds the file and offset behind each pointer SGLang registers in
``/proc/self/maps``.

- Each decode rank registers its buffers with the daemon as its engine
  layout (``Rooms.RegisterEngineLayout``: per layer a K and a V buffer with
  their item length, the aux buffers with their row length, the last one —
  SGLang's ``bootstrap_room`` column — the marker's), in shared memory; the
  daemon registers them with its agent. The daemon must run the delegated
  path (``transfer.path: delegate``) with ``kv_pool.owner: engine``; every
  TP rank of a decode DP shard registers before the shard's leader
  declares a destination there (each rank does at startup).
- Each prefill rank registers its own buffers with the agent
  (``DECODEPLANE_SGLANG_AGENT``) as the source of its chunks, under a
  prefix ``P`` of its own: ``P/k/<layer>``, ``P/v/<layer>`` (the model's
  layer numbers of its PP stage), ``P/draft/k/<layer>``,
  ``P/draft/v/<layer>``, ``P/aux/<i>``; then sends each chunk with the
  Transfer op of its PrefillSession, naming ``P`` and its own pages (and,
  on the last chunk, its metadata row and the room marker). The daemon
  turns the chunk into copies, page by page and buffer by buffer as
  SGLang's transfer code computes them, and the agent writes them, the
  room marker last; the chunk's answer comes once it landed.

Because the daemon itself drives every write, a room that fails (an abort,
a failed batch) has its pages reusable only once the agent's batches for
it ended, and the decode's poll says Failed only then. State buffers
(hybrid models) and GPU memory are refused at startup, saying so.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import socket
import threading
from typing import Any, Optional

import grpc

from decodeplane.errors import DecodeplaneError
from decodeplane.sglang.buffers import Buffer, BufferError, EngineBuffers, find_region
from decodeplane.sglang.config import Settings, make_client
from decodeplane.sglang.mover import ChunkJob, Mover, RankBuffers
from decodeplane.transfer.v1 import agent_pb2, agent_pb2_grpc
from decodeplane.v1 import engine_layout_pb2, rooms_pb2

__all__ = ["DelegatedMover", "engine_layout", "kv_roles", "prefill_buffers", "ALIGN"]

log = logging.getLogger("decodeplane.sglang")

#: Shared-memory regions start at a multiple of this (the agent maps them).
ALIGN = 4096
_instances = itertools.count(1)
#: The longest prefix a TransferSource may name (its longest buffer name
#: must fit the agent's 256 bytes).
_MAX_PREFIX = 243


def kv_roles(n: int, *, mla: bool, num_layers: int, start_layer: int = 0) -> list[tuple[str, int]]:
    """The role of each of a rank's ``n`` KV buffers in SGLang's order: ("k" |
    "v" | "draft/k" | "draft/v", layer). MHA/GQA: the stage's K buffers, then
    its V buffers, then the draft model's K and V; MLA: one latent buffer
    ("k") per layer, then the draft model's."""
    per = 1 if mla else 2
    main = max(0, min(n // per, num_layers - start_layer))
    rest = n - main * per
    if rest < 0 or rest % per:
        raise BufferError(f"decodeplane: {n} KV buffers cannot be the {'latent' if mla else 'K and V'} buffers of "
                          f"layers {start_layer}.. of a {num_layers}-layer model (and a draft model's)")
    draft = rest // per
    if mla:
        return [("k", start_layer + i) for i in range(main)] + [("draft/k", i) for i in range(draft)]
    return ([("k", start_layer + i) for i in range(main)] + [("v", start_layer + i) for i in range(main)]
            + [("draft/k", i) for i in range(draft)] + [("draft/v", i) for i in range(draft)])


def _region(b: Buffer, what: str, maps: str) -> tuple[str, int]:
    r = find_region(b.ptr, b.length, maps)
    if r is None:
        raise BufferError(
            f"decodeplane: the {what} (address {b.ptr:#x}, {b.length} bytes) is not in a shared-memory file this "
            "process maps read-write (it is GPU memory or private host memory): the delegated mover needs host shared "
            "memory the transfer agent can map (/dev/shm); GPU buffers need a GPU transfer agent that opens CUDA IPC "
            "handles, which decodeplane does not ship, or a site mover (DECODEPLANE_SGLANG_MOVER=module:callable)")
    if r.offset % ALIGN:
        raise BufferError(f"decodeplane: the {what} starts at offset {r.offset} of {r.path}, not a multiple of {ALIGN}: "
                          "the transfer agent maps whole pages; allocate each buffer at a page-aligned offset")
    return r.path, r.offset


def _maps() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


def engine_layout(bufs: EngineBuffers, name: str, *, mla: bool, num_layers: int,
                  maps: Optional[str] = None) -> engine_layout_pb2.EngineLayout:
    """A decode rank's buffers as its engine layout, each named from
    ``name`` and in the shared-memory region behind it; the last aux buffer
    is the marker's (SGLang's bootstrap_room column)."""
    text = _maps() if maps is None else maps
    lay = engine_layout_pb2.EngineLayout()
    for i, (b, (role, layer)) in enumerate(zip(bufs.kv, kv_roles(len(bufs.kv), mla=mla, num_layers=num_layers))):
        path, off = _region(b, f"decode rank's KV buffer {i}", text)
        lay.kv.add(name=f"{name}/{role}/{layer}", layer=layer, value=role.endswith("v"), draft=role.startswith("draft"),
                   item_len=b.item_len, length=b.length,
                   memory=engine_layout_pb2.EngineMemory(shared=engine_layout_pb2.EngineSharedMemory(path=path, offset=off)))
    for i, b in enumerate(bufs.aux):
        path, off = _region(b, f"decode rank's aux buffer {i}", text)
        lay.aux.add(name=f"{name}/aux/{i}", row_len=b.item_len, length=b.length,
                    memory=engine_layout_pb2.EngineMemory(shared=engine_layout_pb2.EngineSharedMemory(path=path, offset=off)))
    if bufs.aux:
        lay.marker = lay.aux[-1].name
    return lay


def prefill_buffers(bufs: EngineBuffers, prefix: str, *, mla: bool, num_layers: int, start_layer: int = 0,
                    maps: Optional[str] = None) -> list[agent_pb2.Buffer]:
    """A prefill rank's buffers as the agent's PREFILL_KV buffers named from
    ``prefix`` (the engine layout's contract), in their shared memory."""
    text = _maps() if maps is None else maps
    out = []
    roles = kv_roles(len(bufs.kv), mla=mla, num_layers=num_layers, start_layer=start_layer)
    named = [(f"{prefix}/{role}/{layer}", f"prefill rank's KV buffer {i}", b)
             for i, (b, (role, layer)) in enumerate(zip(bufs.kv, roles))]
    named += [(f"{prefix}/aux/{i}", f"prefill rank's aux buffer {i}", b) for i, b in enumerate(bufs.aux)]
    for n, what, b in named:
        path, off = _region(b, what, text)
        out.append(agent_pb2.Buffer(name=n, kind=agent_pb2.BUFFER_KIND_PREFILL_KV, length=b.length, item_size=b.item_len,
                                    memory=agent_pb2.BufferMemory(shared=agent_pb2.SharedMemory(path=path, offset=off))))
    return out


def _token(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", s)[:64] or "host"


class DelegatedMover(Mover):
    """The delegated mover (see the module documentation). The plugin's
    sender asks :meth:`transfer_request` for each chunk and sends it with
    the Transfer op; :meth:`move` is never called."""

    def __init__(self, settings: Settings) -> None:
        self._s = settings
        self._lock = threading.Lock()
        self._client: Any = None
        self._channel: Optional[grpc.Channel] = None
        self._agent: Optional[agent_pb2_grpc.TransferAgentStub] = None
        self._source: list[agent_pb2.Buffer] = []
        self._stale = False
        self.prefix = ""
        #: The decode rank's layout id (the daemon's answer).
        self.layout_id = 0

    def _status(self, side: str) -> Any:
        if self._client is None:
            self._client = make_client(self._s)
        try:
            st = self._client.admin.status(timeout=self._s.rpc_timeout)
        except DecodeplaneError as e:
            raise BufferError(f"decodeplane: cannot reach the daemon at {self._s.target} (DECODEPLANE_TARGET): {e}") from e
        if st.transfer_path != "delegate":
            raise BufferError(f"decodeplane: DECODEPLANE_SGLANG_MOVER=delegated on this {side}, but the daemon at "
                              f"{self._s.target} runs transfer.path {st.transfer_path or 'sim'}: start it with "
                              "transfer.path: delegate and its transfer agent, or use DECODEPLANE_SGLANG_MOVER=shm")
        return st

    @staticmethod
    def _no_state(rank: RankBuffers) -> None:
        if rank.state_types:
            raise BufferError(f"decodeplane: the delegated mover does not move state buffers "
                              f"({', '.join(rank.state_types)}) yet: use a site mover for hybrid models")

    def start_decode(self, rank: RankBuffers) -> None:
        """Registers the decode rank's buffers with the daemon as its engine
        layout (the daemon registers them with its agent)."""
        self._no_state(rank)
        st = self._status("decode rank")
        name = f"{self._s.namespace}/dp{rank.dp_rank}/tp{rank.tp_rank}"
        lay = engine_layout(rank.buffers, name, mla=st.layout.is_mla, num_layers=st.layout.num_layers)
        try:
            resp = self._client.engine.register_engine_layout(decode_dp_rank=rank.dp_rank, decode_tp_rank=rank.tp_rank,
                                                              layout=lay, timeout=self._s.rpc_timeout)
        except DecodeplaneError as e:
            raise BufferError(f"decodeplane: the daemon at {self._s.target} refused the buffer layout of decode rank dp "
                              f"{rank.dp_rank} tp {rank.tp_rank}: {e.message}") from e
        self.layout_id = resp.layout_id
        log.info("decodeplane: decode rank dp %d tp %d registered its buffers (layout %x%s)", rank.dp_rank, rank.tp_rank,
                 resp.layout_id, ", already" if resp.already else "")

    def start_prefill(self, rank: RankBuffers) -> None:
        """Registers the prefill rank's buffers with the transfer agent."""
        self._no_state(rank)
        if not self._s.agent:
            raise BufferError("decodeplane: DECODEPLANE_SGLANG_MOVER=delegated needs DECODEPLANE_SGLANG_AGENT: the "
                              "transfer agent's address as this prefill reaches it (e.g. 127.0.0.1:7700)")
        st = self._status("prefill rank")
        host = _token(socket.gethostname())
        self.prefix = f"{self._s.namespace}/prefill/{host}-{os.getpid()}-{next(_instances)}/dp{rank.dp_rank}/tp{rank.tp_rank}"
        if len(self.prefix) > _MAX_PREFIX:
            digest = hashlib.sha256(self.prefix.encode()).hexdigest()[:32]
            self.prefix = f"{self._s.namespace}/prefill/{digest}"
        self._source = prefill_buffers(rank.buffers, self.prefix, mla=st.layout.is_mla, num_layers=st.layout.num_layers,
                                       start_layer=rank.start_layer)
        self._channel = grpc.insecure_channel(self._s.agent)
        self._agent = agent_pb2_grpc.TransferAgentStub(self._channel)
        self._register()

    def _register(self) -> None:
        assert self._agent is not None
        try:
            self._agent.RegisterBuffers(agent_pb2.RegisterBuffersRequest(buffers=self._source),
                                        timeout=self._s.rpc_timeout)
        except grpc.RpcError as e:
            raise BufferError(f"decodeplane: the transfer agent at {self._s.agent} (DECODEPLANE_SGLANG_AGENT) refused "
                              f"this prefill rank's buffers: {e.code().name}: {e.details()}") from e

    def transfer_request(self, job: ChunkJob) -> rooms_pb2.TransferRequest:
        """The Transfer op of the chunk: the rank's pages under its prefix,
        on the last chunk its metadata row and the room marker (chunk_index,
        attempt and incarnation are the sender's)."""
        with self._lock:
            stale, self._stale = self._stale, False
        if stale:  # a chunk failed: the agent may have restarted and forgotten this rank's buffers
            try:
                self._register()
            except BufferError as e:
                log.warning("%s", e)
        req = rooms_pb2.TransferRequest(room=job.room, page_offset=job.page_offset, num_pages=len(job.src_pages),
                                        last=job.last)
        req.source.buffer = self.prefix
        req.source.page_indices.extend(int(p) for p in job.src_pages)
        if job.last:
            if job.aux_index is None:
                raise BufferError(f"decodeplane: room {job.room}: the last chunk has no metadata row (init() gave none)")
            req.source.aux_row = int(job.aux_index)
            req.aux.room_marker = job.room
        return req

    def chunk_failed(self) -> None:
        """A chunk failed: register this rank's buffers again before the next
        one (idempotent at the agent; a restarted agent forgot them)."""
        with self._lock:
            self._stale = True

    def move(self, job: ChunkJob) -> None:
        raise BufferError("decodeplane: the delegated mover does not write chunks itself: the daemon's agent does")

    def close(self) -> None:
        agent, names = self._agent, [b.name for b in self._source]
        if agent is not None and names:
            try:
                agent.DeregisterBuffers(agent_pb2.DeregisterBuffersRequest(names=names), timeout=self._s.rpc_timeout)
            except grpc.RpcError as e:
                log.info("decodeplane: deregistering the prefill rank's buffers at %s: %s", self._s.agent, e.details())
        for c in (self._channel, self._client):
            if c is not None:
                c.close()
        self._channel = self._client = self._agent = None

