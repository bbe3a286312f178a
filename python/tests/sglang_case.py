"""The base of the SGLang plugin's tests: SGLang (the stand-in, or a real
snapshot's classes) with the plugin loaded through SGLang's own loader from
an entry point, a daemon whose pages the engine owns, and engines built per
test on fresh shared memory."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import tempfile
import unittest
from typing import Any, Optional

from tests.daemon import OWNER_SETS, Daemon
from tests.sglang_env import WAIT, Shm, use_sglang

MODE = use_sglang()

# The plugin logs what an operator should see (a session down, a refused
# declaration); the tests assert on outcomes. DECODEPLANE_TEST_LOG=1 shows it.
if not os.environ.get("DECODEPLANE_TEST_LOG"):
    logging.getLogger("decodeplane.sglang").setLevel(logging.CRITICAL)

from tests.sglang_engines import DecodeEngine, PrefillEngine, room_id  # noqa: E402 - after use_sglang

_namespaces = itertools.count(1)
_ports = itertools.count(18000)
_plugin_loaded = False

ENTRY_POINTS = """[sglang.srt.plugins]
decodeplane = decodeplane.sglang.plugin:register
"""


def load_plugin() -> None:
    """Loads the plugin as SGLang does: its loader finds the entry point
    (a distribution on sys.path whose entry_points.txt is the package's)
    and SGLANG_PLUGINS allows it; then the hooks are applied."""
    global _plugin_loaded
    if _plugin_loaded:
        return
    d = tempfile.mkdtemp(prefix="decodeplane-ep-")
    info = os.path.join(d, "decodeplane_plugin_test-0.0.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: decodeplane-plugin-test\nVersion: 0.0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(ENTRY_POINTS)
    sys.path.append(d)
    # The queues' modules bind get_kv_class by name before the hooks are
    # applied, as SGLang's do: the registry rebinds it there too.
    import sglang.srt.disaggregation.decode  # noqa: F401
    import sglang.srt.disaggregation.prefill  # noqa: F401
    from sglang.srt.plugins import load_plugins

    old = os.environ.get("SGLANG_PLUGINS")
    os.environ["SGLANG_PLUGINS"] = "decodeplane"
    try:
        load_plugins()
    finally:
        if old is None:
            os.environ.pop("SGLANG_PLUGINS", None)
        else:
            os.environ["SGLANG_PLUGINS"] = old
    _plugin_loaded = True


class SGLangCase(unittest.TestCase):
    """One daemon per class (``SETS``), engines per test."""

    SETS: tuple[str, ...] = OWNER_SETS
    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        load_plugin()
        cls.daemon = Daemon(*cls.SETS).start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()

    def setUp(self) -> None:
        from tests import sglang_movers

        self.shm = Shm()
        self.addCleanup(self.shm.close)
        self.addCleanup(sglang_movers.release_all)
        self.namespace = f"dp{os.getpid()}-{next(_namespaces)}"
        import decodeplane

        self.client = decodeplane.Client(self.daemon.addr, timeout=WAIT)
        self.addCleanup(self.client.close)

    def decode(self, tp: int = 1, **kw: Any) -> DecodeEngine:
        e = DecodeEngine(self.daemon.addr, self.shm, self.namespace, tp=tp, **kw)
        self.addCleanup(e.stop)
        return e

    def prefill(self, tp: int = 1, instance_id: Optional[str] = None, port: Optional[int] = None,
                **kw: Any) -> PrefillEngine:
        env = dict(kw.pop("env", {}))
        env["DECODEPLANE_SGLANG_INSTANCE_ID"] = instance_id or f"inst-{self.namespace}-{next(_ports)}"
        e = PrefillEngine(self.daemon.addr, self.shm, self.namespace, tp=tp, bootstrap_port=port or next(_ports),
                          env=env, **kw)
        self.addCleanup(e.stop)
        return e

    def handoff(self, p: PrefillEngine, d: DecodeEngine, prompt_len: int, rid: Optional[str] = None) -> tuple[str, int]:
        """Submits one request to both engines (decode first, as a router
        may); returns its rid and room."""
        room = room_id()
        rid = rid or f"req-{room}"
        d.submit(rid, room, prompt_len, p.bootstrap_port)
        p.submit(rid, room, prompt_len)
        return rid, room


__all__ = ["SGLangCase", "MODE", "load_plugin", "room_id"]
