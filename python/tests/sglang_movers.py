"""Movers a test names in DECODEPLANE_SGLANG_MOVER (``tests.sglang_movers:held``,
``...:failing``): the shm mover, with a room's chunk held until the test
lets it go (a write still in flight), or failing (a transfer engine's
error). They are also what a site's mover factory looks like."""

from __future__ import annotations

import threading
from typing import Any

from decodeplane.sglang.mover import ChunkJob, ShmMover

#: Chunks to hold: (room, page_offset) -> event set when the test lets it go.
HOLD: dict[tuple[int, int], threading.Event] = {}
#: Set when a held chunk started (the mover waits in it).
ENTERED: dict[tuple[int, int], threading.Event] = {}
#: Chunks that fail: (room, page_offset) -> the error's message.
FAIL: dict[tuple[int, int], str] = {}


def hold(room: int, page_offset: int) -> tuple[threading.Event, threading.Event]:
    """Holds the chunk of room starting at page_offset: returns (entered, release)."""
    key = (room, page_offset)
    HOLD[key], ENTERED[key] = threading.Event(), threading.Event()
    return ENTERED[key], HOLD[key]


def release_all() -> None:
    """Lets every held chunk go and forgets the failures (a test's end)."""
    for ev in HOLD.values():
        ev.set()
    HOLD.clear()
    ENTERED.clear()
    FAIL.clear()


class TestMover(ShmMover):
    def move(self, job: ChunkJob) -> None:
        key = (job.room, job.page_offset)
        if key in FAIL:
            raise OSError(FAIL[key])
        if key in HOLD:
            ENTERED[key].set()
            HOLD[key].wait(60)
        super().move(job)


def mover(settings: Any) -> TestMover:
    return TestMover(settings)
