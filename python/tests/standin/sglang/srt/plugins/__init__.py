"""Stand-in of SGLang's plugin loader: the entry points of group
``sglang.srt.plugins`` (only the names SGLANG_PLUGINS lists, when set) are
loaded and called once per process, then the registered hooks applied."""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from sglang.srt.plugins.hook_registry import HookRegistry

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
log = logging.getLogger(__name__)
_loaded = False


def load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    allow = {n.strip() for n in os.environ.get("SGLANG_PLUGINS", "").split(",") if n.strip()}
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allow and ep.name not in allow:
            continue
        try:
            ep.load()()
        except Exception:  # a plugin's failure is logged, not raised
            log.exception("plugin %s failed", ep.name)
    HookRegistry.apply_hooks()


def reset_for_tests() -> None:
    global _loaded
    _loaded = False
