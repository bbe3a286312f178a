"""The SGLang plugin's parts that need neither SGLang nor a daemon: the
buffers behind SGLang's pointers (/proc/self/maps), the decode manifest,
the room's KVPoll mapping, state indices, the enum member."""

from __future__ import annotations

import enum
import os
import tempfile
import time
import unittest

import numpy as np

from decodeplane.sglang import buffers
from decodeplane.sglang.decode import RoomState, state_indices
from decodeplane.sglang.plugin import add_backend_member, is_ours
from decodeplane.v1 import common_pb2

MAPS = """\
7f0000000000-7f0000100000 rw-s 00002000 00:1a 1234 /dev/shm/pool
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
7f0000200000-7f0000300000 rw-s 00000000 00:05 99 /dev/nvidia0
7f0000300000-7f0000400000 rw-s 00000000 00:1a 55 /dev/shm/gone (deleted)
7f0000400000-7f0000500000 r--s 00000000 00:1a 56 /dev/shm/ro
"""
P = common_pb2


class RegionTest(unittest.TestCase):
    def test_find_region(self) -> None:
        r = buffers.find_region(0x7F0000000100, 0x1000, MAPS)
        self.assertEqual(r, buffers.Region("/dev/shm/pool", 0x2100, 0x1000))
        self.assertIsNone(buffers.find_region(0x7F00000FF000, 0x2000, MAPS), "crosses the mapping's end")
        for ptr in (0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000):
            self.assertIsNone(buffers.find_region(ptr, 16, MAPS), hex(ptr))
        self.assertTrue(buffers.readable(0x7F0000100000, 16, MAPS))
        self.assertFalse(buffers.readable(0x7F0000200000, 16, MAPS), "a device's memory")
        self.assertFalse(buffers.readable(0x10, 16, MAPS))

    def test_locate_this_process(self) -> None:
        d = tempfile.mkdtemp(dir="/dev/shm")
        path = os.path.join(d, "buf")
        with open(path, "wb") as f:
            f.truncate(8192)
        shared = np.memmap(path, dtype=np.uint8, mode="r+", shape=(8192,))
        private = np.zeros(4096, dtype=np.uint8)
        try:
            bufs = buffers.EngineBuffers(16, [buffers.Buffer(shared.ctypes.data + 4096, 4096, 1024)], [])
            got = buffers.locate(bufs, "decode rank")
            self.assertEqual((got.kv[0].region.path, got.kv[0].region.offset), (path, 4096))
            bad = buffers.EngineBuffers(16, [], [buffers.Buffer(private.ctypes.data, 4096, 64)])
            with self.assertRaises(buffers.BufferError) as cm:
                buffers.locate(bad, "decode rank")
            self.assertIn("decode rank's aux buffer 0", str(cm.exception))
            # The manifest carries the regions to a prefill rank.
            mf = os.path.join(d, "m.json")
            buffers.write_manifest(mf, got)
            back = buffers.read_manifest(mf)
            self.assertEqual((back.page_size, back.kv[0].region, back.kv[0].item_len), (16, got.kv[0].region, 1024))
            with open(mf, "w") as f:
                f.write('{"version": 9}')
            with self.assertRaises(buffers.BufferError):
                buffers.read_manifest(mf)
            with self.assertRaises(buffers.BufferError) as cm:
                buffers.read_manifest(os.path.join(d, "none.json"))
            self.assertIn("DECODEPLANE_SGLANG_NAMESPACE", str(cm.exception))
        finally:
            del shared
            import shutil

            shutil.rmtree(d, ignore_errors=True)


    def test_manifest_path_per_daemon(self) -> None:
        """A fleet's decode ranks on one host share a namespace: each rank's
        manifest is also named by its daemon's advertised address, escaped
        injectively into a file name."""
        plain = buffers.manifest_path("/dev/shm", "ns", 0, 1)
        self.assertEqual(plain, "/dev/shm/ns-decode-dp0-tp1.json")
        self.assertEqual(buffers.manifest_path("/dev/shm", "ns", 0, 1, "10.0.0.5:7600"),
                         "/dev/shm/ns-decode-10.0.0.5_3a7600-dp0-tp1.json")
        names = {buffers.manifest_path("/s", "ns", 0, 0, a) for a in
                 ("10.0.0.5:7600", "10.0.0.5:7610", "[::1]:7600", "a_3a1:2", "a:1_2", "a:1:2", "h\u00e9:1")}
        self.assertEqual(len(names), 7)
        for n in names:
            self.assertEqual(os.path.dirname(n), "/s")
            self.assertRegex(os.path.basename(n), r"^[A-Za-z0-9._-]+$")


