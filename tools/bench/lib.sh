# tools/bench/lib.sh — what the benchmark scripts share, sourced by them
# (current.sh, owner.sh, fleet-routing.sh) once they set BIN; each then
# sets next_port, the first loopback port free_port tries.

say() { printf '==> %s\n' "$*" >&2; }

# free_port VAR sets VAR to a loopback TCP port nobody listens on (not in a
# subshell: the next call must not hand out the same port).
free_port() {
  while (exec 3<>"/dev/tcp/127.0.0.1/$next_port") 2>/dev/null; do next_port=$((next_port + 1)); done
  printf -v "$1" '%s' "$next_port"
  next_port=$((next_port + 1))
}

# wait_ready ADDR: until the daemon at ADDR answers decodectl status.
wait_ready() {
  for _ in $(seq 1 300); do
    "$BIN/decodectl" --addr "$1" --timeout 1s status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "daemon at $1 never answered" >&2
  return 1
}

# The processes a script started (PIDS+=($!)), killed when it exits.
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# load prints the 1, 5 and 15 minute load averages.
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime | sed 's/.*averages*: //'; }
