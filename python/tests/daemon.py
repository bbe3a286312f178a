"""Runs the real decodeplane daemon binary for the tests.

The binary is $DECODEPLANE_BIN (``make python-test`` sets it to
bin/decodeplane), else bin/decodeplane of the repository. Each daemon
serves on a free loopback port with the embedded defaults (the simulated
transfer engine), instant transfers, no metrics listener and a 10-minute
heartbeat interval (no test loses its prefill to a missed beat), plus the
test's own ``--set`` flags; its log goes to a file in the test's temp dir.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional, Sequence

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("DECODEPLANE_BIN") or os.path.join(REPO, "bin", "decodeplane")

#: A daemon whose KV pages the decode engine owns (kv_pool.owner: engine),
#: with a small SGLang-shaped GQA pool: 4 layers, 2 KV heads of 16, bf16,
#: pages of 16 tokens, 256 pages, 16 request slots (64 metadata rows).
OWNER_SETS: tuple[str, ...] = (
    "kv_pool.owner=engine", "kv_pool.kind=gqa", "kv_pool.num_layers=4", "kv_pool.kv_heads=2",
    "kv_pool.head_dim=16", "kv_pool.dtype=bf16", "kv_pool.page_size=16", "kv_pool.total_tokens=0",
    "kv_pool.total_pages=256", "kv_pool.request_slots=16",
)

_SERVING = re.compile(r'msg="decodeplane serving".*incarnation=([0-9a-f]+)')


def free_port() -> int:
    """A loopback port nothing listens on (at the time)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The environment without the daemon's own settings (as the Go e2e tests)."""
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith(("SGLANG_", "DECODEPLANE_", "OTEL_")) or k == "DISAGGREGATION_TEST_FAILURE_PROB")}
    env.update(extra or {})
    return env


class Daemon:
    """One daemon process."""

    def __init__(self, *sets: str, args: Sequence[str] = (), env: Optional[dict[str, str]] = None,
                 port: Optional[int] = None, workdir: Optional[str] = None) -> None:
        self.port = port or free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.sets = list(sets)
        self.args = list(args)
        self.env = clean_env(env)
        self.workdir = workdir or tempfile.mkdtemp(prefix="decodeplane-test-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.incarnation = 0
        self.starts = 0

    def start(self, timeout: float = 30.0) -> "Daemon":
        if not os.path.exists(BIN):
            raise RuntimeError(f"no daemon binary at {BIN}: run 'make build' (or set DECODEPLANE_BIN)")
        self.starts += 1
        self.log_path = os.path.join(self.workdir, f"daemon-{self.port}-{self.starts}.log")
        cmd = [BIN, "serve", "--listen", self.addr, "--set", "server.metrics_listen=",
               "--set", "timeouts.heartbeat_interval=10m",
               "--set", "transfer.sim.bandwidth_gbytes_per_s=0", "--set", "transfer.sim.latency=0"]
        for s in self.sets:
            cmd += ["--set", s]
        cmd += self.args
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({self.proc.returncode}) before serving:\n{self.log()}")
            m = _SERVING.search(self.log())
            if m:
                self.incarnation = int(m.group(1), 16)
                return self
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"the daemon did not serve within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL past ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL: the daemon vanishes without a word (a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait()
        self._log.close()
