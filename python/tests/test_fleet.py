"""A prefill of a fleet through the Python client (FleetPrefill) against the
real binaries: a development etcd (bin/decodeplane-dev-etcd) and decode
daemons sharing their registry on it. The prefill registers through the
first daemon only and is never told which daemon holds a room."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import unittest
import uuid
from typing import Optional

import decodeplane
from decodeplane.v1 import common_pb2
from tests.base import WAIT, Background, open_fields, poll, prefill_addr, registration, room_id
from tests.daemon import BIN, Daemon, clean_env, free_port

SUCCEEDED = common_pb2.ROOM_PHASE_SUCCEEDED
ETCD_BIN = os.path.join(os.path.dirname(BIN), "decodeplane-dev-etcd")


class DevEtcd:
    """bin/decodeplane-dev-etcd on a free loopback port."""

    def __init__(self) -> None:
        self.endpoint = f"http://127.0.0.1:{free_port()}"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self, timeout: float = 30.0) -> "DevEtcd":
        if not os.path.exists(ETCD_BIN):
            raise RuntimeError(f"no development etcd at {ETCD_BIN}: run 'make build'")
        self._out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([ETCD_BIN, "--listen", self.endpoint.removeprefix("http://")],
                                     stdout=self._out, stderr=subprocess.STDOUT, env=clean_env())
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"decodeplane-dev-etcd exited ({self.proc.returncode}): {self.output()}")
            if "etcd: http://" in self.output():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"decodeplane-dev-etcd did not start within {timeout}s: {self.output()}")

    def output(self) -> str:
        self._out.seek(0)
        return self._out.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self._out.close()


def fleet_daemon(etcd: DevEtcd, prefix: str, *sets: str) -> Daemon:
    """A decode daemon of the fleet: the etcd registry, advertised at its
    own address (and ``sets``)."""
    port = free_port()
    return Daemon(*sets, "registry.backend=etcd", f"registry.etcd.endpoints={etcd.endpoint}",
                  f"registry.etcd.advertise_address=127.0.0.1:{port}", f"registry.etcd.prefix={prefix}",
                  "registry.etcd.lease_ttl=6s", "registry.etcd.request_timeout=1s", "timeouts.heartbeat_interval=2s",
                  port=port)


class FleetCase(unittest.TestCase):
    """A development etcd and two decode daemons on it, for the class."""

    etcd: DevEtcd
    daemons: list[Daemon]

    @classmethod
    def setUpClass(cls) -> None:
        cls.etcd = DevEtcd().start()
        prefix = f"/py-fleet-{uuid.uuid4().hex[:8]}/"
        cls.daemons = []
        try:
            for _ in range(2):
                cls.daemons.append(fleet_daemon(cls.etcd, prefix).start())
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        for d in cls.daemons:
            d.stop()
        cls.etcd.stop()

    def setUp(self) -> None:
        self.clients = [self.client(d) for d in self.daemons]
        poll("both daemons in the registry", lambda: all(len(c.admin.get_fleet().daemons) == 2 for c in self.clients))

    def client(self, d: Daemon) -> decodeplane.Client:
        c = decodeplane.Client(d.addr, timeout=WAIT)
        self.addCleanup(c.close)
        return c

    def fleet_ranks(self, tp_size: int, **kw: object) -> list[decodeplane.FleetPrefill]:
        """A prefill instance of tp_size ranks, each a FleetPrefill seeded
        with the first daemon, with sessions with both daemons."""
        addr = prefill_addr()
        ranks = []
        for r in range(tp_size):
            f = decodeplane.FleetPrefill(self.daemons[0].addr, registration(addr, tp_size, r), refresh=0.5, **kw)  # type: ignore[arg-type]
            self.addCleanup(f.close)
            ranks.append(f.start())
        for f in ranks:
            poll("the rank's sessions with both daemons",
                 lambda f=f: sorted(d.address for d in f.daemons() if d.session) == sorted(d.addr for d in self.daemons))
        return ranks


class FleetPrefillTest(FleetCase):
    def test_rooms_on_both_daemons(self) -> None:
        """Two decode engines (one per daemon) open rooms; the prefill's two
        ranks, registered through the first daemon, hand each off knowing
        only the room: each succeeds on its daemon, with its daemon's
        incarnation, and owner() names the daemon."""
        ranks = self.fleet_ranks(2)
        addr = ranks[0].seed.rank.bootstrap_addr
        for i in range(8):
            d, c = self.daemons[i % 2], self.clients[i % 2]
            room = room_id()
            sends = [Background(lambda f=f: f.send_room(room, chunk_pages=2, output_ids=[7], timeout=WAIT)) for f in ranks]
            got = c.engine.open_and_wait(**open_fields(room, addr, prompt_len=300), timeout=WAIT)
            self.assertEqual((got.room, got.phase), (room, SUCCEEDED))
            for s in sends:
                self.assertEqual(s.outcome().incarnation, d.incarnation)
            for f in ranks:
                self.assertEqual(f.owner(room), d.addr)
            c.engine.release_room(room)
        inst = [p for p in self.clients[1].admin.get_fleet().prefills if p.bootstrap_addr == addr]
        self.assertEqual(len(inst), 1)
        self.assertEqual((inst[0].registered_via, inst[0].registered_ranks), (self.daemons[0].addr, 2))

    def test_report_room_and_offer_wait(self) -> None:
        """report_room goes to the room's daemon; a room no daemon offers
        fails with NotFoundError once offer_wait passed."""
        f = self.fleet_ranks(1, offer_wait=0.3)[0]
        addr = f.seed.rank.bootstrap_addr
        room = room_id()
        moved: list[int] = []

        def move(ch: decodeplane.Chunk, stop: object) -> int:
            moved.append(ch.index)
            return ch.bytes()

        send = Background(lambda: f.report_room(room, move=move, chunk_pages=2, timeout=WAIT))
        got = self.clients[1].engine.open_and_wait(**open_fields(room, addr, prompt_len=200), timeout=WAIT)
        self.assertEqual(got.phase, SUCCEEDED)
        send.outcome()
        self.assertEqual(moved, [0, 1])
        self.clients[1].engine.release_room(room)
        with self.assertRaises(decodeplane.NotFoundError):
            f.send_room(room_id(), timeout=WAIT)


class FleetOwnerKilledTest(FleetCase):
    def test_owner_killed(self) -> None:
        """The second daemon is killed (SIGKILL) with a room it offered not
        handed off yet: its hand-off fails at once with UnavailableError;
        rooms on the first daemon go on."""
        f = self.fleet_ranks(1)[0]
        addr = f.seed.rank.bootstrap_addr
        room = room_id()
        self.clients[1].engine.open_room(**open_fields(room, addr))
        poll("the room offered by the second daemon", lambda: f.owner(room) == self.daemons[1].addr)
        self.daemons[1].kill()
        start = time.monotonic()
        with self.assertRaises(decodeplane.UnavailableError):
            f.send_room(room, timeout=WAIT)
        self.assertLess(time.monotonic() - start, 5.0)
        other = room_id()
        send = Background(lambda: f.send_room(other, timeout=WAIT))
        got = self.clients[0].engine.open_and_wait(**open_fields(other, addr), timeout=WAIT)
        self.assertEqual(got.phase, SUCCEEDED)
        send.outcome()


if __name__ == "__main__":
    unittest.main()
