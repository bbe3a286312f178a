"""The decode and prefill engines of the SGLang bench (tests/sglang_env.py)
and a request's hand-off between them, checked byte for byte."""

from __future__ import annotations

import itertools
from typing import Any, Optional

import numpy as np

from tests.sglang_env import Engine, Model, Rank, Req, Shm, ThreadGroup, aux_values, pattern

_rooms = itertools.count(7_000_001)


def room_id() -> int:
    return next(_rooms)


class DecodeEngine(Engine):
    """SGLang's decode server: per rank a prealloc queue and a transfer
    queue; KV pools and metadata buffers on shared memory."""

    role = "decode"

    @property
    def zeros(self) -> Any:
        return self.shm.zeros

    def make_rank(self, r: int, group: ThreadGroup) -> Rank:
        from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue

        rk = Rank(self, r, group)
        rk.transfer_queue = DecodeTransferQueue(rk, rk.gloo_group, r)
        rk.prealloc = DecodePreallocQueue(rk, rk.transfer_queue, rk.gloo_group, r, self.backend)
        return rk

    def manager(self, r: int = 0) -> Any:
        return self.ranks[r].prealloc.kv_manager

    def apply(self, rk: Rank, kind: str, arg: Any) -> None:
        if kind == "req":
            req = Req(**arg)
            rk.reqs[req.rid] = req
            rk.prealloc.add(req)
        elif kind == "abort":
            for d in rk.prealloc.queue + rk.transfer_queue.queue:
                if d.req.rid == arg:
                    d.kv_receiver.abort()

    def step(self, rk: Rank) -> None:
        done, _failed = rk.prealloc.pop_preallocated()
        rk.transfer_queue.extend(done)
        rk.transfer_queue.pop_transferred()

    def submit(self, rid: str, room: int, prompt_len: int, bootstrap_port: int, *, host: str = "127.0.0.1",
               max_new_tokens: int = 16, prefill_dp_rank: Optional[int] = None) -> None:
        from types import SimpleNamespace

        self.send("req", dict(rid=rid, bootstrap_room=room, bootstrap_host=host, bootstrap_port=bootstrap_port,
                              origin_input_ids=list(range(prompt_len)), disagg_prefill_dp_rank=prefill_dp_rank,
                              sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens)))

    def abort(self, rid: str) -> None:
        self.send("abort", rid)

    def request(self, rid: str, r: int = 0) -> Optional[Req]:
        return self.ranks[r].reqs.get(rid)

    def verify(self, rid: str, prefill_tp: int) -> None:
        """Every decode rank holds, in the pages it allocated, the room's KV in
        every layer (K and V, its own heads), and its committed metadata row
        holds the prefill's values and the room marker."""
        for rk in self.ranks:
            req = rk.outcomes[rid]
            assert req.committed is not None, f"rank {rk.r}: {rid} was not committed: {req.finished_reason}"
            pages = rk.reqs[rid].kv_pages
            assert pages, f"rank {rk.r}: {rid} holds no pages"
            want = pattern(req.bootstrap_room, self.m, len(pages) * self.m.page_size)
            h0 = rk.r * rk.heads
            for layer in range(self.m.layers):
                for kv in (0, 1):
                    got = rk.pool.page_view(layer, kv)[pages].reshape(-1, rk.heads, self.m.head_dim)
                    exp = want[layer, kv, :, h0:h0 + rk.heads, :]
                    if not np.array_equal(got, exp):
                        bad = np.argwhere(got != exp)[0]
                        raise AssertionError(f"rank {rk.r} room {req.bootstrap_room} layer {layer} {'KV'[kv]}: "
                                             f"first differing (token, head, dim) {tuple(bad)}")
            row = req.committed
            aux = aux_values(req.bootstrap_room, self.m)
            assert row["first_token"] == aux["first_token"], (row, aux)
            assert row["cached_tokens"] == aux["cached_tokens"], (row, aux)
            assert np.array_equal(row["hidden"], aux["hidden"]), (row, aux)
            assert row["marker"] == req.bootstrap_room, row


