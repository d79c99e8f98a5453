#!/usr/bin/env bash
# unihal's gloo engine against PyTorch's own gloo all-reduce, side by side in one run, two
# processes each under torchrun: f32 sum in place, 4 B to 4 MiB, the same warm-up and iteration
# counts, each side's per-call mean of its slowest rank, ROUNDS interleaved rounds, medians and
# the ratio printed (docs/BENCHMARKS.md).
#   scripts/gloo-vs-torch.sh [UNIHAL_BINARY]   (a build with --features gloo; default
#   target/release/unihal: `cargo build --release --features gloo`), with UNIHAL_TORCH_VENV naming PyTorch 2.15.0's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/unihal}"
VENV="${UNIHAL_TORCH_VENV:?set UNIHAL_TORCH_VENV to a venv with torch 2.15.0}"
ROUNDS="${ROUNDS:-5}" ITERS="${ITERS:-200}" WARM="${WARM:-20}"
SIZES="4,64,1024,16384,262144,4194304"
export OMP_NUM_THREADS=1 UNIHAL_CCL_TIMEOUT=120
OUT="$(mktemp -d)"
for r in $(seq 1 "$ROUNDS"); do
    # unihal: one bench run per size (its in-place column), as the sizes are not a geometric row;
    # -a 3: the slowest rank's time, as the torch side reports.
    for s in ${SIZES//,/ }; do
        "$VENV/bin/torchrun" --nproc_per_node 2 --no-python "$BIN" bench all_reduce -b "$s" -e "$s" \
            -n "$ITERS" -w "$WARM" -d float -a 3 2>/dev/null \
            | awk -v s="$s" '!/^#/ && NF == 13 { print s, $10 }' >>"$OUT/unihal.$r"
    done
    "$VENV/bin/torchrun" --nproc_per_node 2 scripts/torch_gloo_allreduce.py "$SIZES" "$ITERS" "$WARM" \
        2>/dev/null | grep -v '^#' >>"$OUT/torch.$r"
done
python3 - "$OUT" "$ROUNDS" "$SIZES" <<'PY'
import statistics, sys
out, rounds, sizes = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
def load(side):
    t = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}"):
            s, us = line.split()
            t.setdefault(int(s), []).append(float(us))
    return t
u, p = load("unihal"), load("torch")
print(f"# all_reduce f32 sum in place, 2 processes under torchrun, median of {rounds} rounds (us per call)")
print(f"{'bytes':>10} {'unihal gloo':>12} {'torch gloo':>12} {'unihal/torch':>13}")
for s in sizes:
    a, b = statistics.median(u[s]), statistics.median(p[s])
    print(f"{s:>10} {a:>12.1f} {b:>12.1f} {a / b:>13.2f}")
PY
rm -rf "$OUT"
