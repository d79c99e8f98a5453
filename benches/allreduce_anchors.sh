#!/usr/bin/env bash
# All-reduce anchors side by side in one run (docs/BENCHMARKS.md, "Small messages: anchors"):
# f32 sum at 8 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB for
#   inproc4  unihal's in-process CPU engine, 4 ranks (UNIHAL_CPU_DEVICES=4, -g 4), out of place;
#   mpi4     Open MPI's own MPI_Allreduce, 4 processes (shared memory): the direct column of
#            `mpirun -n 4 unihal bench all_reduce` (a build with --features mpi);
#   umpi4    unihal's MPI engine, 4 processes: the same run's unihal column;
#   mpi2     MPI_Allreduce, 2 processes, and umpi2 the MPI engine, 2 processes (same run);
#   gloo4    PyTorch's gloo, 4 processes under torchrun (scripts/torch_gloo_allreduce.py), in place.
# Every time is per call, the slowest rank's, in microseconds. The peers run one after another in
# ROUNDS interleaved rounds with a pause of PAUSE seconds between measurements (no peer measures
# another's spinning threads); the medians over the rounds, ratios direct MPI time / other time
# (1.0 = as fast as MPI_Allreduce with as many processes) and a markdown table are printed.
#   benches/allreduce_anchors.sh [UNIHAL_BINARY]   (default target/release/unihal, built with
#   `cargo build --release --features mpi`); UNIHAL_TORCH_VENV: a venv with torch (default
#   ~/.cache/unihal/venv-torch-2.15.0); ROUNDS (3), ITERS (20), WARM (5), PAUSE (1).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-target/release/unihal}"
VENV="${UNIHAL_TORCH_VENV:-$HOME/.cache/unihal/venv-torch-2.15.0}"
ROUNDS="${ROUNDS:-3}" ITERS="${ITERS:-20}" WARM="${WARM:-5}" PAUSE="${PAUSE:-1}"
SIZES="8 1024 65536 1048576 16777216 67108864"

die() { echo "allreduce_anchors: $*" >&2; exit 1; }
[ -x "$BIN" ] || die "no unihal binary at $BIN (cargo build --release --features mpi)"
command -v mpirun >/dev/null || die "mpirun not found (install Open MPI: openmpi-bin)"
command -v python3 >/dev/null || die "python3 not found"
[ -x "$VENV/bin/torchrun" ] || die "no torchrun in $VENV/bin (set UNIHAL_TORCH_VENV to a venv with torch)"
[ -f scripts/torch_gloo_allreduce.py ] || die "scripts/torch_gloo_allreduce.py is missing"
MPIRUN=(mpirun --oversubscribe -x UNIHAL_CCL_TIMEOUT)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 UNIHAL_CCL_TIMEOUT=120
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# Fails fast on a binary built without the MPI engine: its MPI run has no comparison block.
"${MPIRUN[@]}" -n 1 "$BIN" bench all_reduce -b 8 -e 8 -n 1 -w 0 -d float >"$OUT/probe" 2>&1 \
    || { cat "$OUT/probe" >&2; die "$BIN failed under mpirun"; }
grep -q '^# unihal MPI engine vs direct' "$OUT/probe" \
    || die "$BIN has no MPI engine (build it with: cargo build --release --features mpi)"

# Both size rows of one bench invocation: 8 B alone, then 1 KiB to 64 MiB by 4 (those of SIZES
# are kept when the results are read).
# bench_rows EXTRA COMMAND...: "COMMAND bench all_reduce ... EXTRA" for both rows.
bench_rows() {
    local extra="$1"; shift
    # shellcheck disable=SC2086 # EXTRA is a list of flags
    "$@" bench all_reduce -b 8 -e 8 -n "$ITERS" -w "$WARM" -d float -a 3 $extra
    sleep "$PAUSE"
    # shellcheck disable=SC2086
    "$@" bench all_reduce -b 1K -e 64M -f 4 -n "$ITERS" -w "$WARM" -d float -a 3 $extra
}
# "size time_us" per table row (out-of-place time: column 6 of the 13).
table() { awk '!/^#/ && NF == 13 { print $1, $6 }'; }
# "size unihal_us direct_us" per line of the MPI comparison block.
versus() { awk '/^# +[0-9]+ +float +sum / { print $2, $5, $6 }'; }

for r in $(seq 1 "$ROUNDS"); do
    echo "round $r of $ROUNDS" >&2
    UNIHAL_CPU_DEVICES=4 bench_rows "-g 4" "$BIN" 2>/dev/null | table >>"$OUT/inproc4"
    sleep "$PAUSE"
    for n in 4 2; do
        bench_rows "" "${MPIRUN[@]}" -n "$n" "$BIN" 2>/dev/null | versus >"$OUT/v"
        awk '{ print $1, $2 }' "$OUT/v" >>"$OUT/umpi$n"
        awk '{ print $1, $3 }' "$OUT/v" >>"$OUT/mpi$n"
        sleep "$PAUSE"
    done
    "$VENV/bin/torchrun" --nproc_per_node 4 scripts/torch_gloo_allreduce.py "${SIZES// /,}" \
        "$ITERS" "$WARM" 2>/dev/null | grep -v '^#' >>"$OUT/gloo4"
    sleep "$PAUSE"
done

python3 - "$OUT" "$ROUNDS" "$SIZES" "$ITERS" <<'PY'
import statistics, sys
out, rounds, sizes, iters = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split()], sys.argv[4]
peers = ["inproc4", "mpi4", "umpi4", "gloo4", "mpi2", "umpi2"]
med = {}
for p in peers:
    t = {}
    for line in open(f"{out}/{p}"):
        s, us = line.split()
        t.setdefault(int(s), []).append(float(us))
    missing = [s for s in sizes if len(t.get(s, [])) != rounds]
    if missing:
        sys.exit(f"allreduce_anchors: {p} has no time for {missing} in some round")
    med[p] = {s: statistics.median(t[s]) for s in sizes}
def size(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1 << 10 else f"{s} B"
def us(v):
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} µs"
print(f"# all_reduce f32 sum, median of {rounds} interleaved rounds of {iters} calls, slowest rank, us per call")
print(f"# {'size':>9} " + " ".join(f"{p:>10}" for p in peers)
      + f" {'mpi4/in4':>9} {'mpi4/um4':>9} {'mpi4/gl4':>9} {'mpi2/um2':>9}")
for s in sizes:
    m = {p: med[p][s] for p in peers}
    print(f"  {s:>9} " + " ".join(f"{m[p]:>10.1f}" for p in peers)
          + f" {m['mpi4'] / m['inproc4']:>9.2f} {m['mpi4'] / m['umpi4']:>9.2f}"
          + f" {m['mpi4'] / m['gloo4']:>9.2f} {m['mpi2'] / m['umpi2']:>9.2f}")
print()
print("| size | in-process, 4 ranks | MPI_Allreduce, 4 | MPI engine, 4 | torch gloo, 4 | ratio in-process | ratio MPI engine | ratio gloo | MPI_Allreduce, 2 | MPI engine, 2 | ratio MPI engine, 2 |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in sizes:
    m = {p: med[p][s] for p in peers}
    print(f"| {size(s)} | {us(m['inproc4'])} | {us(m['mpi4'])} | {us(m['umpi4'])} | {us(m['gloo4'])} "
          f"| {m['mpi4'] / m['inproc4']:.2f} | {m['mpi4'] / m['umpi4']:.2f} | {m['mpi4'] / m['gloo4']:.2f} "
          f"| {us(m['mpi2'])} | {us(m['umpi2'])} | {m['mpi2'] / m['umpi2']:.2f} |")
PY
