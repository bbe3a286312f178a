"""Stand-in of SGLang's disaggregation utilities: the closed TransferBackend
enum and get_kv_class's if/elif over it, the poll combined by MIN over a
rank group after the metadata gate, the metadata buffers (here numpy arrays
the caller places, e.g. on shared memory) and their row allocator."""

from __future__ import annotations

import enum
from collections import deque
from typing import Any, Callable, List, Optional

import numpy as np

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class TransferBackend(enum.Enum):
    MOONCAKE = "mooncake"
    MORI = "mori"
    NIXL = "nixl"
    ASCEND = "ascend"
    FAKE = "fake"


class KVClassType(enum.Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


def get_kv_class(transfer_backend: TransferBackend, class_type: KVClassType) -> Optional[type]:
    from sglang.srt.disaggregation.base.conn import KVArgs

    if transfer_backend == TransferBackend.MOONCAKE:
        from sglang.srt.disaggregation import mooncake as m

        table = {KVClassType.MANAGER: m.MooncakeKVManager, KVClassType.SENDER: m.MooncakeKVSender,
                 KVClassType.RECEIVER: m.MooncakeKVReceiver, KVClassType.BOOTSTRAP_SERVER: m.MooncakeKVBootstrapServer}
    elif transfer_backend == TransferBackend.FAKE:
        from sglang.srt.disaggregation import fake as f

        table = {KVClassType.MANAGER: f.FakeKVManager, KVClassType.SENDER: f.FakeKVSender,
                 KVClassType.RECEIVER: f.FakeKVReceiver}
    else:
        raise ValueError(f"Unsupported transfer backend: {transfer_backend}")
    return KVArgs if class_type == KVClassType.KVARGS else table.get(class_type)


def _is_fake_transfer(req: Any, server_args: Any) -> bool:
    return req.bootstrap_host == FAKE_BOOTSTRAP_HOST


def _apply_metadata_gate(polls: List[int], decode_reqs: Any, metadata_buffers: Any, server_args: Any) -> None:
    """A local Success is Transferring while the request's metadata row has
    no room marker yet."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    for i, p in enumerate(polls):
        if p == KVPoll.Success and not _is_fake_transfer(decode_reqs[i].req, server_args):
            if int(metadata_buffers.bootstrap_room[decode_reqs[i].metadata_buffer_index, 0]) == 0:
                polls[i] = KVPoll.Transferring


def poll_and_all_reduce(pollers: Any, gloo_group: Any, decode_reqs: Any = None, metadata_buffers: Any = None,
                        server_args: Any = None) -> List[int]:
    """Every poller's poll, the metadata gate, then MIN over the group's ranks
    (``gloo_group.all_reduce_min``: SGLang all-reduces over gloo)."""
    polls = [int(p.poll()) for p in pollers]
    if decode_reqs is not None and metadata_buffers is not None and server_args is not None:
        _apply_metadata_gate(polls, decode_reqs, metadata_buffers, server_args)
    return gloo_group.all_reduce_min(polls)


class ReqToMetadataIdxAllocator:
    def __init__(self, size: int):
        self.size = size
        self.free_slots = deque(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self) -> Optional[int]:
        return self.free_slots.popleft() if self.free_slots else None

    def free(self, free_index: int) -> None:
        self.free_slots.append(free_index)


class MetadataBuffers:
    """One row per metadata slot in each buffer: first output ids, cached
    tokens, logprob values and indices, top logprobs, hidden states, and the
    bootstrap_room column (uint64 x 8), whose row starts with the marker
    (the prefill sets a request's row before its last chunk).
    ``zeros(shape, dtype)`` places each buffer (default: numpy.zeros)."""

    def __init__(self, size: int, hidden_size: int, hidden_states_dtype: Any = np.float16,
                 max_top_logprobs_num: int = 8, zeros: Optional[Callable[[tuple, Any], np.ndarray]] = None):
        z = zeros or (lambda shape, dtype: np.zeros(shape, dtype=dtype))
        self.output_ids = z((size, 16), np.int32)
        self.cached_tokens = z((size, 16), np.int32)
        self.output_token_logprobs_val = z((size, 16), np.float32)
        self.output_token_logprobs_idx = z((size, 16), np.int32)
        self.output_top_logprobs_val = z((size, max_top_logprobs_num), np.float32)
        self.output_hidden_states = z((size, hidden_size), hidden_states_dtype)
        self.bootstrap_room = z((size, 8), np.uint64)

    def _bufs(self) -> List[np.ndarray]:
        return [self.output_ids, self.cached_tokens, self.output_token_logprobs_val, self.output_token_logprobs_idx,
                self.output_top_logprobs_val, self.output_hidden_states, self.bootstrap_room]

    def get_buf_infos(self):
        bufs = self._bufs()
        return ([b.ctypes.data for b in bufs], [b.nbytes for b in bufs], [b[0].nbytes for b in bufs])

    def get_buf(self, idx: int):
        return tuple(b[idx].copy() for b in self._bufs())
