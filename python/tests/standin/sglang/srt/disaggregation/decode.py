"""Stand-in of SGLang's decode queues, replaying its scheduler's order: a
request's receiver is built when it arrives (FAKE warm-up requests get the
fake backend's), its prefill DP rank resolved from the manager's
prefill_info_table (else pending, retried through try_ensure_parallel_info),
then ``init``; the prealloc queue polls every receiver, MIN over the
attention-TP ranks, and for the requests WaitingForInput, in FIFO order and
within the pools' budgets, allocates pages and a metadata row and calls
``send_metadata``; the transfer queue polls (the metadata gate, then MIN)
and commits a Success (checking the row's marker) or releases a Failure's
pages. An abort only calls the receiver's ``abort()``: pages come back when
its poll says Failed."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

import numpy as np

from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVReceiver
from sglang.srt.disaggregation.utils import (
    DisaggregationMode,
    KVClassType,
    TransferBackend,
    _is_fake_transfer,
    get_kv_class,
    poll_and_all_reduce,
)


@dataclasses.dataclass
class DecodeRequest:
    req: Any
    kv_receiver: Any
    waiting_for_input: bool = False
    metadata_buffer_index: int = -1
    is_rebootstrap: bool = False


def _bootstrap_addr(req: Any) -> str:
    return f"{req.bootstrap_host}:{req.bootstrap_port}"


def prepare_abort(req: Any, message: str) -> None:
    req.finished_reason = ("abort", message)


class DecodePreallocQueue:
    def __init__(self, scheduler: Any, transfer_queue: "DecodeTransferQueue", gloo_group: Any, tp_rank: int,
                 transfer_backend: TransferBackend):
        self.scheduler = scheduler
        self.token_to_kv_pool_allocator = scheduler.allocator
        self.req_to_token_pool = scheduler.req_to_token_pool
        self.req_to_metadata_buffer_idx_allocator = scheduler.metadata_allocator
        self.metadata_buffers = scheduler.metadata_buffers
        self.transfer_queue = transfer_queue
        self.gloo_group = gloo_group
        self.tp_rank = tp_rank
        self.transfer_backend = transfer_backend
        self.queue: List[DecodeRequest] = []
        self.pending_reqs: List[DecodeRequest] = []
        self.kv_manager = self._init_kv_manager()

    def _init_kv_manager(self) -> Any:
        kv_args = get_kv_class(self.transfer_backend, KVClassType.KVARGS)()
        self.scheduler.fill_kv_args(kv_args)
        cls = get_kv_class(self.transfer_backend, KVClassType.MANAGER)
        with self.scheduler.parallel():  # SGLang: the rank's runtime parallel context
            return cls(kv_args, DisaggregationMode.DECODE, self.scheduler.server_args, False)

    def add(self, req: Any, is_retracted: bool = False, is_rebootstrap: bool = False) -> None:
        decode_req = self._create_receiver_and_enqueue(req, is_rebootstrap=is_rebootstrap)
        if _is_fake_transfer(req, self.scheduler.server_args):
            decode_req.kv_receiver.init(0)
            return
        rank = self._resolve_prefill_dp_rank(req)
        if rank is not None:
            decode_req.kv_receiver.init(rank)
            return
        self.pending_reqs.append(decode_req)

    def _resolve_prefill_dp_rank(self, req: Any) -> Optional[int]:
        info = self.kv_manager.prefill_info_table.get(_bootstrap_addr(req))
        if info is None:
            return None
        if req.disagg_prefill_dp_rank is not None:
            return req.disagg_prefill_dp_rank
        if info.dp_size == 1:
            return 0
        if info.follow_bootstrap_room:
            return req.bootstrap_room % info.dp_size
        return None

    def _create_receiver_and_enqueue(self, req: Any, is_rebootstrap: bool = False) -> DecodeRequest:
        backend = TransferBackend.FAKE if _is_fake_transfer(req, self.scheduler.server_args) else self.transfer_backend
        cls = get_kv_class(backend, KVClassType.RECEIVER)
        receiver = cls(mgr=self.kv_manager, bootstrap_addr=_bootstrap_addr(req), bootstrap_room=req.bootstrap_room)
        decode_req = DecodeRequest(req=req, kv_receiver=receiver, is_rebootstrap=is_rebootstrap)
        self.queue.append(decode_req)
        return decode_req

    def _resolve_pending_reqs(self) -> None:
        remaining = []
        for dr in self.pending_reqs:
            addr = _bootstrap_addr(dr.req)
            if not self.kv_manager.try_ensure_parallel_info(addr):
                remaining.append(dr)
                continue
            rank = self._resolve_prefill_dp_rank(dr.req)
            if rank is None:
                rank = CommonKVReceiver.query_prefill_dp_ranks(addr, [dr.req.bootstrap_room]).get(str(dr.req.bootstrap_room))
            if rank is None:
                remaining.append(dr)
            else:
                dr.kv_receiver.init(int(rank))
        self.pending_reqs = remaining

    def _poll(self, receivers: List[Any], **gate: Any) -> List[int]:
        return self.scheduler.tp_group.all_reduce_min(poll_and_all_reduce(receivers, self.gloo_group, **gate))

    def _update_handshake_waiters(self) -> None:
        if not self.queue:
            return
        if all(d.waiting_for_input for d in self.queue) and not any(
                d.kv_receiver.conclude_state == KVPoll.Failed for d in self.queue
                if hasattr(d.kv_receiver, "conclude_state")):
            return
        for d, poll in zip(self.queue, self._poll([d.kv_receiver for d in self.queue])):
            if poll == KVPoll.WaitingForInput:
                d.waiting_for_input = True
            elif poll == KVPoll.Failed:
                msg = f"Decode handshake failed for request rank={self.tp_rank} rid={d.req.rid}"
                try:
                    d.kv_receiver.failure_exception()
                except Exception as e:
                    msg += f" with exception {e}"
                prepare_abort(d.req, msg)

    def pop_preallocated(self) -> tuple[List[DecodeRequest], List[DecodeRequest]]:
        self._resolve_pending_reqs()
        self._update_handshake_waiters()
        failed, done, keep = [], [], []
        for d in self.queue:
            if d.req.finished_reason is not None:
                d.kv_receiver.clear()
                self.scheduler.finish(d.req)
                failed.append(d)
            else:
                keep.append(d)
        self.queue, self.pending_reqs = keep, [d for d in self.pending_reqs if d in keep]
        blocked = False
        for d in list(self.queue):
            if blocked or not d.waiting_for_input:
                continue
            if self.req_to_token_pool.available_size() <= 0 or self.req_to_metadata_buffer_idx_allocator.available_size() <= 0:
                break
            pages = self._pre_alloc(d.req)
            if pages is None:
                blocked = True  # FIFO: nothing behind it is admitted ahead of it
                continue
            d.metadata_buffer_index = self.req_to_metadata_buffer_idx_allocator.alloc()
            d.kv_receiver.send_metadata(np.asarray(pages, dtype=np.int32), d.metadata_buffer_index, [],
                                        decode_prefix_len=0)
            self.queue.remove(d)
            done.append(d)
        return done, failed

    def _pre_alloc(self, req: Any) -> Optional[List[int]]:
        """The request's pages (SGLang: a req_to_token row, then the
        allocator's pages for the prompt)."""
        pages = self.token_to_kv_pool_allocator.alloc_pages(len(req.origin_input_ids))
        if pages is not None:
            req.kv_pages = pages
            self.req_to_token_pool.take()
        return pages


