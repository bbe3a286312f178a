"""The plugin's settings, read from the environment of each SGLang process
(the launcher passes its environment to the scheduler processes).

=====================================  ==========================================================
Variable                               Meaning (default)
=====================================  ==========================================================
``DECODEPLANE_TARGET``                 the decode daemon's gRPC target (``127.0.0.1:7600``); the
                                       prefill and the decode servers name the same daemon
``DECODEPLANE_TOKEN``                  the daemon's bearer token (else
                                       ``SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN``; unset: none)
``DECODEPLANE_TLS_CA``                 PEM CA bundle that signs the daemon's certificate: TLS on
``DECODEPLANE_TLS_CERT``, ``_KEY``     client certificate and key (mutual TLS)
``DECODEPLANE_TLS_SERVER_NAME``        the name to verify in the daemon's certificate
``DECODEPLANE_SGLANG_MOVER``           how a prefill rank's KV reaches the decode buffers:
                                       ``shm`` (the prefill copies into the decode engine's
                                       shared-memory buffers, then reports: same host, host
                                       memory), ``delegated`` (decodeplane's transfer agent
                                       writes into the decode engine's shared-memory buffers:
                                       the daemon's ``transfer.path: delegate``) or
                                       ``module:callable``, a site's mover factory (``shm``)
``DECODEPLANE_SGLANG_AGENT``           the transfer agent's gRPC target as the prefill ranks
                                       reach it (plaintext), for the ``delegated`` mover: each
                                       prefill rank registers its buffers there (unset: none)
``DECODEPLANE_SGLANG_SHM_DIR``         where a decode rank publishes its buffer manifest for the
                                       ``shm`` mover (``/dev/shm``)
``DECODEPLANE_SGLANG_NAMESPACE``       the manifests' name prefix, one per decode daemon on a
                                       host (a fleet's prefill ranks find each daemon's by its
                                       address: one may serve them all) (``decodeplane``)
``DECODEPLANE_SGLANG_BOOTSTRAP_ADDR``  the prefill instance's bootstrap address as routers name
                                       it (default: the server's host, or its IP when it listens
                                       on every address, and ``--disaggregation-bootstrap-port``)
``DECODEPLANE_SGLANG_INSTANCE_ID``     the prefill instance's id (default: this host and the
                                       launcher process: a restart is a new instance)
``DECODEPLANE_SGLANG_RPC_TIMEOUT``     seconds bounding each call to the daemon (``30``)
``DECODEPLANE_SGLANG_MOVER_THREADS``   threads moving chunks per prefill rank (``4``)
``DECODEPLANE_SGLANG_FLEET``          how a prefill rank finds its rooms: ``on`` (a fleet: the
                                       rank registers through DECODEPLANE_TARGET and hands each
                                       room off on the daemon of the fleet that offers it),
                                       ``off`` (it claims every room on DECODEPLANE_TARGET), or
                                       ``auto``: ``on`` when the target's registry is etcd (the
                                       daemon is a fleet member) or the target does not answer
                                       at startup, ``off`` when its registry is in memory or it
                                       has no Fleet service (``auto``)
``DECODEPLANE_SGLANG_RESTART_DRAIN``   seconds a decode rank keeps the pages of a hand-off it
                                       could not re-declare after a daemon restart (the daemon
                                       has no ``engine.resync_timeout``) before reusing them
                                       (``30``, the daemon's default ``release.deferred_timeout``)
=====================================  ==========================================================
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    from decodeplane import Client

__all__ = ["Settings", "SettingsError", "make_client", "client_options", "FLEET_MODES"]

#: DECODEPLANE_SGLANG_FLEET's values.
FLEET_MODES = ("auto", "on", "off")

_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")


class SettingsError(ValueError):
    """A setting with a bad value: names the variable, the value and the fix."""

    def __init__(self, name: str, value: str, problem: str, fix: str) -> None:
        super().__init__(f"decodeplane: {name}={value!r} {problem}; {fix}")
        self.name = name


@dataclass(frozen=True)
class Settings:
    """The plugin's settings (see the module documentation)."""

    target: str = "127.0.0.1:7600"
    token: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_server_name: Optional[str] = None
    mover: str = "shm"
    agent: Optional[str] = None
    shm_dir: str = "/dev/shm"
    namespace: str = "decodeplane"
    bootstrap_addr: Optional[str] = None
    instance_id: Optional[str] = None
    rpc_timeout: float = 30.0
    mover_threads: int = 4
    restart_drain: float = 30.0
    fleet: str = "auto"

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca or self.tls_cert or self.tls_server_name)

    @staticmethod
    def from_env(env: Optional[Mapping[str, str]] = None) -> "Settings":
        """The settings from ``env`` (default ``os.environ``); raises
        :class:`SettingsError` for a bad value."""
        e = os.environ if env is None else env

        def get(name: str) -> Optional[str]:
            v = e.get(name)
            return v if v not in (None, "") else None

        target = get("DECODEPLANE_TARGET") or Settings.target
        token = get("DECODEPLANE_TOKEN") or get("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN")
        if token is not None and any(c.isspace() for c in token):
            raise SettingsError("DECODEPLANE_TOKEN", "<hidden>", "contains whitespace", "set the daemon's token as is")
        cert, key = get("DECODEPLANE_TLS_CERT"), get("DECODEPLANE_TLS_KEY")
        if (cert is None) != (key is None):
            raise SettingsError("DECODEPLANE_TLS_CERT" if cert is None else "DECODEPLANE_TLS_KEY", "",
                                "is unset while its pair is set", "set both DECODEPLANE_TLS_CERT and DECODEPLANE_TLS_KEY "
                                "for mutual TLS, or neither")
        mover = get("DECODEPLANE_SGLANG_MOVER") or Settings.mover
        if mover not in ("shm", "delegated") and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", mover):
            raise SettingsError("DECODEPLANE_SGLANG_MOVER", mover, "is neither shm, delegated nor module:callable",
                                "use shm or delegated, or name a mover factory such as mysite.movers:make_mover")
        agent = get("DECODEPLANE_SGLANG_AGENT")
        if agent is not None and not _valid_hostport(agent):
            raise SettingsError("DECODEPLANE_SGLANG_AGENT", agent, "is not host:port (port 1..65535)",
                                "name the transfer agent as the prefill reaches it, e.g. 127.0.0.1:7700")
        addr = get("DECODEPLANE_SGLANG_BOOTSTRAP_ADDR")
        if addr is not None and not _valid_hostport(addr):
            raise SettingsError("DECODEPLANE_SGLANG_BOOTSTRAP_ADDR", addr, "is not host:port (port 1..65535)",
                                "set it as routers name the prefill, e.g. 10.0.0.5:8998")
        inst = get("DECODEPLANE_SGLANG_INSTANCE_ID")
        if inst is not None and len(inst.encode()) > 256:
            raise SettingsError("DECODEPLANE_SGLANG_INSTANCE_ID", inst[:32] + "...", "is longer than 256 bytes",
                                "use a shorter id")
        ns = get("DECODEPLANE_SGLANG_NAMESPACE") or Settings.namespace
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", ns):
            raise SettingsError("DECODEPLANE_SGLANG_NAMESPACE", ns, "is not 1..64 characters of [A-Za-z0-9._-]",
                                "use a name such as decodeplane-node1")
        shm_dir = get("DECODEPLANE_SGLANG_SHM_DIR") or Settings.shm_dir
        if not shm_dir.startswith("/"):
            raise SettingsError("DECODEPLANE_SGLANG_SHM_DIR", shm_dir, "is not an absolute path", "use e.g. /dev/shm")
        fleet = (get("DECODEPLANE_SGLANG_FLEET") or Settings.fleet).lower()
        if fleet not in FLEET_MODES:
            raise SettingsError("DECODEPLANE_SGLANG_FLEET", get("DECODEPLANE_SGLANG_FLEET") or "",
                                f"is not one of {', '.join(FLEET_MODES)}",
                                "use on for a fleet of decode daemons (registry.backend etcd), off for one decode daemon, "
                                "or auto to ask the daemon")
        return Settings(
            target=target, token=token, tls_ca=get("DECODEPLANE_TLS_CA"), tls_cert=cert, tls_key=key,
            tls_server_name=get("DECODEPLANE_TLS_SERVER_NAME"), mover=mover, agent=agent, shm_dir=shm_dir, namespace=ns,
            bootstrap_addr=addr, instance_id=inst,
            rpc_timeout=_number(get, "DECODEPLANE_SGLANG_RPC_TIMEOUT", Settings.rpc_timeout, 0.1, 3600.0),
            mover_threads=int(_number(get, "DECODEPLANE_SGLANG_MOVER_THREADS", Settings.mover_threads, 1, 256, True)),
            restart_drain=_number(get, "DECODEPLANE_SGLANG_RESTART_DRAIN", Settings.restart_drain, 0.0, 3600.0),
            fleet=fleet,
        )


def _valid_hostport(s: str) -> bool:
    m = _HOSTPORT.match(s)
    return bool(m) and 1 <= int(m.group(2)) <= 65535


def _number(get, name: str, default: float, lo: float, hi: float, integer: bool = False) -> float:  # type: ignore[no-untyped-def]
    raw = get(name)
    if raw is None:
        return default
    try:
        v = int(raw) if integer else float(raw)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        kind = "an integer" if integer else "a number of seconds"
        raise SettingsError(name, raw, f"is not {kind} in {lo:g}..{hi:g}", f"set {kind} in that range (default {default:g})")
    return v


def client_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of every Client the plugin makes (TLS, token,
    the RPC timeout): the same for every daemon of a fleet."""
    from decodeplane import TLSConfig

    tls = None
    if settings.tls:
        tls = TLSConfig(ca=settings.tls_ca, cert=settings.tls_cert, key=settings.tls_key,
                        server_name=settings.tls_server_name)
    return {"tls": tls, "token": settings.token, "timeout": settings.rpc_timeout}


def make_client(settings: Settings) -> "Client":
    """A decodeplane Client for the settings' daemon."""
    from decodeplane import Client

    return Client(settings.target, **client_options(settings))
