"""TLS, mutual TLS and the bearer token against the real daemon (a
throwaway CA made with openssl), Drain, and the status command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import decodeplane
from decodeplane.v1 import common_pb2
from tests.base import WAIT, Background, open_fields, prefill_addr, registration, room_id
from tests.daemon import Daemon

TOKEN = "s3cret-token"
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))


def make_pki(d: str) -> None:
    """A CA, a server certificate for localhost and 127.0.0.1, a client certificate."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=decodeplane test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    with open(os.path.join(d, "ext.cnf"), "w") as f:
        f.write("[server]\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                "[client]\nextendedKeyUsage=clientAuth\n")
    for name, ext in (("server", "server"), ("client", "client")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", "ext.cnf", "-extensions", ext)


@unittest.skipIf(shutil.which("openssl") is None, "openssl is not installed: no throwaway certificates for the TLS tests")
class TLSTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.pki = tempfile.mkdtemp(prefix="decodeplane-pki-")
        make_pki(cls.pki)
        cls.daemon = Daemon(f"server.auth_token={TOKEN}",
                            args=["--tls-cert", cls.path("server.crt"), "--tls-key", cls.path("server.key")]).start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
        shutil.rmtree(cls.pki, ignore_errors=True)

    @classmethod
    def path(cls, name: str) -> str:
        return os.path.join(cls.pki, name)

    def client(self, **kw: object) -> decodeplane.Client:
        kw.setdefault("tls", decodeplane.TLSConfig(ca=self.path("ca.crt")))
        kw.setdefault("timeout", WAIT)
        c = decodeplane.Client(self.daemon.addr, **kw)  # type: ignore[arg-type]
        self.addCleanup(c.close)
        return c

    def test_tls_and_token(self) -> None:
        c = self.client(token=TOKEN)
        self.assertEqual(c.admin.status().incarnation, self.daemon.incarnation)
        p = c.prefill(registration(prefill_addr()))
        self.addCleanup(p.close)
        p.register()
        room = room_id()
        send = Background(lambda: p.send_room(room, timeout=WAIT))
        got = c.engine.open_and_wait(**open_fields(room, p.rank.bootstrap_addr), timeout=WAIT)
        self.assertEqual(got.phase, common_pb2.ROOM_PHASE_SUCCEEDED)
        self.assertEqual(send.outcome().room, room)
        self.assertIsNotNone(c.engine._mux.live(), "the engine session carried the token")
        self.assertEqual(c.engine.release_room(room).pages_released, 2)

    def test_server_name(self) -> None:
        with open(self.path("ca.crt"), "rb") as f:
            ca = f.read()
        c = self.client(tls=decodeplane.TLSConfig(ca=ca, server_name="localhost"))
        self.assertTrue(c.admin.status().ready)

    def test_without_token(self) -> None:
        c = self.client()
        self.assertTrue(c.admin.status().ready)  # reads need no token
        with self.assertRaises(decodeplane.UnauthenticatedError):
            c.prefill(registration(prefill_addr())).register()
        with self.assertRaises(decodeplane.UnauthenticatedError):
            c.engine.open_and_wait(**open_fields(room_id(), prefill_addr()), timeout=WAIT)
        with self.assertRaises(decodeplane.UnauthenticatedError):
            self.client(token="wrong").admin.get_fleet()

    def test_plaintext_client(self) -> None:
        c = decodeplane.Client(self.daemon.addr, timeout=5, retry=decodeplane.RetryPolicy(max_attempts=1))
        self.addCleanup(c.close)
        with self.assertRaises(decodeplane.UnavailableError):
            c.admin.status()

    def test_status_command(self) -> None:
        env = dict(os.environ, PYTHONPATH=SRC)
        out = subprocess.run([sys.executable, "-m", "decodeplane", "status", "--target", self.daemon.addr,
                              "--tls-ca", self.path("ca.crt")], capture_output=True, text=True, env=env, timeout=WAIT)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn(f"incarnation:  {self.daemon.incarnation:x}\n", out.stdout)
        self.assertIn("ready:        true (serving)", out.stdout)
        self.assertIn("shard 0:", out.stdout)
        bad = subprocess.run([sys.executable, "-m", "decodeplane", "status", "--target", self.daemon.addr,
                              "--timeout", "5"], capture_output=True, text=True, env=env, timeout=WAIT)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("unavailable", bad.stderr)


@unittest.skipIf(shutil.which("openssl") is None, "openssl is not installed: no throwaway certificates for the TLS tests")
class MutualTLSTest(unittest.TestCase):
    def test_client_certificate(self) -> None:
        pki = tempfile.mkdtemp(prefix="decodeplane-pki-")
        self.addCleanup(shutil.rmtree, pki, True)
        make_pki(pki)
        p = lambda n: os.path.join(pki, n)  # noqa: E731
        d = Daemon(args=["--tls-cert", p("server.crt"), "--tls-key", p("server.key"), "--tls-client-ca", p("ca.crt")]).start()
        self.addCleanup(d.stop)
        with decodeplane.Client(d.addr, timeout=WAIT, tls=decodeplane.TLSConfig(
                ca=p("ca.crt"), cert=p("client.crt"), key=p("client.key"))) as c:
            self.assertEqual(c.admin.status().incarnation, d.incarnation)
        with decodeplane.Client(d.addr, timeout=5, tls=decodeplane.TLSConfig(ca=p("ca.crt")),
                                retry=decodeplane.RetryPolicy(max_attempts=1)) as c:
            with self.assertRaises(decodeplane.UnavailableError):
                c.admin.status()
        with self.assertRaises(ValueError):
            decodeplane.TLSConfig(ca=p("ca.crt"), cert=p("client.crt")).credentials()


class DrainTest(unittest.TestCase):
    def test_drain(self) -> None:
        d = Daemon(f"server.auth_token={TOKEN}").start()
        self.addCleanup(d.stop)
        with decodeplane.Client(d.addr, timeout=WAIT) as anon:
            with self.assertRaises(decodeplane.UnauthenticatedError):
                anon.admin.drain()
        with decodeplane.Client(d.addr, timeout=WAIT, token=TOKEN) as c:
            room = room_id()
            c.engine.open_room(**open_fields(room, prefill_addr()))
            self.assertEqual(c.admin.drain().rooms_in_flight, 1)
            st = c.admin.status()
            self.assertEqual((st.draining, st.ready, st.readiness), (True, False, "draining"))
            with self.assertRaises(decodeplane.UnavailableError) as cm:
                c.engine.open_room(**open_fields(room_id(), prefill_addr()))
            self.assertIn("draining", cm.exception.message)
            self.assertEqual(c.engine.abort_room(room).room.phase, common_pb2.ROOM_PHASE_FAILED)


if __name__ == "__main__":
    unittest.main()
