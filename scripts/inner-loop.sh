#!/usr/bin/env bash
# The inner loop for whoever changes the code (README, "Contributing"): in at most 10 minutes on
# a warm build directory with one file changed (docs/RELIABILITY.md, "CI time", has the figures):
#   1. every crate's unit tests (`cargo test --workspace --lib`);
#   2. the CPU conformance suite, each case on device 0 (the other devices take part as peer
#      ranks in the collective cases);
#   3. one simulated backend's whole suite the same way: `ascend` (default: the simulated CANN
#      stack needs no vendor package), `cuda` (the simulated driver and NCCL; its op cases need
#      NVRTC on LD_LIBRARY_PATH) or `hip` (the simulated HIP runtime, RCCL and rocBLAS; its
#      kernel op cases need hiprtc).
# The dev profile throughout, the build the README's test command makes. Everything else CI runs
# (the other suites and modes, the real-compiler gates, MPI, sanitizers, fuzzing, loom) is
# `.ci/run`; `scripts/full-matrix.sh` adds the slices CI rotates.
#
# Usage: scripts/inner-loop.sh [ascend|cuda|hip]
set -euo pipefail
cd "$(dirname "$0")/.."

BACKEND="${1:-ascend}"
START=$(date +%s)
phase() { echo "== inner loop: $* ($(( $(date +%s) - START )) s in)"; }

case "$BACKEND" in
    ascend) SIM_PACKAGE=unihal-sim-cann ;;
    cuda) SIM_PACKAGE=unihal-sim-cuda ;;
    hip) SIM_PACKAGE=unihal-sim-hip ;;
    *) echo "usage: scripts/inner-loop.sh [ascend|cuda|hip] (not '$BACKEND')" >&2; exit 2 ;;
esac

phase "unit tests (cargo test --workspace --lib)"
cargo test -q --workspace --lib

phase "build the unihal binary and the simulated $BACKEND runtime"
cargo build -q -p unihal --bin unihal
if [ "$BACKEND" = ascend ]; then
    cargo build -q -p unihal-sim-cann --lib --example make_layout
else
    cargo build -q -p "$SIM_PACKAGE"
fi

# Independent processes: the CPU suite beside the simulated backend's (scripts/lib/side-by-side.sh).
source scripts/lib/side-by-side.sh
cpu_suite() {
    target/debug/unihal conformance --backend cpu --max-devices 1 --report target/inner-loop-cpu
}
sim_suite() {
    local lib="$PWD/target/debug/lib${SIM_PACKAGE//-/_}.so"
    case "$BACKEND" in
        ascend)
            target/debug/examples/make_layout "$PWD/target/inner-loop-cann" "$lib" >/dev/null
            UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 \
                UNIHAL_ASCEND_LIB="$PWD/target/inner-loop-cann/classic/lib64" \
                target/debug/unihal conformance --backend ascend --max-devices 1 --report target/inner-loop-ascend ;;
        cuda)
            UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_CUDA_LIB="$lib" UNIHAL_NCCL_LIB="$lib" \
                UNIHAL_KERNEL_CACHE="$PWD/target/kernel-cache" \
                target/debug/unihal conformance --backend cuda --max-devices 1 --report target/inner-loop-cuda ;;
        hip)
            UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_HIP_LIB="$lib" UNIHAL_RCCL_LIB="$lib" \
                UNIHAL_ROCBLAS_LIB="$lib" UNIHAL_SIM_NCCL_FLAVOR=rccl \
                UNIHAL_KERNEL_CACHE="$PWD/target/kernel-cache" \
                target/debug/unihal conformance --backend hip --max-devices 1 --report target/inner-loop-hip ;;
    esac
}
phase "CPU suite beside the simulated $BACKEND suite (device 0 of each)"
side_by_side cpu_suite sim_suite
phase "done: unit tests, CPU suite and simulated $BACKEND suite passed"