class DecodeTransferQueue:
    def __init__(self, scheduler: Any, gloo_group: Any, tp_rank: int):
        self.scheduler = scheduler
        self.gloo_group = gloo_group
        self.tp_rank = tp_rank
        self.metadata_buffers = scheduler.metadata_buffers
        self.req_to_metadata_buffer_idx_allocator = scheduler.metadata_allocator
        self.queue: List[DecodeRequest] = []

    def extend(self, reqs: List[DecodeRequest]) -> None:
        self.queue.extend(reqs)

    def pop_transferred(self) -> List[Any]:
        if not self.queue:
            return []
        polls = poll_and_all_reduce([d.kv_receiver for d in self.queue], self.gloo_group, decode_reqs=self.queue,
                                    metadata_buffers=self.metadata_buffers, server_args=self.scheduler.server_args)
        polls = self.scheduler.tp_group.all_reduce_min(polls)
        out, keep = [], []
        for d, poll in zip(self.queue, polls):
            if poll == KVPoll.Failed:
                msg = f"Decode transfer failed for request rank={self.tp_rank} rid={d.req.rid}"
                try:
                    d.kv_receiver.failure_exception()
                except Exception as e:
                    msg += f" with exception {e}"
                prepare_abort(d.req, msg)
                self.scheduler.release_kv_cache(d.req)  # the pages go back only now
            elif poll == KVPoll.Success:
                self._commit_transfer_to_req(d)
                out.append(d.req)
            else:
                keep.append(d)
                continue
            d.kv_receiver.clear()
            self.metadata_buffers.bootstrap_room[d.metadata_buffer_index] = 0
            self.req_to_metadata_buffer_idx_allocator.free(d.metadata_buffer_index)
            self.scheduler.finish(d.req)
        self.queue = keep
        return out

    def _commit_transfer_to_req(self, d: DecodeRequest) -> None:
        mb, i = self.metadata_buffers, d.metadata_buffer_index
        marker = int(mb.bootstrap_room[i, 0])
        if not _is_fake_transfer(d.req, self.scheduler.server_args) and marker != d.req.bootstrap_room:
            prepare_abort(d.req, f"Metadata corruption detected: room {marker} in the row of {d.req.bootstrap_room}")
            self.scheduler.release_kv_cache(d.req)
            return
        d.req.committed = {"first_token": int(mb.output_ids[i, 0]), "cached_tokens": int(mb.cached_tokens[i, 0]),
                           "hidden": np.array(mb.output_hidden_states[i], dtype=np.float16), "marker": marker}
