"""The transfer backend's classes, as SGLang's ``get_kv_class`` hands them out
for ``--disaggregation-transfer-backend decodeplane``: subclasses of
SGLang's ``Common*`` classes (the schedulers use more than the abstract
bases: ``prefill_info_table``, ``try_ensure_parallel_info``,
``conclude_state``, ``require_staging``, ...), which forward every call to
the plugin's SGLang-free cores (:mod:`decodeplane.sglang.decode`,
:mod:`decodeplane.sglang.prefill`). Imported only when SGLang asks for the
backend. Every method accepts extra arguments: SGLang's signatures grow
(``send(..., token_position_offset)``).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Optional

from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common import conn as common_conn
from sglang.srt.disaggregation.common.conn import (
    CommonKVBootstrapServer,
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
)
from sglang.srt.disaggregation.utils import DisaggregationMode

from decodeplane.sglang import hooks
from decodeplane.sglang.buffers import EngineBuffers
from decodeplane.sglang.config import Settings, make_client
from decodeplane.sglang.decode import STATE_TYPES, DecodeSide, TransferFailed
from decodeplane.sglang.decode import state_indices as declared_state
from decodeplane.sglang.mover import RankBuffers, load_mover
from decodeplane.sglang.prefill import PrefillSide, SenderCore
from decodeplane.v1 import bootstrap_pb2

__all__ = ["DecodeplaneKVManager", "DecodeplaneKVSender", "DecodeplaneKVReceiver", "kv_class"]

log = logging.getLogger("decodeplane.sglang")


def kv_class(class_type: Any) -> Any:
    """The class of ``class_type`` (SGLang's KVClassType) for this backend."""
    name = getattr(class_type, "name", str(class_type)).upper()
    return {
        "KVARGS": KVArgs,
        "MANAGER": DecodeplaneKVManager,
        "SENDER": DecodeplaneKVSender,
        "RECEIVER": DecodeplaneKVReceiver,
        "BOOTSTRAP_SERVER": CommonKVBootstrapServer,
    }.get(name)


def _state_names(kv_args: Any) -> list[str]:
    return [str(getattr(t, "value", t)) for t in (getattr(kv_args, "state_types", None) or [])]


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _instance_id(server_args: Any) -> str:
    """This prefill instance's id: the host and the launcher process (the
    parent of every scheduler process), so that a restart is a new one.
    Several nodes share the id of the first node's launcher."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    mine = f"{socket.gethostname()}-{ppid}-{started}"
    if int(getattr(server_args, "nnodes", 1) or 1) > 1:
        try:
            from sglang.srt.distributed import get_world_group

            return str(get_world_group().broadcast_object(mine, src=0))
        except Exception as e:  # noqa: BLE001
            raise RuntimeError("decodeplane: a prefill instance on several nodes needs one instance id on every node: "
                               f"set DECODEPLANE_SGLANG_INSTANCE_ID (a new value at each start) ({e})") from e
    return mine


class DecodeplaneKVManager(CommonKVManager):
    """SGLang's KV manager for the decodeplane backend: one per scheduler
    process. DECODE: a :class:`~decodeplane.sglang.decode.DecodeSide`
    (EngineSession, rooms, capacity) and the decode rank's buffers made
    reachable by the mover. PREFILL: a
    :class:`~decodeplane.sglang.prefill.PrefillSide` (registration,
    heartbeat, claims, the mover)."""

    def __init__(self, args: KVArgs, disaggregation_mode: DisaggregationMode, server_args: Any,
                 is_mla_backend: Optional[bool] = False, *rest: Any, **kwargs: Any) -> None:
        self.dp_settings = Settings.from_env()
        self.dp_decode: Optional[DecodeSide] = None
        self.dp_prefill: Optional[PrefillSide] = None
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if disaggregation_mode == DisaggregationMode.DECODE:
            self._start_decode()

    # ---- decode ----

    @property
    def decode_dp_rank(self) -> int:
        return int(self.attn_dp_rank if (self.attn_dp_size or 1) > 1 else (self.system_dp_rank or 0))

    def _start_decode(self) -> None:
        s = self.dp_settings
        names = _state_names(self.kv_args)
        bad = [n for n in names if n not in STATE_TYPES]
        if bad:
            raise RuntimeError(f"decodeplane: this model's state types {bad} are not declared by decodeplane "
                               f"(allowed: {', '.join(STATE_TYPES)})")
        leader = self.attn_tp_rank == 0 and self.attn_cp_rank == 0 and (self.pp_rank or 0) == 0
        side = DecodeSide(s, make_client(s), dp_rank=self.decode_dp_rank, tp_rank=self.attn_tp_rank, leader=leader)
        try:
            st = side.check(int(self.kv_args.page_size), int(self.attn_tp_size), s.rpc_timeout)
            side.open_bound = float(getattr(self, "waiting_timeout", 300) or 300)
            side._resync_done = (st.layout.dp_size or 1) <= 1
            mover = load_mover(s)
            mover.start_decode(RankBuffers(self.decode_dp_rank, self.attn_tp_rank,
                                           EngineBuffers.from_kv_args(self.kv_args), state_types=names,
                                           daemon=side.advertised_address(s.rpc_timeout)))
            hooks.install_decode_hooks()
        except BaseException:
            side.close()
            raise
        self.dp_mover = mover
        side.start(st.incarnation)
        self.dp_decode = side
        log.info("decodeplane: decode rank dp %d tp %d (%s) on %s", self.decode_dp_rank, self.attn_tp_rank,
                 "leader" if leader else "follower", s.target)

    def _table_entry(self, bootstrap_addr: str) -> Any:
        """The prefill_info_table entry of an instance: decodeplane resolves the
        prefill's DP rank itself (so SGLang's fast path answers at once and its
        /query_dp_ranks is never asked) and maps its ranks."""
        info = common_conn.PrefillServerInfo(
            attn_tp_size=self.attn_tp_size, attn_cp_size=1, dp_size=1, pp_size=1,
            page_size=self.kv_args.page_size, kv_cache_dtype=getattr(self.server_args, "kv_cache_dtype", None),
            follow_bootstrap_room=True)
        for k, v in (("target_tp_rank", self.attn_tp_rank), ("target_tp_ranks", [self.attn_tp_rank]),
                     ("target_cp_ranks", [0]), ("target_pp_ranks", [0]), ("required_dst_info_num", 1),
                     ("required_prefill_response_num", 1)):
            if hasattr(info, k):
                setattr(info, k, v)
        return info

    def try_ensure_parallel_info(self, bootstrap_addr: str, *args: Any, **kwargs: Any) -> bool:
        if bootstrap_addr not in self.prefill_info_table:
            self.prefill_info_table[bootstrap_addr] = self._table_entry(bootstrap_addr)
        return True

    # ---- prefill ----

    def register_to_bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """The prefill rank registers with decodeplane (and keeps its
        heartbeat); SGLang's own bootstrap server is not used."""
        s = self.dp_settings
        host = str(getattr(self.server_args, "host", "") or "")
        if host in ("", "0.0.0.0", "::"):
            host = self.local_ip
        addr = s.bootstrap_addr or _host_port(host, int(self.bootstrap_port))
        par = bootstrap_pb2.ParallelInfo(
            attn_tp_size=self.attn_tp_size, attn_tp_rank=self.attn_tp_rank, attn_cp_size=self.attn_cp_size or 1,
            attn_cp_rank=self.attn_cp_rank or 0, attn_dp_size=self.attn_dp_size or 1, attn_dp_rank=self.attn_dp_rank or 0,
            pp_size=self.pp_size or 1, pp_rank=self.pp_rank or 0, system_dp_size=self.system_dp_size or 1,
            system_dp_rank=self.system_dp_rank or 0)
        lbm = str(getattr(self.server_args, "load_balance_method", "") or "")
        reg = bootstrap_pb2.RegisterPrefillRequest(
            bootstrap_addr=addr, rank_endpoint=_host_port(self.local_ip, int(self.rank_port)), parallel=par,
            page_size=int(self.kv_args.page_size), kv_cache_dtype=str(getattr(self.server_args, "kv_cache_dtype", "auto")),
            load_balance_method=lbm if lbm in _LB_METHODS else "", prefill_http_port=int(getattr(self.server_args, "port", 0) or 0),
            enable_dsa_cache_layer_split=bool(getattr(self.server_args, "enable_dsa_cache_layer_split", False)),
            instance_id=s.instance_id or _instance_id(self.server_args))
        mover = load_mover(s)  # refuses buffers it cannot read before anything is registered
        mover.start_prefill(RankBuffers(self.system_dp_rank or 0, self.attn_tp_rank, EngineBuffers.from_kv_args(self.kv_args),
                                        start_layer=int(getattr(self.kv_args, "prefill_start_layer", 0) or 0),
                                        state_types=_state_names(self.kv_args)))
        side = PrefillSide(s, make_client(s), reg, mover)
        try:
            side.start()
        except BaseException:
            side.close()
            raise
        self.dp_prefill = side
        log.info("decodeplane: prefill rank %s tp %d registered with %s%s", addr, self.attn_tp_rank, s.target,
                 " (a fleet: every daemon of it offers its rooms)" if side.fleet else "")


