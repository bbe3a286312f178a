"""Runs the real reference transfer agent binary (decodeplane-agent) for the
tests: $DECODEPLANE_AGENT_BIN, else decodeplane-agent next to the daemon
binary. It serves on a free loopback port, admits shared-memory files
under /dev/shm, and takes the test's fault flags (--fault-hold-rooms,
--fault-fail-rooms, ...); its log goes to a file in a temp dir."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from typing import Sequence

import grpc

from tests.daemon import BIN, clean_env, free_port

AGENT_BIN = os.environ.get("DECODEPLANE_AGENT_BIN") or os.path.join(os.path.dirname(BIN), "decodeplane-agent")

_SERVING = re.compile(r'msg="decodeplane-agent serving"')


class Agent:
    """One reference agent process."""

    def __init__(self, *args: str, shared_dirs: Sequence[str] = ("/dev/shm",)) -> None:
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.args = ["--listen", self.addr, "--log-level", "debug", "--shared-memory-dirs", ",".join(shared_dirs),
                     *args]
        self.workdir = tempfile.mkdtemp(prefix="decodeplane-agent-test-")
        self.log_path = os.path.join(self.workdir, f"agent-{self.port}.log")
        self.proc: "subprocess.Popen[bytes] | None" = None

    def start(self, timeout: float = 30.0) -> "Agent":
        if not os.path.exists(AGENT_BIN):
            raise RuntimeError(f"no agent binary at {AGENT_BIN}: run 'make build' (or set DECODEPLANE_AGENT_BIN)")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([AGENT_BIN, *self.args], stdout=self._log, stderr=subprocess.STDOUT,
                                     env=clean_env())
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the agent exited ({self.proc.returncode}) before serving:\n{self.log()}")
            if _SERVING.search(self.log()):
                with grpc.insecure_channel(self.addr) as ch:
                    grpc.channel_ready_future(ch).result(timeout=max(0.1, end - time.monotonic()))
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the agent did not serve within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


__all__ = ["Agent", "AGENT_BIN"]
