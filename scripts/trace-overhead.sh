#!/usr/bin/env bash
# The timeline's cost on the GPT's data-parallel step: the GPT run with and without UNIHAL_TRACE,
# alternating, ROUNDS times each, in one run of this script; per run the median step wall time
# (steps after the first two), then the median over runs and the ratio traced/plain.
#
#   scripts/trace-overhead.sh [GPT-BINARY] [ROUNDS] [GPT ARGS...]
#   default: target/release/gpt, 5 rounds, --backend cpu --devices 2 --steps 20
#
# Environment as for the GPT (UNIHAL_*); the trace files go to a temporary directory, removed.
set -euo pipefail
GPT="${1:-target/release/gpt}"
ROUNDS="${2:-5}"
shift $(( $# > 2 ? 2 : $# )) || true
ARGS=("$@")
[ "${#ARGS[@]}" -gt 0 ] || ARGS=(--backend cpu --devices 2 --steps 20)
[ -x "$GPT" ] || { echo "no GPT binary at $GPT (cargo build --release -p unihal-gpt)" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
median_step() {  # REPORT.json: the median wall_ms of steps 3..
    python3 - "$1" <<'PY'
import json, statistics, sys
steps = json.load(open(sys.argv[1]))["steps"][2:]
print(statistics.median(s["wall_ms"] for s in steps))
PY
}
plain=() traced=()
for r in $(seq 1 "$ROUNDS"); do
    env -u UNIHAL_TRACE "$GPT" "${ARGS[@]}" --quiet --sample 0 --json "$TMP/plain.json" >/dev/null
    plain+=("$(median_step "$TMP/plain.json")")
    UNIHAL_TRACE="$TMP/trace.json" "$GPT" "${ARGS[@]}" --quiet --sample 0 --json "$TMP/traced.json" >/dev/null
    traced+=("$(median_step "$TMP/traced.json")")
    echo "round $r: plain ${plain[-1]} ms, traced ${traced[-1]} ms per step ($(stat -c %s "$TMP/trace.json") bytes of trace)"
done
python3 - "${plain[*]}" "${traced[*]}" <<'PY'
import statistics, sys
p = statistics.median(map(float, sys.argv[1].split()))
t = statistics.median(map(float, sys.argv[2].split()))
print(f"median step: plain {p:.2f} ms, traced {t:.2f} ms, traced/plain {t / p:.3f}")
PY
