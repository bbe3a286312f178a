#!/usr/bin/env bash
# tools/bench/owner.sh — the room lifecycle cost with each page owner
# (kv_pool.owner: daemon, engine) and each API (the sessions, the unary
# calls), measured in one run, from the repository root:
#
#   tools/bench/owner.sh                    # about 4 minutes on 2 cores (BENCHMARKS.md)
#   ROOMS=20000 ROUNDS=1 tools/bench/owner.sh
#   OUT=/tmp/owner tools/bench/owner.sh     # keep the raw results there
#
# For each round, API and owner, interleaved (daemon then engine, for the
# sessions then for unary calls), a fresh daemon (`decodeplane serve` with
# the bench's pool, --page-owner as measured) and `decodeplane bench
# --target` against it, closed loop at concurrency 256: with --page-owner
# engine the bench's decode engine allocates every room's pages from its
# own free lists and declares them. The daemon's CPU and allocations per
# room are read from its /metrics. It prints a markdown table (also
# $OUT/table.md) with the commands and the machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ROOMS=${ROOMS:-30000}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/decodeplane-owner.XXXXXX")}
mkdir -p "$OUT"
BIN=$ROOT/bin
export GOTOOLCHAIN=local

. "$ROOT/tools/bench/lib.sh"
next_port=17800
say "building bin/ (make build)"
make -s build >&2


# The benchmark daemon of BENCHMARKS.md's closed-loop rows.
DAEMON_SETS=(--log-level error --set kv_pool.total_tokens=2490368 --set kv_pool.request_slots=512
  --set transfer.sim.bandwidth_gbytes_per_s=0 --set transfer.sim.latency=0s)
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc 2>/dev/null || sysctl -n hw.ncpu)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || sysctl -n machdep.cpu.brand_string)"
  echo "go=$(go version)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "rooms=$ROOMS"
  echo "command=bin/decodeplane serve --listen 127.0.0.1:P --metrics-listen 127.0.0.1:M ${DAEMON_SETS[*]} --page-owner OWNER & bin/decodeplane bench --api API --page-owner OWNER --target 127.0.0.1:P --metrics-url http://127.0.0.1:M/metrics --rooms $ROOMS --concurrency 256 --json"
} >"$OUT/machine.env"

for round in $(seq 1 "$ROUNDS"); do
  for api in stream unary; do
    for owner in daemon engine; do
      name="$api-$owner-$round"
      say "round $round: --api $api, --page-owner $owner, $ROOMS rooms at concurrency 256"
      free_port p; free_port m
      "$BIN/decodeplane" serve --listen "127.0.0.1:$p" --metrics-listen "127.0.0.1:$m" "${DAEMON_SETS[@]}" --page-owner "$owner" \
        >"$OUT/$name.daemon.log" 2>&1 &
      dpid=$!; PIDS+=("$dpid")
      wait_ready "127.0.0.1:$p"
      echo "$name start $(load)" >>"$OUT/loads.txt"
      "$BIN/decodeplane" bench --api "$api" --page-owner "$owner" --target "127.0.0.1:$p" --metrics-url "http://127.0.0.1:$m/metrics" \
        --rooms "$ROOMS" --concurrency 256 --progress=false --json >"$OUT/$name.json"
      echo "$name end $(load)" >>"$OUT/loads.txt"
      kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true
    done
  done
done

say "writing $OUT/table.md"
go run ./tools/bench/ownerreport "$OUT" | tee "$OUT/table.md"
