"""Stand-in of SGLang's hook registry: hooks on a dotted target (a function,
or a method of a class), applied by ``apply_hooks``; a patched function is
also rebound in every loaded module that imported it by name."""

from __future__ import annotations

import enum
import functools
import importlib
import logging
import sys
from collections import defaultdict
from typing import Any, Callable

log = logging.getLogger(__name__)


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def _wrap(fn: Callable[..., Any], hook: Callable[..., Any], kind: HookType) -> Callable[..., Any]:
    if kind is HookType.REPLACE:
        return hook
    if kind is HookType.AROUND:
        def around(*a: Any, **kw: Any) -> Any:
            return hook(fn, *a, **kw)
        w = around
    elif kind is HookType.BEFORE:
        def before(*a: Any, **kw: Any) -> Any:
            r = hook(*a, **kw)
            if r is not None:
                a, kw = r
            return fn(*a, **kw)
        w = before
    else:
        def after(*a: Any, **kw: Any) -> Any:
            r = fn(*a, **kw)
            h = hook(r, *a, **kw)
            return r if h is None else h
        w = after
    return functools.wraps(fn)(w)


class HookRegistry:
    _hooks: dict[str, list[tuple[HookType, Callable[..., Any]]]] = defaultdict(list)
    _patched: set[str] = set()

    @classmethod
    def register(cls, target: str, hook: Callable[..., Any], hook_type: HookType = HookType.AFTER) -> None:
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls) -> None:
        for target, hooks in list(cls._hooks.items()):
            if target in cls._patched:
                continue
            try:
                owner_path, name = target.rsplit(".", 1)
                owner = _resolve(owner_path)
                raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
                original = getattr(owner, name)
                fn = original
                for kind, hook in hooks:
                    fn = _wrap(fn, hook, kind)
                if isinstance(raw, staticmethod):
                    setattr(owner, name, staticmethod(fn))
                elif isinstance(raw, classmethod):
                    setattr(owner, name, classmethod(fn))
                else:
                    setattr(owner, name, fn)
                if not isinstance(owner, type):
                    for mod in list(sys.modules.values()):
                        d = getattr(mod, "__dict__", None)
                        if d is None or mod is owner:
                            continue
                        for k, v in list(d.items()):
                            if v is original:
                                setattr(mod, k, fn)
                cls._patched.add(target)
            except Exception:  # logged, as SGLang's registry does
                log.exception("failed to apply hooks to %s", target)

    @classmethod
    def reset(cls) -> None:
        cls._hooks.clear()
        cls._patched.clear()
