#!/usr/bin/env bash
# tools/bench/compare.sh — the room lifecycle of two revisions, measured in
# one run: each revision's daemon and bench are built from git, then the
# two are run in turn, round after round, on both APIs, so that the load
# of the machine falls on both alike. From the repository root:
#
#   tools/bench/compare.sh OLD NEW          # e.g. tools/bench/compare.sh 9e19c45 main
#   ROOMS=20000 ROUNDS=5 tools/bench/compare.sh v0.3.0 HEAD
#
# Prints one line per run (rooms/s, CPU µs, heap allocations and bytes per
# room, from `decodeplane bench --json`) and the median of each figure per
# revision and API. Rooms/s moves with everything else on the machine; the
# CPU and allocations per room are what to compare.
#
# Needs: Go, git, python3 (the JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { echo "usage: $0 OLD_REV NEW_REV" >&2; exit 2; }
ROOMS=${ROOMS:-10000}
ROUNDS=${ROUNDS:-3}
APIS=${APIS:-"unary stream"}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/decodeplane-compare.XXXXXX")
trap 'git worktree remove --force "$WORK/old" >/dev/null 2>&1 || true; git worktree remove --force "$WORK/new" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
export GOTOOLCHAIN=local

build() { # build REV NAME: the daemon, and the bench binary where the revision has one
	git worktree add --detach "$WORK/$2" "$1" >/dev/null
	(cd "$WORK/$2" && go build -o "$WORK/$2-bin/" ./cmd/decodeplane && { [ ! -d cmd/decodeplane-bench ] || go build -o "$WORK/$2-bin/" ./cmd/decodeplane-bench; })
	echo "$2 = $1 ($(git rev-parse --short "$1"))"
}
build "$1" old
build "$2" new

: >"$WORK/runs"
for api in $APIS; do
	for round in $(seq "$ROUNDS"); do
		for rev in old new; do
			"$WORK/$rev-bin/decodeplane" bench --rooms "$ROOMS" --api "$api" --bare-duration 0 --json 2>/dev/null |
				python3 -c 'import json,sys; d=json.load(sys.stdin); print(sys.argv[1], sys.argv[2], round(d["rooms_per_second"]), round(d["cpu_seconds_per_room"]*1e6, 1), round(d["heap_allocs_per_room"]), round(d["heap_alloc_bytes_per_room"]))' "$api" "$rev" |
				tee -a "$WORK/runs"
		done
	done
done
echo
echo "median per revision (api rev rooms/s cpu_us/room allocs/room bytes/room):"
python3 - "$WORK/runs" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    api, rev, *v = line.split()
    rows.setdefault((api, rev), []).append([float(x) for x in v])
for (api, rev), vs in rows.items():
    med = [statistics.median(c) for c in zip(*vs)]
    print(api, rev, " ".join(f"{m:g}" for m in med))
EOF
