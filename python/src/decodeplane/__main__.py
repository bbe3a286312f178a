"""``python -m decodeplane status --target host:port``: a daemon's GetStatus as text.

Exit status 0 when the daemon answered (ready or not), 1 when the call
failed (the typed error is printed on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from decodeplane.client import Client, TLSConfig
from decodeplane.errors import DecodeplaneError
from decodeplane.v1 import admin_pb2


def format_status(st: admin_pb2.GetStatusResponse) -> str:
    """GetStatus as a few lines of text."""
    lines = [
        f"version:      {st.version}",
        f"incarnation:  {st.incarnation:x}",
        f"ready:        {str(st.ready).lower()} ({st.readiness})",
        f"draining:     {str(st.draining).lower()}",
        f"uptime:       {st.uptime.ToTimedelta()}",
        f"transfer:     {st.transfer_path}",
        f"layout:       {st.layout.kind} layers={st.layout.num_layers} page={st.layout.page_size} "
        f"dtype={st.layout.kv_cache_dtype} tp={st.layout.attn_tp_size} dp={st.layout.dp_size}",
        f"rooms:        " + (", ".join(f"{k}={v}" for k, v in sorted(st.rooms_by_phase.items())) or "none"),
        f"claims:       {st.pending_claims} waiting for rooms not open yet",
    ]
    for s in st.shards:
        lines.append(f"shard {s.dp_rank}:      pages {s.pages_free}/{s.pages_total} free, req slots "
                     f"{s.req_slots_free}/{s.req_slots_total} free, queued {s.queued}, running {s.running}, "
                     f"blocked by {s.blocked_by or 'none'}")
    for p in st.prefills:
        lines.append(f"prefill {p.bootstrap_addr}: {p.registered_ranks}/{p.expected_ranks} ranks, "
                     f"{p.active_rooms} active rooms, {p.silent_rank_count} silent ranks")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m decodeplane", description="decodeplane client commands")
    sub = ap.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="print the daemon's status (Admin.GetStatus)")
    st.add_argument("--target", default=os.environ.get("DECODEPLANE_TARGET", "127.0.0.1:7600"),
                    help="the daemon's gRPC address (default: $DECODEPLANE_TARGET or 127.0.0.1:7600)")
    st.add_argument("--token", default=os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"),
                    help="bearer token (default: $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)")
    st.add_argument("--tls", action="store_true", help="use TLS (implied by the --tls-* flags)")
    st.add_argument("--tls-ca", help="PEM CA bundle of the daemon's certificate")
    st.add_argument("--tls-cert", help="PEM client certificate (mutual TLS)")
    st.add_argument("--tls-key", help="PEM key of --tls-cert")
    st.add_argument("--server-name", help="name to verify in the daemon's certificate")
    st.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    args = ap.parse_args(argv)

    tls = None
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.server_name:
        tls = TLSConfig(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.server_name)
    try:
        with Client(args.target, tls=tls, token=args.token or None, timeout=args.timeout) as c:
            sys.stdout.write(format_status(c.admin.status()))
    except DecodeplaneError as e:
        print(f"decodeplane: {args.target}: {e}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"decodeplane: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
