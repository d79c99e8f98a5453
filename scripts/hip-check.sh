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

# shellcheck source=lib/vendor-check.sh
source "$(dirname "$0")/lib/vendor-check.sh"
{
    echo "# unihal HIP check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (rocm-smi --showproductname 2>/dev/null || hy-smi 2>/dev/null || echo "no rocm-smi/hy-smi") | head -n 20
    echo "ROCM_PATH=${ROCM_PATH:-} DTKROOT=${DTKROOT:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} > "$OUT/environment.txt"

vendor_check hip HIP hip-check.sh "direct HIP runtime and rocBLAS calls" RCCL
