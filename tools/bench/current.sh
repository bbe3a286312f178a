#!/usr/bin/env bash
# tools/bench/current.sh — measure the "Current results" table of BENCHMARKS.md
# in one command, from the repository root:
#
#   tools/bench/current.sh                 # about 5 minutes on 2 cores (BENCHMARKS.md)
#   OUT=/tmp/bench tools/bench/current.sh  # keep the raw results there
#   ROOMS=20000 QUEUED=50000 tools/bench/current.sh   # a shorter run
#
# It builds bin/ (make build), then runs each measurement of the table with
# the repository's own binaries and tests, one after the other (a fresh
# daemon for each), keeps every raw answer (JSON, test output) in $OUT and
# prints the table as markdown (also $OUT/table.md), each row with the command
# that produced it and the machine (cores, CPU, Go version, load average).
# Run it on a quiet machine: every figure moves with what else runs there.
#
# Needs: Go, make, curl (the daemon's /metrics), taskset (the HTTP rows pin
# the servers to CPU 1 when it is there).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

ROOMS=${ROOMS:-50000}       # closed-loop rooms per API
QUEUED=${QUEUED:-100000}    # queued rooms for the memory row
RATE_FOR=${RATE_FOR:-15s}   # length of each low-load (--rate 200) run
FLEET_FOR=${FLEET_FOR:-30}  # seconds of traffic per fleet size (etcd load)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/decodeplane-bench.XXXXXX")}
mkdir -p "$OUT"
BIN=$ROOT/bin
export GOTOOLCHAIN=local

. "$ROOT/tools/bench/lib.sh"
next_port=17700

say "building bin/ (make build)"
make -s build >&2

# The benchmark daemon: the defaults with a KV pool and request slots large
# enough that admission never blocks at concurrency 256, and instant simulated
# transfers, so that the control path is what is measured.
DAEMON_SETS=(--log-level error --set kv_pool.total_tokens=2490368 --set kv_pool.request_slots=512
  --set transfer.sim.bandwidth_gbytes_per_s=0 --set transfer.sim.latency=0s)

# start_daemon NAME [extra serve flags...]: a fresh daemon; sets $ADDR, $METRICS, $DPID.
start_daemon() {
  local name=$1; shift
  local p m
  free_port p; free_port m
  "$BIN/decodeplane" serve --listen "127.0.0.1:$p" --metrics-listen "127.0.0.1:$m" "${DAEMON_SETS[@]}" "$@" \
    >"$OUT/$name.daemon.log" 2>&1 &
  DPID=$!; PIDS+=("$DPID")
  ADDR=127.0.0.1:$p; METRICS=http://127.0.0.1:$m/metrics
  wait_ready "$ADDR"
}

stop_daemon() { kill "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }

# record NAME COMMAND: the command a row was measured with (one line: the
# report prints it as code). mark NAME start|end: the load average then.
record() { printf '%s\t%s\n' "$1" "$(printf '%s' "$2" | tr '\n' ' ' | tr -s ' ')" >>"$OUT/commands.tsv"; }
mark() { printf '%s\t%s\t%s\n' "$1" "$2" "$(load)" >>"$OUT/loads.tsv"; }

: >"$OUT/commands.tsv"; : >"$OUT/loads.tsv"
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "nproc=$(nproc 2>/dev/null || sysctl -n hw.ncpu)"
  echo "cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || sysctl -n machdep.cpu.brand_string)"
  echo "mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null || true)"
  echo "go=$(go version)"
  echo "os=$(uname -srm)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "version=$("$BIN/decodeplane" version)"
} >"$OUT/machine.env"

BENCH_FLAGS=(--progress=false --json)

# 1-2. Closed loop, c=256: the streams (the Go client's default) and the unary API.
for api in stream unary; do
  say "closed loop, --api $api, $ROOMS rooms at concurrency 256"
  start_daemon "closed-$api"
  cmd="bin/decodeplane serve --listen 127.0.0.1:P --metrics-listen 127.0.0.1:M ${DAEMON_SETS[*]} &
bin/decodeplane bench --api $api --target 127.0.0.1:P --metrics-url http://127.0.0.1:M/metrics --rooms $ROOMS --concurrency 256 --json"
  record "closed-$api" "$cmd"
  mark "closed-$api" start
  "$BIN/decodeplane" bench --api "$api" --target "$ADDR" --metrics-url "$METRICS" --rooms "$ROOMS" --concurrency 256 \
    "${BENCH_FLAGS[@]}" >"$OUT/closed-$api.json"
  mark "closed-$api" end
  curl -s "$METRICS" >"$OUT/closed-$api.metrics" || true
  stop_daemon
done

# 3-4. Low load, --rate 200: open -> destination, last chunk -> engine told.
for api in stream unary; do
  say "low load, --api $api, 200 rooms/s for $RATE_FOR"
  start_daemon "rate-$api"
  record "rate-$api" "bin/decodeplane serve … (as above) &
bin/decodeplane bench --api $api --target 127.0.0.1:P --metrics-url http://127.0.0.1:M/metrics --rate 200 --duration $RATE_FOR --concurrency 256 --json"
  mark "rate-$api" start
  "$BIN/decodeplane" bench --api "$api" --target "$ADDR" --metrics-url "$METRICS" --rate 200 --duration "$RATE_FOR" \
    --concurrency 256 "${BENCH_FLAGS[@]}" >"$OUT/rate-$api.json"
  mark "rate-$api" end
  stop_daemon
