"""The plugin's registration with SGLang (its loader, its hook registry, its
TransferBackend and get_kv_class), the decode engine's startup checks,
FAKE warm-up rooms and the settings."""

from __future__ import annotations

import importlib
import sys
import unittest

from tests.sglang_case import MODE, SGLangCase, load_plugin, room_id
from tests.sglang_env import WAIT


class RegistrationTest(unittest.TestCase):
    def setUp(self) -> None:
        load_plugin()

    def test_backend_and_classes(self) -> None:
        from sglang.srt import server_args
        from sglang.srt.disaggregation import utils
        from sglang.srt.disaggregation.fake import FakeKVReceiver, FakeKVSender

        from decodeplane.sglang import classes

        self.assertIn("decodeplane", server_args.DISAGG_TRANSFER_BACKEND_CHOICES)
        be = utils.TransferBackend("decodeplane")
        self.assertIs(be, utils.TransferBackend.DECODEPLANE)
        self.assertIs(utils.TransferBackend["DECODEPLANE"], be)
        self.assertIn(be, list(utils.TransferBackend))
        # The other members keep their identity.
        self.assertIs(utils.TransferBackend("fake"), utils.TransferBackend.FAKE)
        kc = utils.KVClassType
        self.assertIs(utils.get_kv_class(be, kc.MANAGER), classes.DecodeplaneKVManager)
        self.assertIs(utils.get_kv_class(be, kc.SENDER), classes.DecodeplaneKVSender)
        self.assertIs(utils.get_kv_class(be, kc.RECEIVER), classes.DecodeplaneKVReceiver)
        self.assertIsNotNone(utils.get_kv_class(be, kc.BOOTSTRAP_SERVER))
        from sglang.srt.disaggregation.base.conn import KVArgs

        self.assertIs(utils.get_kv_class(be, kc.KVARGS), KVArgs)
        # FAKE (warm-up) and a backend without a plugin resolve as before.
        self.assertIs(utils.get_kv_class(utils.TransferBackend.FAKE, kc.RECEIVER), FakeKVReceiver)
        self.assertIs(utils.get_kv_class(utils.TransferBackend.FAKE, kc.SENDER), FakeKVSender)
        other = utils.TransferBackend.MOONCAKE if MODE == "standin" else utils.TransferBackend.FAKE
        self.assertEqual(utils.get_kv_class(other, kc.MANAGER).__module__.split(".")[-2],
                         "mooncake" if MODE == "standin" else "fake")
        with self.assertRaises(ValueError):
            utils.TransferBackend("nope")

    def test_modules_that_imported_get_kv_class_by_name(self) -> None:
        from sglang.srt.disaggregation import utils

        dec = sys.modules["sglang.srt.disaggregation.decode"]
        self.assertIs(dec.get_kv_class, utils.get_kv_class)
        self.assertIsNotNone(dec.get_kv_class(utils.TransferBackend.DECODEPLANE, utils.KVClassType.RECEIVER))

    def test_register_is_idempotent_and_light(self) -> None:
        from decodeplane.sglang import plugin

        plugin.register()
        from sglang.srt.disaggregation import utils

        self.assertEqual([m.value for m in utils.TransferBackend].count("decodeplane"), 1)
        # The entry point's module imports nothing heavy.
        src = importlib.util.find_spec("decodeplane.sglang.plugin").origin
        with open(src) as f:
            top = [ln for ln in f.read().splitlines() if ln.startswith(("import ", "from "))]
        self.assertEqual(top, ["from __future__ import annotations", "import logging", "from typing import Any"])


class WhichSGLangTest(unittest.TestCase):
    def test_modules(self) -> None:
        """Which SGLang the plugin met: with DECODEPLANE_SGLANG_SRC, SGLang's
        own loader, hook registry, utils and Common* classes (the queues stay
        the stand-in's); without, the stand-in's."""
        import os

        load_plugin()
        import sglang.srt.disaggregation.common.conn  # noqa: F401
        import sglang.srt.disaggregation.fake.conn  # noqa: F401

        real = ("sglang.srt.plugins", "sglang.srt.plugins.hook_registry", "sglang.srt.disaggregation.utils",
                "sglang.srt.disaggregation.base.conn", "sglang.srt.disaggregation.common.conn",
                "sglang.srt.disaggregation.fake.conn")
        src = os.environ.get("DECODEPLANE_SGLANG_SRC")
        for name in real:
            f = os.path.abspath(sys.modules[name].__file__ or "")
            if MODE == "real":
                assert src is not None
                self.assertTrue(f.startswith(os.path.abspath(src)), f"{name} is {f}")
            else:
                self.assertIn(os.path.join("tests", "standin"), f, name)
        self.assertIn(os.path.join("tests", "standin"), sys.modules["sglang.srt.disaggregation.decode"].__file__)


