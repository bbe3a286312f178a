"""SGLang's own classes for the plugin's tests, from a snapshot of SGLang's
source named by DECODEPLANE_SGLANG_SRC (the directory holding
``python/sglang``; TESTING.md says how to make one; nothing of it is
committed here), on a CPU machine with Debian's packages (python3-torch,
-zmq, -aiohttp, -requests, -psutil).

What is SGLang's own: the plugin loader (``sglang.srt.plugins``), its
``HookRegistry``, ``TransferBackend`` and ``get_kv_class``,
``MetadataBuffers``, ``poll_and_all_reduce`` (on a gloo group),
``base.conn`` and ``common.conn`` (the ``Common*`` classes the plugin's
subclass), ``fake.conn``, ``environ``. What stays the stand-in's: the
modules SGLang's import closure cannot load here — ``sglang/__init__.py``
is skipped, and small stand-ins replace ``sglang.srt.utils`` (its package
init), ``server_args``, ``configs.model_config``, ``distributed``,
``layers.dp_attention``, and the decode and prefill queues (their real
modules import the model runtime). torch 1.13 lacks ``torch.uint64`` and
``Tensor.nbytes``, which MetadataBuffers uses: two shims add them. The
attention-TP ranks are threads of one process here: each rank's manager is
built under SGLang's ``get_parallel().override(...)``, and its polls are
all-reduced by SGLang's ``poll_and_all_reduce`` on a one-process gloo group,
then by MIN across the rank threads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import types
from typing import Any, Callable, Iterator

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "standin", "sglang", "srt")
_gloo_lock = threading.Lock()
_gloo_ready = False


def _package(name: str, path: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = [path]  # type: ignore[attr-defined]
    sys.modules[name] = m
    return m


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


class _Group:
    """A distributed group coordinator of one rank."""

    rank_in_group = 0
    world_size = 1
    is_first_rank = True
    is_last_rank = True

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj


def install(src: str) -> None:
    """Makes ``import sglang`` load the snapshot at ``src`` as described."""
    root = os.path.join(os.path.abspath(src), "python", "sglang")
    if not os.path.isdir(os.path.join(root, "srt", "disaggregation")):
        raise RuntimeError(f"DECODEPLANE_SGLANG_SRC={src}: no python/sglang/srt/disaggregation there")
    import torch

    if not hasattr(torch, "uint64"):
        torch.uint64 = torch.int64  # type: ignore[attr-defined]
    if not hasattr(torch.Tensor, "nbytes"):
        torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())  # type: ignore[attr-defined]
    # SGLang's Common manager binds a ZMQ socket in its own context; pyzmq's
    # Context.__del__ terminates the context when the test process collects a
    # manager (one whose construction a test made fail, or an engine's after
    # its test), which blocks while the socket is open. An SGLang process
    # never collects its manager: here the contexts live to the end.
    import zmq

    zmq.Context.__del__ = lambda self: None  # type: ignore[method-assign]
    _package("sglang", root)
    _package("sglang.srt", os.path.join(root, "srt"))
    utils = _package("sglang.srt.utils", os.path.join(root, "srt", "utils"))
    for fn in ("is_hip", "is_npu", "is_cuda", "is_xpu", "is_cpu"):
        setattr(utils, fn, lambda: False)
    utils.get_bool_env_var = lambda name, default="false": os.environ.get(name, default).lower() in ("1", "true")
    _load("sglang.srt.server_args", os.path.join(STANDIN, "server_args.py"))
    _package("sglang.srt.configs", os.path.join(root, "srt", "configs"))
    _module("sglang.srt.configs.model_config", get_dsa_index_topk=lambda *a, **k: 0)
    ps = _module("sglang.srt.distributed.parallel_state",
                 **{n: (lambda: 1) if n.endswith("world_size") else (lambda: 0) for n in (
                     "get_world_size", "get_world_rank", "get_tensor_model_parallel_world_size",
                     "get_tensor_model_parallel_rank", "get_pipeline_model_parallel_world_size",
                     "get_pipeline_model_parallel_rank", "get_attn_tensor_model_parallel_world_size",
                     "get_attn_tensor_model_parallel_rank", "get_attn_context_model_parallel_world_size",
                     "get_attn_context_model_parallel_rank")})
    _module("sglang.srt.distributed", parallel_state=ps, get_pp_group=_Group, get_world_group=_Group)
    _package("sglang.srt.layers", os.path.join(root, "srt", "layers"))
    _module("sglang.srt.layers.dp_attention", get_attention_dp_rank=lambda: 0, get_attention_dp_size=lambda: 1)
    # The queues: the stand-in's, under SGLang's names.
    _load("sglang.srt.disaggregation.decode", os.path.join(STANDIN, "disaggregation", "decode.py"))
    _load("sglang.srt.disaggregation.prefill", os.path.join(STANDIN, "disaggregation", "prefill.py"))


def parallel(tp: int, rank: int) -> "contextlib.AbstractContextManager[Any]":
    """SGLang's runtime parallel context forced to one attention-TP rank
    (what the real Common manager reads while it is built)."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(attn_tp_size=tp, attn_tp_rank=rank, attn_cp_size=1, attn_cp_rank=0)


def gloo_group() -> Any:
    """A gloo group of this process alone: SGLang's poll_and_all_reduce
    all-reduces on it (the ranks' MIN across threads is the bench's)."""
    global _gloo_ready
    import torch.distributed as dist

    with _gloo_lock:
        if not _gloo_ready:
            from tests.daemon import free_port

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
            _gloo_ready = True
        return dist.new_group(ranks=[0], backend="gloo")


def metadata_buffers(size: int, hidden: int, zeros: Callable[[tuple[int, ...], Any], np.ndarray]) -> Any:
    """SGLang's MetadataBuffers with every buffer moved into ``zeros``'s
    memory (shared memory on decode), same shapes and dtypes."""
    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    mb = MetadataBuffers(size, hidden, torch.float16, max_top_logprobs_num=8, max_sampling_mask_tokens=0)
    for name, value in list(vars(mb).items()):
        if isinstance(value, torch.Tensor):
            arr = zeros(tuple(value.shape), _np_dtype(value.dtype))
            setattr(mb, name, torch.from_numpy(arr))
    return mb


def _np_dtype(dt: Any) -> Any:
    import torch

    return {torch.int32: np.int32, torch.int64: np.int64, torch.float32: np.float32,
            torch.float16: np.float16}[dt]


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield
