"""The package installs offline with Debian's setuptools (``pip install
--no-deps --no-build-isolation``) and works from the installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from tests.daemon import free_port

PKG = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


@unittest.skipUnless(_has_pip(), "pip is not installed for this interpreter (Debian: python3-pip)")
class InstallTest(unittest.TestCase):
    def test_offline_install(self) -> None:
        tmp = tempfile.mkdtemp(prefix="decodeplane-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        src = os.path.join(tmp, "src")
        # A copy: the in-tree build would leave build/ and *.egg-info in the checkout.
        shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
        target = os.path.join(tmp, "site")
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                              "--no-index", "--disable-pip-version-check", "--target", target, src],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        for rel in ("decodeplane/py.typed", "decodeplane/v1/rooms_pb2.pyi", "decodeplane/v1/rooms_pb2_grpc.py",
                    "decodeplane/_vendor/rpc_status_pb2.py", "decodeplane/transfer/v1/agent_pb2.py",
                    "decodeplane/sglang/plugin.py"):
            self.assertTrue(os.path.exists(os.path.join(target, rel)), rel)
        env = dict(os.environ, PYTHONPATH=target)
        code = ("import decodeplane, decodeplane.v1.rooms_pb2 as r; "
                "print(decodeplane.__file__); print(r.OpenRoomRequest(room=7).room)")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout.splitlines(), [os.path.join(target, "decodeplane", "__init__.py"), "7"])
        # SGLang's loader finds the plugin by its entry point.
        code = ("from importlib.metadata import entry_points; "
                "print([(e.name, e.value) for e in entry_points(group='sglang.srt.plugins')])")
        eps = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
        self.assertEqual(eps.stdout.strip(), "[('decodeplane', 'decodeplane.sglang.plugin:register')]", eps.stderr)
        cli = subprocess.run([sys.executable, "-m", "decodeplane", "status", "--target", f"127.0.0.1:{free_port()}",
                              "--timeout", "2"], capture_output=True, text=True, env=env, cwd=tmp, timeout=60)
        self.assertEqual(cli.returncode, 1, cli.stdout + cli.stderr)
        self.assertIn("unavailable", cli.stderr)


if __name__ == "__main__":
    unittest.main()
