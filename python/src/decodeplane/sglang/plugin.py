"""SGLang's entry point (group ``sglang.srt.plugins``, name ``decodeplane``):
:func:`register` makes ``--disaggregation-transfer-backend decodeplane`` a
transfer backend of an unmodified SGLang.

SGLang's ``load_plugins()`` (the launcher, the engine and every scheduler
process) calls :func:`register` and then applies the hooks registered
with its ``HookRegistry``. register:

1. adds ``decodeplane`` to SGLang's transfer-backend choices
   (``server_args.add_disagg_transfer_backend_choices``);
2. makes ``TransferBackend("decodeplane")`` resolve: a ``DECODEPLANE``
   member is added to SGLang's closed ``TransferBackend`` enum in place
   (the other members keep their identity);
3. registers an AROUND hook on
   ``sglang.srt.disaggregation.utils.get_kv_class`` that answers the
   plugin's classes (:mod:`decodeplane.sglang.classes`) for that backend
   and calls SGLang's own for every other (FAKE warm-up rooms included).

Nothing heavy is imported here: SGLang's modules when :func:`register`
runs, the plugin's classes (and gRPC) only when SGLang asks for them.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["register", "BACKEND", "add_backend_member", "get_kv_class_hook"]

log = logging.getLogger("decodeplane.sglang")

#: The transfer backend's name (``--disaggregation-transfer-backend``).
BACKEND = "decodeplane"
#: Its member name in SGLang's TransferBackend enum.
MEMBER = "DECODEPLANE"
_GET_KV_CLASS = "sglang.srt.disaggregation.utils.get_kv_class"

_registered = False


def register() -> None:
    """SGLang's plugin function (see the module documentation). Idempotent."""
    global _registered
    if _registered:
        return
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import add_disagg_transfer_backend_choices

    add_disagg_transfer_backend_choices([BACKEND])
    add_backend_member(disagg_utils.TransferBackend)
    HookRegistry.register(_GET_KV_CLASS, get_kv_class_hook, HookType.AROUND)
    _registered = True
    log.info("decodeplane: transfer backend %r registered with SGLang", BACKEND)


def add_backend_member(enum_cls: Any, name: str = MEMBER, value: str = BACKEND) -> Any:
    """Adds member ``name`` = ``value`` to the enum class ``enum_cls`` in
    place (``enum_cls(value)``, ``enum_cls[name]``, ``enum_cls.name`` and
    iteration see it) and returns it; the existing member when there is
    one."""
    existing = enum_cls._value2member_map_.get(value)
    if existing is not None:
        return existing
    member = object.__new__(enum_cls)
    member._name_ = name
    member._value_ = value
    member._sort_order_ = len(enum_cls._member_names_)
    member.__objclass__ = enum_cls
    enum_cls._member_names_.append(name)
    enum_cls._member_map_[name] = member
    enum_cls._value2member_map_[value] = member
    type.__setattr__(enum_cls, name, member)
    return member


def is_ours(transfer_backend: Any) -> bool:
    """Whether SGLang asks for the decodeplane backend."""
    value = getattr(transfer_backend, "value", transfer_backend)
    return isinstance(value, str) and value == BACKEND


def get_kv_class_hook(original: Any, transfer_backend: Any, class_type: Any, *args: Any, **kwargs: Any) -> Any:
    """The AROUND hook on get_kv_class: the plugin's classes for the
    decodeplane backend, SGLang's own for every other."""
    if not is_ours(transfer_backend):
        return original(transfer_backend, class_type, *args, **kwargs)
    from decodeplane.sglang import classes

    return classes.kv_class(class_type)
