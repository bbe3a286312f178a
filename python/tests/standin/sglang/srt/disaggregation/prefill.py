"""Stand-in of SGLang's prefill queues, replaying its scheduler's order: the
sender is built when the request arrives; the bootstrap queue polls every
sender (MIN over the attention-TP ranks) and, at WaitingForInput, takes a
metadata row, asks ``pop_decode_prefix_len`` and calls ``init(num_pages,
metadata row)``; after the forward pass the KV goes out in page-aligned
chunks (``should_send_kv_chunk``, ``send``), the last one after the
metadata row was set (first output id, marker); the inflight queue polls to
Success or Failure and frees the request's pages and row."""

from __future__ import annotations

from typing import Any, List

import numpy as np

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.utils import (
    DisaggregationMode,
    KVClassType,
    TransferBackend,
    get_kv_class,
    poll_and_all_reduce,
)


class PrefillBootstrapQueue:
    def __init__(self, scheduler: Any, gloo_group: Any, tp_rank: int, bootstrap_port: int,
                 transfer_backend: TransferBackend):
        self.scheduler = scheduler
        self.gloo_group = gloo_group
        self.tp_rank = tp_rank
        self.bootstrap_port = bootstrap_port
        self.transfer_backend = transfer_backend
        self.metadata_buffers = scheduler.metadata_buffers
        self.req_to_metadata_buffer_idx_allocator = scheduler.metadata_allocator
        self.queue: List[Any] = []
        self.kv_manager = self._init_kv_manager()

    def _init_kv_manager(self) -> Any:
        kv_args = get_kv_class(self.transfer_backend, KVClassType.KVARGS)()
        self.scheduler.fill_kv_args(kv_args)
        cls = get_kv_class(self.transfer_backend, KVClassType.MANAGER)
        with self.scheduler.parallel():  # SGLang: the rank's runtime parallel context
            return cls(kv_args, DisaggregationMode.PREFILL, self.scheduler.server_args, False)

    def add(self, req: Any) -> None:
        req.disagg_kv_sender = self.create_sender(req)
        self.queue.append(req)

    def create_sender(self, req: Any) -> Any:
        cls = get_kv_class(self.transfer_backend, KVClassType.SENDER)
        return cls(self.kv_manager, f"{req.bootstrap_host}:{self.bootstrap_port}", req.bootstrap_room, [self.tp_rank],
                   0, req.disagg_prefill_dp_rank is not None)

    def _poll(self, senders: List[Any]) -> List[int]:
        return self.scheduler.tp_group.all_reduce_min(poll_and_all_reduce(senders, self.gloo_group))

    def pop_bootstrapped(self) -> List[Any]:
        if not self.queue:
            return []
        out, keep = [], []
        for req, poll in zip(self.queue, self._poll([r.disagg_kv_sender for r in self.queue])):
            if poll == KVPoll.WaitingForInput:
                idx = self.req_to_metadata_buffer_idx_allocator.alloc()
                if idx is None:
                    keep.append(req)
                    continue
                req.metadata_buffer_index = idx
                prefix = req.disagg_kv_sender.pop_decode_prefix_len()
                page = self.scheduler.page_size
                req.num_pages = -(-(len(req.origin_input_ids) - prefix) // page)
                req.disagg_kv_sender.init(req.num_pages, idx)
                out.append(req)
            elif poll == KVPoll.Failed:
                self.scheduler.fail(req)
            else:
                keep.append(req)
        self.queue = keep
        return out


def send_kv_chunks(scheduler: Any, req: Any, pages_per_chunk: int) -> None:
    """The forward pass's chunks, page-aligned; the metadata row is set
    before the last."""
    sender = req.disagg_kv_sender
    pages = np.asarray(req.kv_pages, dtype=np.int32)
    starts = list(range(0, len(pages), pages_per_chunk)) or [0]
    for i, start in enumerate(starts):
        chunk = pages[start:start + pages_per_chunk]
        last = i == len(starts) - 1
        if last:
            scheduler.set_metadata(req)  # SGLang: MetadataBuffers.set_buf(req)
        if sender.should_send_kv_chunk(len(chunk), last):
            sender.send(chunk, None)


def pop_inflight(scheduler: Any, inflight: List[Any]) -> List[Any]:
    """Polls the requests in flight (MIN over the ranks); the ended ones are
    freed and returned."""
    if not inflight:
        return []
    polls = scheduler.tp_group.all_reduce_min(
        poll_and_all_reduce([r.disagg_kv_sender for r in inflight], scheduler.gloo_group))
    ended = []
    for req, poll in zip(inflight, polls):
        if poll in (KVPoll.Success, KVPoll.Failed):
            if poll == KVPoll.Failed:
                try:
                    req.disagg_kv_sender.failure_exception()
                except Exception as e:
                    req.failure = str(e)
            req.disagg_kv_sender.clear()
            scheduler.free(req)
            ended.append(req)
    return ended
