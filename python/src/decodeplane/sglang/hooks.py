"""The hooks the decode side installs on SGLang's DecodePreallocQueue, with
SGLang's HookRegistry, when a decodeplane decode manager starts (the
queue's module is loaded by then):

* around ``_create_receiver_and_enqueue(req, ...)``: the receiver SGLang
  builds next is told its request (rid, prompt and output lengths,
  max_new_tokens, priority, the router's DP hint), which OpenRoom needs and
  the receiver's constructor is not given;
* around ``pop_preallocated(...)``: after each pass the leader rank
  reports what the engine has free (ReportCapacity), read from the queue's
  allocators.

Both call SGLang's method as is for a queue whose manager is not
decodeplane's.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Any

from decodeplane.sglang.decode import RequestInfo
from decodeplane.v1 import capacity_pb2

__all__ = ["install_decode_hooks", "QUEUE"]

log = logging.getLogger("decodeplane.sglang")

#: SGLang's decode prealloc queue.
QUEUE = "sglang.srt.disaggregation.decode.DecodePreallocQueue"
_lock = threading.Lock()
_installed = False
_warned: set[str] = set()


def install_decode_hooks() -> None:
    """Registers and applies both hooks (once per process). Raises
    RuntimeError when SGLang's plugin system or the queue's methods are not
    there (an SGLang this plugin does not know)."""
    global _installed
    with _lock:
        if _installed:
            return
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType
        except ImportError as e:
            raise RuntimeError(f"decodeplane: SGLang's plugin system (sglang.srt.plugins) is missing: {e}") from e
        mod_name, _, cls_name = QUEUE.rpartition(".")
        cls = getattr(importlib.import_module(mod_name), cls_name)
        hooks = {"_create_receiver_and_enqueue": _capture_request, "pop_preallocated": _report_capacity}
        before = {}
        for name, fn in hooks.items():
            if name not in cls.__dict__:
                raise RuntimeError(f"decodeplane: SGLang's {QUEUE} has no {name}: an SGLang this plugin does not know")
            before[name] = cls.__dict__[name]
            HookRegistry.register(f"{QUEUE}.{name}", fn, HookType.AROUND)
        HookRegistry.apply_hooks()
        for name, orig in before.items():
            if cls.__dict__.get(name) is orig:
                raise RuntimeError(f"decodeplane: SGLang's HookRegistry did not hook {QUEUE}.{name} (see its log)")
        _installed = True


def _side(queue: Any) -> Any:
    return getattr(getattr(queue, "kv_manager", None), "dp_decode", None)


def _addr(req: Any) -> str:
    host, port = str(req.bootstrap_host), int(req.bootstrap_port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _capture_request(original: Any, queue: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    side = _side(queue)
    room = getattr(req, "bootstrap_room", None)
    if side is None or room is None:
        return original(queue, req, *args, **kwargs)
    rebootstrap = bool(kwargs.get("is_rebootstrap", args[0] if args else False))
    side.capture(int(room), RequestInfo.from_req(req, _addr(req), rebootstrap))
    try:
        return original(queue, req, *args, **kwargs)
    finally:
        side.uncapture(int(room))


def _report_capacity(original: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
    out = original(queue, *args, **kwargs)
    side = _side(queue)
    if side is not None and side.leader:
        try:
            side.report_capacity(figures(queue))
        except (AttributeError, TypeError) as e:  # SGLang renamed something: capacity is not worth a crash
            key = type(e).__name__ + str(e)
            if key not in _warned:
                _warned.add(key)
                log.warning("decodeplane: cannot read the engine's free figures for ReportCapacity: %s", e)
    return out


def figures(queue: Any) -> capacity_pb2.ReportCapacityRequest:
    """What the engine has free, from SGLang's decode prealloc queue."""
    alloc = queue.token_to_kv_pool_allocator
    tokens = max(int(alloc.available_size()), 0)
    page = max(int(getattr(alloc, "page_size", 1) or 1), 1)
    running = getattr(getattr(getattr(queue, "scheduler", None), "running_batch", None), "reqs", None) or []
    return capacity_pb2.ReportCapacityRequest(
        tokens_free=min(tokens, 1 << 40), pages_free=min(tokens // page, 1 << 40),
        req_slots_free=min(max(int(queue.req_to_token_pool.available_size()), 0), (1 << 31) - 1),
        metadata_slots_free=min(max(int(queue.req_to_metadata_buffer_idx_allocator.available_size()), 0), (1 << 31) - 1),
        queue_depth=min(len(queue.queue), (1 << 31) - 1), running=min(len(running), (1 << 31) - 1))