done

# 5. Memory per queued room.
say "queued-room memory, $QUEUED rooms"
record queued "bin/decodeplane bench --queued $QUEUED --json"
mark queued start
"$BIN/decodeplane" bench --queued "$QUEUED" "${BENCH_FLAGS[@]}" >"$OUT/queued.json"
mark queued end

# 6. SGLang's bootstrap routes (HTTP), against a trivial Go handler on the same core.
say "HTTP bootstrap routes (go test TestHTTPBench)"
record http "DECODEPLANE_HTTP_BENCH=1 go test -count=1 -run '^TestHTTPBench\$' ./cmd/decodeplane/"
mark http start
DECODEPLANE_HTTP_BENCH=1 DECODEPLANE_HTTP_BENCH_OUT="$OUT/http.md" \
  go test -count=1 -run '^TestHTTPBench$' ./cmd/decodeplane/ >"$OUT/http.log" 2>&1 ||
  # The test also checks the routes' targets (≤ 50 µs of server CPU per
  # request): a miss is a figure of the table (the report lists them), not a
  # reason to stop; no table at all is.
  [ -s "$OUT/http.md" ] || { cat "$OUT/http.log" >&2; exit 1; }
mark http end

# 7. The fleet registry through etcd: registration, heartbeat, propagation.
say "fleet registry on etcd (go test -bench BenchmarkFleet ./fleet/)"
record fleet "go test -run '^\$' -bench BenchmarkFleet -count 1 ./fleet/"
mark fleet start
go test -run '^$' -bench BenchmarkFleet -count 1 ./fleet/ >"$OUT/fleet.txt" 2>&1 || { cat "$OUT/fleet.txt" >&2; exit 1; }
mark fleet end

# 8. etcd load per fleet size: D daemons on one development etcd, each serving
# its own simulated prefill (2 ranks) and decode engine at 100 rooms/s; etcd's
# own counters over FLEET_FOR seconds.
etcd_metric() { curl -s "$1/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }
for daemons in 1 3; do
  say "etcd load, a fleet of $daemons daemon(s) at 100 rooms/s each, ${FLEET_FOR}s"
  mark "etcd-$daemons" start
  free_port ep
  "$BIN/decodeplane-dev-etcd" --listen "127.0.0.1:$ep" >"$OUT/etcd-$daemons.log" 2>&1 &
  epid=$!; PIDS+=("$epid")
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$ep/health" >/dev/null 2>&1 && break; sleep 0.1; done
  dpids=(); bpids=(); addrs=()
  for i in $(seq 1 "$daemons"); do
    free_port p
    # Transfers of 50 ms (not instant): rooms are in flight when the daemon
    # samples its capacity each second, so it publishes it, as a loaded one does.
    "$BIN/decodeplane" serve --listen "127.0.0.1:$p" --metrics-listen "" "${DAEMON_SETS[@]}" --set transfer.sim.latency=50ms \
      --set registry.backend=etcd --set "registry.etcd.endpoints=http://127.0.0.1:$ep" \
      --set "registry.etcd.advertise_address=127.0.0.1:$p" >"$OUT/etcd-$daemons-daemon-$i.log" 2>&1 &
    dpids+=($!); PIDS+=($!); addrs+=("127.0.0.1:$p")
  done
  for a in "${addrs[@]}"; do wait_ready "$a"; done
  for a in "${addrs[@]}"; do
    "$BIN/decodeplane" bench --target "$a" --rate 100 --duration 0 --prefill-ranks 2 --concurrency 64 --progress=false \
      >/dev/null 2>&1 &
    bpids+=($!); PIDS+=($!)
  done
  sleep 5 # registrations and the first capacity puts are done: measure the steady state
  {
    for m in etcd_server_proposals_committed_total etcd_mvcc_put_total etcd_mvcc_txn_total etcd_debugging_lease_renewed_total etcd_debugging_mvcc_events_total; do
      echo "before $m $(etcd_metric "http://127.0.0.1:$ep" $m)"
    done
    sleep "$FLEET_FOR"
    for m in etcd_server_proposals_committed_total etcd_mvcc_put_total etcd_mvcc_txn_total etcd_debugging_lease_renewed_total etcd_debugging_mvcc_events_total; do
      echo "after $m $(etcd_metric "http://127.0.0.1:$ep" $m)"
    done
    echo "seconds $FLEET_FOR"
    echo "daemons $daemons"
  } >"$OUT/etcd-$daemons.txt"
  # SIGTERM, which `decodeplane bench` passes on to the bench (it leaves
  # SIGINT to the terminal, which sends it to the whole process group).
  for p in "${bpids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for p in "${dpids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  kill "$epid" 2>/dev/null || true; wait "$epid" 2>/dev/null || true
  mark "etcd-$daemons" end
done
record etcd "bin/decodeplane-dev-etcd --listen 127.0.0.1:E; D × bin/decodeplane serve … --set transfer.sim.latency=50ms --set registry.backend=etcd --set registry.etcd.endpoints=http://127.0.0.1:E …; D × bin/decodeplane bench --target DAEMON --rate 100 --duration 0 --prefill-ranks 2; etcd's /metrics over ${FLEET_FOR} s"

say "writing $OUT/table.md"
go run ./tools/bench/report "$OUT" | tee "$OUT/table.md"
