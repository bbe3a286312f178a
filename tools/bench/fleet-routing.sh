#!/usr/bin/env bash
# tools/bench/fleet-routing.sh — measure claim routing in a fleet (the
# "Claim routing in a fleet" table of BENCHMARKS.md) in one run, from the
# repository root:
#
#   tools/bench/fleet-routing.sh                    # about 2 minutes on 2 cores
#   ROOMS=5000 RATE_FOR=5s tools/bench/fleet-routing.sh   # a shorter run
#   OUT=/tmp/routing tools/bench/fleet-routing.sh   # keep the raw results there
#
# One development etcd and three daemons on it (the benchmark daemon's
# settings of tools/bench/current.sh, registry.backend etcd), then, against
# that one fleet, back to back: the rooms on daemon A with the prefill's
# own claims (client.Prefill: the prefill names the daemon), the rooms on A
# offered by A (client.FleetPrefill, --fleet --fleet-daemons 1), and the
# rooms spread over A, B and C, each offered by its daemon (--fleet); each
# closed loop (rooms/s, open -> destination under load) and at a low rate
# (open -> destination without queueing). It prints the table as markdown
# (also $OUT/table.md) with the machine and the commands.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
ROOMS=${ROOMS:-20000}      # closed-loop rooms per configuration
RATE_FOR=${RATE_FOR:-15s}  # length of each low-load run
RATE=${RATE:-200}          # rooms/s of each low-load run
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/decodeplane-routing.XXXXXX")}
mkdir -p "$OUT"
BIN=$ROOT/bin
export GOTOOLCHAIN=local

. "$ROOT/tools/bench/lib.sh"
next_port=18700
say "building bin/ (make build)"
make -s build >&2


free_port ep
"$BIN/decodeplane-dev-etcd" --listen "127.0.0.1:$ep" >"$OUT/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ep/health" >/dev/null 2>&1 && break; sleep 0.1; done
SETS=(--log-level error --set kv_pool.total_tokens=2490368 --set kv_pool.request_slots=512
  --set transfer.sim.bandwidth_gbytes_per_s=0 --set transfer.sim.latency=0s
  --set registry.backend=etcd --set "registry.etcd.endpoints=http://127.0.0.1:$ep")
ADDRS=()
for name in A B C; do
  free_port p
  "$BIN/decodeplane" serve --listen "127.0.0.1:$p" --metrics-listen "" "${SETS[@]}" \
    --set "registry.etcd.advertise_address=127.0.0.1:$p" >"$OUT/daemon-$name.log" 2>&1 &
  PIDS+=($!); ADDRS+=("127.0.0.1:$p")
done
for a in "${ADDRS[@]}"; do
  for _ in $(seq 1 300); do "$BIN/decodectl" --addr "$a" --timeout 1s status >/dev/null 2>&1 && break; sleep 0.1; done
done
for _ in $(seq 1 100); do
  [ "$("$BIN/decodectl" --addr "${ADDRS[0]}" fleet -o json | grep -c '"address"')" -ge 3 ] && break; sleep 0.1
done
A=${ADDRS[0]}

# The three configurations: a name, the bench flags, a description.
NAMES=(own offered1 offered3)
FLAGS=("" "--fleet --fleet-daemons 1" "--fleet")
WHAT=("1 daemon (A), the prefill's own claims on A (client.Prefill)"
  "1 daemon (A), rooms offered by A (client.FleetPrefill)"
  "3 daemons (A, B, C), each room offered by its daemon (client.FleetPrefill)")

# field FILE LABEL COLUMN: a figure of the bench's table.
field() { awk -v l="$2" -v c="$3" 'index($0, l) == 1 { n = split(substr($0, length(l) + 1), f, " "); print f[c]; exit }' "$1"; }

for i in 0 1 2; do
  n=${NAMES[$i]}
  say "closed loop: ${WHAT[$i]}, $ROOMS rooms at concurrency 256"
  echo "$n closed start $(load)" >>"$OUT/loads.txt"
  # shellcheck disable=SC2086 # FLAGS are words
  "$BIN/decodeplane" bench --target "$A" ${FLAGS[$i]} --rooms "$ROOMS" --concurrency 256 --progress=false >"$OUT/closed-$n.txt"
  echo "$n closed end $(load)" >>"$OUT/loads.txt"
done
for i in 0 1 2; do
  n=${NAMES[$i]}
  say "low load: ${WHAT[$i]}, $RATE rooms/s for $RATE_FOR"
  # shellcheck disable=SC2086
  "$BIN/decodeplane" bench --target "$A" ${FLAGS[$i]} --rate "$RATE" --duration "$RATE_FOR" --concurrency 256 --progress=false >"$OUT/rate-$n.txt"
  echo "$n rate end $(load)" >>"$OUT/loads.txt"
done

{
  echo "Machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'); $(go version | cut -d' ' -f3-4)." \
    "Measured $(date -u '+%Y-%m-%d %H:%M UTC') on $(git rev-parse --short HEAD)$(git diff --quiet 2>/dev/null || echo ' (with local changes)');" \
    "load average at the end: $(load)."
  echo
  echo "| rooms on | rooms/s, closed loop, 256 in flight | open → destination p50 / p99 ms, same runs | open → destination p50 / p99 ms, $RATE rooms/s |"
  echo "| --- | --- | --- | --- |"
  for i in 0 1 2; do
    n=${NAMES[$i]}
    c=$OUT/closed-$n.txt r=$OUT/rate-$n.txt
    printf '| %s | %s | %s / %s | %s / %s |\n' "${WHAT[$i]}" "$(field "$c" 'rooms/s' 1)" \
      "$(field "$c" 'open -> destination' 1)" "$(field "$c" 'open -> destination' 3)" \
      "$(field "$r" 'open -> destination' 1)" "$(field "$r" 'open -> destination' 3)"
  done
  echo
  echo "Commands (one etcd, three daemons: \`bin/decodeplane-dev-etcd --listen 127.0.0.1:E\`; 3 × \`bin/decodeplane serve ${SETS[*]//$ep/E} --set registry.etcd.advertise_address=127.0.0.1:P\`), then:"
  echo
  for i in 0 1 2; do
    echo "- \`bin/decodeplane bench --target A ${FLAGS[$i]:+${FLAGS[$i]} }--rooms $ROOMS --concurrency 256\`;" \
      "\`bin/decodeplane bench --target A ${FLAGS[$i]:+${FLAGS[$i]} }--rate $RATE --duration $RATE_FOR --concurrency 256\`"
  done
} | tee "$OUT/table.md"
say "raw results in $OUT"
