"""Stand-in of SGLang's fake transfer backend (warm-up requests): the
receiver polls Bootstrapping, then WaitingForInput after init, Success
after send_metadata; the sender Success after its last chunk."""

from __future__ import annotations

from typing import Any, List, Optional

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVReceiver, BaseKVSender, KVPoll, KVTransferMetric


class FakeKVManager(BaseKVManager):
    def __init__(self, args: Any, disaggregation_mode: Any, server_args: Any, is_mla_backend: Optional[bool] = False):
        self.kv_args = args

    def register_to_bootstrap(self):
        pass


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: List[int], pp_rank: int,
                 req_has_disagg_prefill_dp_rank: bool = False):
        self.has_sent = False

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        pass

    def send(self, kv_indices: Any, state_indices: Optional[List] = None):
        self.has_sent = True

    def get_transfer_metric(self) -> KVTransferMetric:
        return KVTransferMetric()

    def poll(self) -> int:
        return KVPoll.Success if self.has_sent else KVPoll.WaitingForInput

    def failure_exception(self):
        raise Exception("Fake KVSender Exception")


class FakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr: Any, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        self.state = KVPoll.Bootstrapping

    def init(self, prefill_dp_rank: int):
        self.state = KVPoll.WaitingForInput

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None):
        self.state = KVPoll.Success

    def poll(self) -> int:
        return self.state

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")