class SettingsTest(unittest.TestCase):
    def test_settings(self) -> None:
        from decodeplane.sglang.config import Settings, SettingsError

        s = Settings.from_env({"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN": "t0k", "DECODEPLANE_TARGET": "d:7600"})
        self.assertEqual((s.token, s.target, s.mover, s.rpc_timeout), ("t0k", "d:7600", "shm", 30.0))
        self.assertEqual(s.fleet, "auto")
        self.assertEqual(Settings.from_env({"DECODEPLANE_SGLANG_FLEET": "On"}).fleet, "on")
        with self.assertRaises(SettingsError) as cm:
            Settings.from_env({"DECODEPLANE_SGLANG_FLEET": "yes"})
        self.assertEqual(str(cm.exception), "decodeplane: DECODEPLANE_SGLANG_FLEET='yes' is not one of auto, on, off; use "
                         "on for a fleet of decode daemons (registry.backend etcd), off for one decode daemon, or auto to "
                         "ask the daemon")
        bad = {
            "DECODEPLANE_SGLANG_MOVER": "rdma",
            "DECODEPLANE_SGLANG_BOOTSTRAP_ADDR": "host",
            "DECODEPLANE_SGLANG_RPC_TIMEOUT": "0",
            "DECODEPLANE_SGLANG_MOVER_THREADS": "x",
            "DECODEPLANE_SGLANG_NAMESPACE": "a/b",
            "DECODEPLANE_TLS_CERT": "/c.pem",
            "DECODEPLANE_SGLANG_FLEET": "yes",
        }
        for k, v in bad.items():
            with self.assertRaises(SettingsError) as cm:
                Settings.from_env({k: v})
            self.assertIn(k if k != "DECODEPLANE_TLS_CERT" else "DECODEPLANE_TLS_KEY", str(cm.exception))


class StartupTest(SGLangCase):
    def test_daemon_that_owns_its_pages_is_refused(self) -> None:
        from tests.daemon import Daemon

        d = Daemon().start()
        self.addCleanup(d.stop)
        from tests.sglang_engines import DecodeEngine

        with self.assertRaises(RuntimeError) as cm:
            DecodeEngine(d.addr, self.shm, self.namespace)
        self.assertIn("kv_pool.owner is daemon: set kv_pool.owner: engine", str(cm.exception))
        self.assertIn("page_size is 64, this engine's --page-size 16", str(cm.exception))

    def test_private_memory_is_refused(self) -> None:
        """The shm mover needs the decode buffers in shared memory: private
        memory (as GPU memory would be) is refused at startup, saying what is
        missing."""
        from tests.sglang_engines import DecodeEngine
        from tests.sglang_env import _memory

        class Private(DecodeEngine):
            @property
            def zeros(self):  # type: ignore[override]
                return _memory

        with self.assertRaises(RuntimeError) as cm:
            Private(self.daemon.addr, self.shm, self.namespace)
        msg = str(cm.exception)
        self.assertIn("is not in a shared-memory file", msg)
        self.assertIn("GPU buffers need a GPU transfer agent", msg)

    def test_fake_rooms_pass_through(self) -> None:
        d = self.decode()
        room = room_id()
        d.submit("warmup", room, 20, 8998, host="2.2.2.2")
        [req] = d.outcome("warmup")
        self.assertIsNotNone(req.committed)  # the fake backend's receiver: Success after send_metadata
        self.assertIsNone(d.manager().dp_decode.state(room))  # the plugin never saw it
        import decodeplane

        with self.assertRaises(decodeplane.NotFoundError):
            self.client.engine.get_room(room)

    def test_capacity_reported(self) -> None:
        d = self.decode(pages=40)
        with self.client.admin.watch_capacity(min_interval=0.02, keepalive=1, timeout=WAIT) as w:
            got = None
            for u in w:
                if u.shards and u.shards[0].blocked_by != "engine_unreported":
                    got = u.shards[0]
                    break
        assert got is not None
        self.assertEqual((got.tokens_free, got.pages_free, got.req_slots_free), (40 * 16, 40, 16))
        d.check()
