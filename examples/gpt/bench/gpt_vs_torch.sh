#!/usr/bin/env bash
# Tokens/s of unihal's small GPT (examples/gpt, CPU backend, one device) against PyTorch training
# the same model (torch_gpt.py: same corpus, sizes, initialisation, loss, AdamW, clipping, f32) with
# the same batch and the same number of compute threads, interleaved over 3 rounds.
#
#   examples/gpt/bench/gpt_vs_torch.sh [THREADS] [STEPS]      (defaults: 2 threads, 60 steps)
#
# Environment:
#   PYTHON      python with torch and numpy (default /tmp/venv-torch/bin/python3)
#   SKIP_BUILD  1: do not run `cargo build --release -p unihal-gpt` (use $GPT as is)
#   GPT         the gpt binary to measure (default target/release/gpt; another build to compare)
#   ROUNDS      rounds (default 3)
#   PAUSE_S     idle seconds before each side's run (default 2), so that neither measures the
#               other's threads still spinning; the sides also alternate which goes first
#
# Each figure is the median of the per-step tokens/s after the first 10% of the steps (the element
# at len/2 of the sorted tail, as `gpt` prints it); ratio = unihal / pytorch.
#
# Run it on an otherwise idle machine: PyTorch's OpenMP threads spin-wait at every barrier, so with
# THREADS = cores and another busy process (a build), its tokens/s drops by up to 10x (unihal's far
# less), which makes the ratio meaningless. The script warns when the load is high; exporting
# OMP_WAIT_POLICY=PASSIVE (passed through to torch) avoids the collapse at some cost when idle.
set -euo pipefail

THREADS=${1:-2}
STEPS=${2:-60}
ROUNDS=${ROUNDS:-3}
PAUSE_S=${PAUSE_S:-2}
PYTHON=${PYTHON:-/tmp/venv-torch/bin/python3}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$ROOT"

if [[ ! -x "$PYTHON" ]] || ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
    cat >&2 <<EOF
gpt_vs_torch.sh: no python with torch at $PYTHON. Install one outside the repository:
    python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch==2.15.0 numpy
or point PYTHON at one.
EOF
    exit 1
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    cargo build --release -p unihal-gpt
fi
GPT=${GPT:-target/release/gpt}
[[ -x "$GPT" ]] || { echo "gpt_vs_torch.sh: $GPT missing (build it, or unset SKIP_BUILD)" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# The unihal report's median tokens/s and first/last loss, as one JSON line.
unihal_summary() {
    "$PYTHON" - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
steps = r["steps"]
tail = sorted(s["tokens_per_s"] for s in steps[len(steps) // 10:])
print(json.dumps({
    "impl": "unihal",
    "median_tokens_per_s": tail[len(tail) // 2],
    "first_loss": steps[0]["loss"],
    "last_loss": steps[-1]["loss"],
    "vocab": r["model"]["vocab"],
    "parameters": r["parameters"],
}))
EOF
}

# Field $2 of the JSON line $1.
field() { "$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

echo "unihal GPT vs PyTorch on the CPU: $THREADS thread(s), $STEPS steps, batch 32 x ctx 64, $ROUNDS rounds"
echo "  $("$PYTHON" -c 'import torch; print("torch", torch.__version__)'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

if "$PYTHON" -c 'import os, sys; sys.exit(0 if os.getloadavg()[0] > 0.5 * os.cpu_count() else 1)'; then
    echo "  WARNING: the machine is busy (load above half the cores); the figures will be noisy"
fi

RATIOS=()
ROWS=()
run_unihal() {
    sleep "$PAUSE_S"
    UNIHAL_CPU_THREADS=$THREADS "$GPT" --backend cpu --devices 1 --steps "$STEPS" --sample 0 \
        --eval-every 0 --quiet --json "$TMP/unihal.json" >"$TMP/unihal.log"
    unihal_summary "$TMP/unihal.json" >"$TMP/unihal.line"
}
run_torch() {
    sleep "$PAUSE_S"
    "$PYTHON" examples/gpt/bench/torch_gpt.py --threads "$THREADS" --steps "$STEPS" | tail -n 1 \
        >"$TMP/torch.line"
}

for r in $(seq 1 "$ROUNDS"); do
    # Odd rounds run unihal first, even rounds PyTorch first.
    if (( r % 2 )); then run_unihal; run_torch; else run_torch; run_unihal; fi
    U=$(cat "$TMP/unihal.line")
    T=$(cat "$TMP/torch.line")
    if [[ $r == 1 ]]; then
        echo "  unihal:  vocab $(field "$U" vocab), $(field "$U" parameters) parameters"
        echo "  pytorch: vocab $(field "$T" vocab), $(field "$T" parameters) parameters"
    fi
    ROWS+=("$("$PYTHON" - "$r" "$U" "$T" <<'EOF'
import json, sys
r, u, t = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
ut, tt = u["median_tokens_per_s"], t["median_tokens_per_s"]
print(f"{r:>5}  {ut:>12.0f}  {tt:>13.0f}  {ut / tt:>6.2f}  "
      f"{u['first_loss']:.4f} -> {u['last_loss']:.4f}   {t['first_loss']:.4f} -> {t['last_loss']:.4f}")
EOF
)")
    RATIOS+=("$("$PYTHON" -c 'import json, sys; u, t = (json.loads(a) for a in sys.argv[1:]); print(u["median_tokens_per_s"] / t["median_tokens_per_s"])' "$U" "$T")")
done

echo
printf '%5s  %12s  %13s  %6s  %-20s  %-20s\n' round "unihal tok/s" "pytorch tok/s" ratio \
    "unihal loss" "pytorch loss"
printf '%s\n' "${ROWS[@]}"
"$PYTHON" -c 'import statistics, sys; print(f"\nmedian ratio unihal/pytorch over {len(sys.argv) - 1} rounds: {statistics.median(map(float, sys.argv[1:])):.2f}")' "${RATIOS[@]}"
