#!/usr/bin/env bash
# The HIP backend on a real AMD GPU or Hygon DCU, in one run: devices, the whole conformance
# suite, the backend against direct HIP runtime/rocBLAS calls (hip_vs_direct: the same measures
# and targets as the CUDA one) and the RCCL collective benchmark, written under OUT (default
# ./hip-check-out), with one markdown report to commit as docs/conformance/hip-<arch>.md.
# Build on any x86-64 Linux machine
# (`cargo build --release && cargo build --release -p unihal-hip --example hip_vs_direct`),
# carry target/release/{unihal,unihal-hiprtc-helper} and target/release/examples/hip_vs_direct,
# then run:
#
#   OUT=/some/dir scripts/hip-check.sh [path/to/unihal] [path/to/hip_vs_direct]
#
# ROCm: the runtime, hiprtc, RCCL and rocBLAS are found through the loader and ROCM_PATH (default
# /opt/rocm). Hygon DTK: `source /opt/dtk/env.sh` first, or set DTKROOT (default /opt/dtk).
# UNIHAL_HIP_LIB, UNIHAL_HIPRTC_LIB, UNIHAL_RCCL_LIB and UNIHAL_ROCBLAS_LIB override each one.
set -uo pipefail
BIN="${1:-./target/release/unihal}"
DIRECT="${2:-$(dirname "$BIN")/examples/hip_vs_direct}"
OUT="${OUT:-./hip-check-out}"
mkdir -p "$OUT"
export UNIHAL_KERNEL_CACHE="${UNIHAL_KERNEL_CACHE:-$OUT/kernel-cache}"
# The compile helper for architectures the installed hiprtc may abort on, beside the binary.
export UNIHAL_HIPRTC_HELPER="${UNIHAL_HIPRTC_HELPER:-$(dirname "$BIN")/unihal-hiprtc-helper}"

log() { echo "$1" | tee -a "$OUT/environment.txt"; }
{
    echo "# unihal HIP check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (rocm-smi --showproductname 2>/dev/null || hy-smi 2>/dev/null || echo "no rocm-smi/hy-smi") | head -n 20
    echo "ROCM_PATH=${ROCM_PATH:-} DTKROOT=${DTKROOT:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} > "$OUT/environment.txt"

"$BIN" devices --backend hip > "$OUT/devices.txt" 2>&1
log "devices: rc=$?"
ARCH="$("$BIN" devices --backend hip --json 2>/dev/null | python3 -c 'import json,sys
for b in json.load(sys.stdin):
    for d in b.get("devices", []):
        print(d["capabilities"]["optional"]["arch"]); sys.exit()' 2>/dev/null || echo unknown)"
NDEV="$("$BIN" devices --backend hip --json 2>/dev/null | python3 -c 'import json,sys; print(sum(len(b.get("devices",[])) for b in json.load(sys.stdin) if b.get("name")=="hip"))' 2>/dev/null || echo 1)"

# The whole suite; fault cases run isolated (a device fault poisons the process's context).
"$BIN" conformance --backend hip --report "$OUT/conformance-hip" > "$OUT/conformance.txt" 2>&1
log "conformance: rc=$?"

if [ -x "$DIRECT" ]; then
    "$DIRECT" > "$OUT/bench-vs-direct.md" 2>&1
    log "bench vs direct: rc=$?"
else
    log "bench vs direct: $DIRECT not found"
fi

"$BIN" bench all_reduce --backend hip -b 1K -e 256M -f 4 -g "${NDEV:-1}" > "$OUT/bench-all_reduce.txt" 2>&1
log "bench all_reduce (-g ${NDEV:-1}): rc=$?"

{
    echo "# HIP backend on $ARCH"
    echo
    echo "Produced by \`scripts/hip-check.sh\` on $(date -u +%Y-%m-%d). Environment:"
    echo
    echo '```text'; cat "$OUT/environment.txt"; cat "$OUT/devices.txt"; echo '```'
    echo
    echo "## Conformance (every case ran on the device unless listed as skipped)"
    echo
    echo '```text'
    grep -v '^passed' "$OUT/conformance-hip/summary.txt" 2>/dev/null || tail -n 20 "$OUT/conformance.txt"
    echo '```'
    echo
    echo "## unihal against direct HIP runtime and rocBLAS calls"
    echo
    cat "$OUT/bench-vs-direct.md" 2>/dev/null
    echo
    echo "## RCCL all_reduce"
    echo
    echo '```text'; cat "$OUT/bench-all_reduce.txt"; echo '```'
} > "$OUT/hip-$ARCH.md"
log "report: $OUT/hip-$ARCH.md"