_LB_METHODS = {"follow_bootstrap_room", "round_robin", "shortest_queue", "minimum_tokens", "total_requests",
               "total_tokens", "auto"}


class DecodeplaneKVReceiver(CommonKVReceiver):
    """A decode rank's receiver of one request (see
    :mod:`decodeplane.sglang.decode`)."""

    def __init__(self, mgr: DecodeplaneKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None,
                 *args: Any, **kwargs: Any) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        side = mgr.dp_decode
        assert side is not None, "decodeplane: a receiver of a manager not in DECODE mode"
        self._side = side
        mgr.try_ensure_parallel_info(bootstrap_addr)
        self._st = side.track(int(bootstrap_room or 0))

    def init(self, prefill_dp_rank: int = 0, *args: Any, **kwargs: Any) -> None:
        self.prefill_dp_rank = prefill_dp_rank
        self.prefill_info = self.kv_mgr.prefill_info_table.get(self.bootstrap_addr)
        self._side.init(self._st)

    def send_metadata(self, kv_indices: Any, aux_index: Optional[int] = None, state_indices: Optional[list[Any]] = None,
                      decode_prefix_len: Optional[int] = None, *args: Any, **kwargs: Any) -> None:
        try:
            state = declared_state(getattr(self.kv_mgr.kv_args, "state_types", None) or [], state_indices)
        except ValueError as e:
            state = []
            self._st.fail(str(e), wait_daemon=False)
        self._side.declare(self._st, list(kv_indices), -1 if aux_index is None else aux_index, state,
                           int(decode_prefix_len or 0))

    def poll(self) -> int:
        return self._side.poll(self._st)

    def failure_exception(self) -> None:
        msg, other = self._side.failure(self._st)
        raise TransferFailed(self._st.room, msg, other)

    def abort(self, *args: Any, **kwargs: Any) -> None:
        self.conclude_state = KVPoll.Failed
        self._side.abort(self._st)

    def clear(self, *args: Any, **kwargs: Any) -> None:
        self._side.clear(self._st)
        super().clear()