class PrefillEngine(Engine):
    """SGLang's prefill server: per rank a bootstrap queue, the forward pass
    (the KV of a room's pattern into the rank's heads of its pages), the
    chunks and the inflight queue."""

    role = "prefill"

    def __init__(self, *a: Any, chunk_pages: int = 2, **kw: Any) -> None:
        self.chunk_pages = chunk_pages
        super().__init__(*a, **kw)

    def make_rank(self, r: int, group: ThreadGroup) -> Rank:
        from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue

        rk = Rank(self, r, group)
        rk.inflight = []
        rk.fail = lambda req, rk=rk: self._failed(rk, req)
        rk.free = lambda req, rk=rk: self._free(rk, req)
        rk.bootstrap = PrefillBootstrapQueue(rk, rk.gloo_group, r, self.bootstrap_port, self.backend)
        return rk

    def manager(self, r: int = 0) -> Any:
        return self.ranks[r].bootstrap.kv_manager

    def apply(self, rk: Rank, kind: str, arg: Any) -> None:
        if kind == "req":
            req = Req(**arg)
            rk.reqs[req.rid] = req
            rk.bootstrap.add(req)
        elif kind == "abort":
            for req in rk.bootstrap.queue + rk.inflight:
                if req.rid == arg:
                    req.disagg_kv_sender.abort()

    def step(self, rk: Rank) -> None:
        from sglang.srt.disaggregation.prefill import pop_inflight, send_kv_chunks

        for req in rk.bootstrap.pop_bootstrapped():
            self._forward(rk, req)
            send_kv_chunks(rk, req, self.chunk_pages)
            rk.inflight.append(req)
        for req in pop_inflight(rk, rk.inflight):
            rk.inflight.remove(req)
            rk.outcomes[req.rid] = req

    def _forward(self, rk: Rank, req: Req) -> None:
        n = len(req.origin_input_ids)
        pages = rk.allocator.alloc_pages(n)
        assert pages is not None, "the prefill pool is full"
        req.kv_pages = pages
        want = pattern(req.bootstrap_room, self.m, len(pages) * self.m.page_size)
        h0 = rk.r * rk.heads
        for layer in range(self.m.layers):
            for kv in (0, 1):
                view = rk.pool.page_view(layer, kv)
                view[pages] = want[layer, kv, :, h0:h0 + rk.heads, :].reshape(len(pages), self.m.page_size, rk.heads,
                                                                              self.m.head_dim)
        aux = aux_values(req.bootstrap_room, self.m)
        req.output_ids = [aux["first_token"]]
        req.cached_tokens = aux["cached_tokens"]
        req.hidden_state = aux["hidden"]

    def _failed(self, rk: Rank, req: Req) -> None:
        try:
            req.disagg_kv_sender.failure_exception()
        except Exception as e:  # noqa: BLE001
            req.failure = str(e)
        req.disagg_kv_sender.clear()
        rk.outcomes[req.rid] = req

    def _free(self, rk: Rank, req: Req) -> None:
        if req.kv_pages:
            rk.allocator.free_pages(req.kv_pages)
        if req.metadata_buffer_index >= 0:
            rk.metadata_buffers.bootstrap_room[req.metadata_buffer_index] = 0
            rk.metadata_allocator.free(req.metadata_buffer_index)

    def submit(self, rid: str, room: int, prompt_len: int, *, prefill_dp_rank: Optional[int] = None) -> None:
        self.send("req", dict(rid=rid, bootstrap_room=room, bootstrap_host="127.0.0.1", bootstrap_port=self.bootstrap_port,
                              origin_input_ids=list(range(prompt_len)), disagg_prefill_dp_rank=prefill_dp_rank))

    def abort(self, rid: str) -> None:
        self.send("abort", rid)


__all__ = ["DecodeEngine", "PrefillEngine", "room_id", "Shm", "Model"]