class PollTest(unittest.TestCase):
    def test_kv_poll(self) -> None:
        st = RoomState(1, None, True)
        now = time.monotonic()
        self.assertEqual(st.kv_poll(now), 1)
        st.phase = P.ROOM_PHASE_QUEUED
        self.assertEqual(st.kv_poll(now), 1, "init() not called yet")
        st.initialized = True
        for ph, want in ((P.ROOM_PHASE_QUEUED, 2), (P.ROOM_PHASE_CLAIMED, 2), (P.ROOM_PHASE_TRANSFERRING, 3),
                         (P.ROOM_PHASE_SUCCEEDED, 4), (P.ROOM_PHASE_RELEASED, 4)):
            st.phase = ph
            self.assertEqual(st.kv_poll(now), want, P.RoomPhase.Name(ph))
        st.phase = P.ROOM_PHASE_FAILED
        self.assertEqual(st.kv_poll(now), 3, "failed, pages not reusable: not Failed")
        st.reusable = True
        self.assertEqual(st.kv_poll(now), 0)

    def test_local_failures(self) -> None:
        st = RoomState(2, None, True)
        st.fail("refused", wait_daemon=True)
        st.fail("second", wait_daemon=False)
        self.assertEqual((st.local_failure, st.wait_daemon), ("refused", True), "the first failure stands")
        now = time.monotonic()
        self.assertEqual(st.kv_poll(now), 3)
        st.drain_until = now + 5
        self.assertEqual(st.kv_poll(now), 3)
        self.assertEqual(st.kv_poll(now + 6), 0, "the restart's drain bound passed")
        st2 = RoomState(3, None, True)
        st2.fail("never opened", wait_daemon=False)
        self.assertEqual(st2.kv_poll(now), 0)


class StateTest(unittest.TestCase):
    def test_state_indices(self) -> None:
        class T(enum.Enum):
            MAMBA = "mamba"
            SWA = "swa"

        got = state_indices([T.MAMBA, T.SWA], [[np.array([3, 4])], np.array([7, 8, 9])])
        self.assertEqual([(s.type, list(s.indices)) for s in got],
                         [(P.STATE_TYPE_MAMBA, [3, 4]), (P.STATE_TYPE_SWA, [7, 8, 9])])
        with self.assertRaises(ValueError) as cm:
            state_indices(["swa_ring"], [[1]])
        self.assertIn("swa_ring", str(cm.exception))


class EnumTest(unittest.TestCase):
    def test_add_member(self) -> None:
        class Backend(enum.Enum):
            MOONCAKE = "mooncake"
            FAKE = "fake"

        fake = Backend.FAKE
        m = add_backend_member(Backend)
        self.assertIs(Backend("decodeplane"), m)
        self.assertIs(Backend.DECODEPLANE, m)
        self.assertIs(Backend["DECODEPLANE"], m)
        self.assertEqual([b.value for b in Backend], ["mooncake", "fake", "decodeplane"])
        self.assertIs(add_backend_member(Backend), m)
        self.assertIs(Backend("fake"), fake)
        self.assertTrue(is_ours(m) and is_ours("decodeplane") and not is_ours(fake))
        self.assertEqual(repr(m), "<Backend.DECODEPLANE: 'decodeplane'>")
