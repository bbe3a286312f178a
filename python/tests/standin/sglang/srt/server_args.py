"""Stand-in: the server arguments the disaggregation code reads, and the
transfer-backend choices plugins may extend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

DISAGG_TRANSFER_BACKEND_CHOICES = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]


def add_disagg_transfer_backend_choices(choices: Iterable[str]) -> None:
    """Accepts more values of --disaggregation-transfer-backend."""
    for c in choices:
        if c not in DISAGG_TRANSFER_BACKEND_CHOICES:
            DISAGG_TRANSFER_BACKEND_CHOICES.append(c)


@dataclass
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "mooncake"
    dist_init_addr: Optional[str] = None
    nnodes: int = 1
    kv_cache_dtype: str = "auto"
    load_balance_method: str = "follow_bootstrap_room"
    enable_dp_attention: bool = False
    dp_size: int = 1
    pp_size: int = 1
    enable_dsa_cache_layer_split: bool = False
    disaggregation_decode_enable_radix_cache: bool = False
    disable_radix_cache: bool = True