class DecodeplaneKVSender(CommonKVSender):
    """A prefill rank's sender of one request (see
    :mod:`decodeplane.sglang.prefill`). A CP rank that does not send (SGLang's
    dummy CP ranks) makes no claim: it waits for its last chunk."""

    def __init__(self, mgr: DecodeplaneKVManager, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: Any,
                 pp_rank: int, req_has_disagg_prefill_dp_rank: bool = False, *args: Any, **kwargs: Any) -> None:
        self._core: Optional[SenderCore] = None
        self._passive_done = False
        super().__init__(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank, req_has_disagg_prefill_dp_rank)
        side = mgr.dp_prefill
        assert side is not None, "decodeplane: a sender of a manager not in PREFILL mode"
        if getattr(mgr, "is_dummy_cp_rank", False):
            return
        self._core = SenderCore(side, int(bootstrap_room), bootstrap_addr,
                                bootstrap_timeout=float(getattr(mgr, "bootstrap_timeout", 300) or 300))
        if mgr.request_status.get(bootstrap_room) == KVPoll.Failed:  # SGLang's own check failed it (follow_bootstrap_room)
            self._core.fail(mgr.failure_records.get(bootstrap_room, f"room {bootstrap_room} failed"))

    def _register_prefill_dp_rank(self, *args: Any, **kwargs: Any) -> None:
        mgr = self.kv_mgr
        side, addr = mgr.dp_prefill, self.bootstrap_server_url
        room = self.bootstrap_room

        def bind() -> None:
            try:
                side.bind_room(addr, room)
            except Exception as e:  # noqa: BLE001 - the room then waits for its DP rank and fails with the reason
                log.warning("decodeplane: room %d: BindRoom failed: %s", room, e)
        mgr.dp_prefill.pool.submit(bind)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None, *args: Any, **kwargs: Any) -> None:
        super().init(num_kv_indices, aux_index)
        if self._core is not None:
            self._core.init(num_kv_indices, aux_index)

    def pop_decode_prefix_len(self, *args: Any, **kwargs: Any) -> int:
        return self._core.decode_prefix_len() if self._core is not None else 0

    def send(self, kv_indices: Any, state_indices: Optional[list[Any]] = None, *args: Any, **kwargs: Any) -> None:
        if hasattr(self, "_record_transfer_indices"):
            self._record_transfer_indices(kv_indices, state_indices)
        if self._core is not None:
            self._core.send(kv_indices, state_indices)
            return
        self.curr_idx += len(kv_indices)
        if self.curr_idx >= getattr(self, "num_kv_indices", 0):
            self._passive_done = True

    def poll(self) -> int:
        if self._core is None:
            return KVPoll.Success if self._passive_done else KVPoll.WaitingForInput
        return self._core.poll()

    def failure_exception(self) -> None:
        c = self._core
        msg = c.failure if c is not None and c.failure else f"room {self.bootstrap_room} failed"
        raise TransferFailed(self.bootstrap_room, msg, c.from_other if c is not None else True)

    def get_transfer_metric(self) -> Any:
        m = super().get_transfer_metric()
        if self._core is not None:
            secs = self._core.transfer_seconds()
            if secs is not None and hasattr(m, "transfer_latency_s"):
                m.transfer_latency_s = secs
        return m

    def abort(self, *args: Any, **kwargs: Any) -> None:
        self.conclude_state = KVPoll.Failed
        if self._core is not None:
            self._core.abort()

    def clear(self, *args: Any, **kwargs: Any) -> None:
        if self._core is not None:
            self._core.clear()
        super().clear()
