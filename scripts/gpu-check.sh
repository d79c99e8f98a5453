#!/usr/bin/env bash
# The CUDA backend on a real NVIDIA GPU, in one run: devices, the whole conformance suite, the
# backend against direct driver/cuBLAS calls (launch overhead, pinned copies, ops against a copy of
# the same bytes, matmul) and the collective benchmark, written under OUT (default
# ./gpu-check-out). Build on any x86-64 machine
# (`cargo build --release && cargo build --release -p unihal-cuda --example cuda_vs_direct`),
# carry target/release/unihal and target/release/examples/cuda_vs_direct, then run:
#
#   OUT=/some/dir scripts/gpu-check.sh [path/to/unihal] [path/to/cuda_vs_direct]
#
# NVRTC and NCCL are looked up in the Python environment's NVIDIA wheels when present (the GPU
# machines keep them there), else through the loader; UNIHAL_NVRTC_LIB / UNIHAL_NCCL_LIB override.
set -uo pipefail
BIN="${1:-./target/release/unihal}"
DIRECT="${2:-$(dirname "$BIN")/examples/cuda_vs_direct}"
OUT="${OUT:-./gpu-check-out}"
mkdir -p "$OUT"
export UNIHAL_KERNEL_CACHE="${UNIHAL_KERNEL_CACHE:-$OUT/kernel-cache}"

# NVIDIA libraries from Python wheels (nvidia-cuda-nvrtc, nvidia-nccl-cu13, nvidia-cublas).
if command -v python3 >/dev/null; then
    for d in $(python3 - <<'PY' 2>/dev/null
import os
try:
    import nvidia
    for root in nvidia.__path__:
        for sub in ("cu13/lib", "cuda_nvrtc/lib", "nccl/lib", "cublas/lib"):
            p = os.path.join(root, sub)
            if os.path.isdir(p):
                print(p)
except ImportError:
    pass
PY
); do
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
fi

{
    echo "# unihal GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} > "$OUT/environment.txt"

"$BIN" devices --backend cuda > "$OUT/devices.txt" 2>&1
echo "devices: rc=$?" | tee -a "$OUT/environment.txt"

# The whole suite; fault cases run isolated (the GPU's faults poison its context).
"$BIN" conformance --backend cuda --report "$OUT/conformance-cuda" > "$OUT/conformance.txt" 2>&1
echo "conformance: rc=$?" | tee -a "$OUT/environment.txt"

# The performance targets, unihal against direct calls in the same run.
if [ -x "$DIRECT" ]; then
    "$DIRECT" > "$OUT/bench-vs-direct.md" 2>&1
    echo "bench vs direct: rc=$?" | tee -a "$OUT/environment.txt"
else
    echo "bench vs direct: $DIRECT not found" | tee -a "$OUT/environment.txt"
fi

# Collectives on the GPUs of this machine (one GPU: single-rank communicators).
NGPU="$("$BIN" devices --backend cuda --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(len(b.get("devices",[])) for b in d if b.get("name")=="cuda"))' 2>/dev/null || echo 1)"
"$BIN" bench all_reduce --backend cuda -b 1K -e 256M -f 4 -g "${NGPU:-1}" > "$OUT/bench-all_reduce.txt" 2>&1
echo "bench all_reduce (-g ${NGPU:-1}): rc=$?" | tee -a "$OUT/environment.txt"

# One markdown report to commit as docs/conformance/cuda-<gpu>.md.
{
    echo "# CUDA backend on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo 'an unknown GPU')"
    echo
    echo "Produced by \`scripts/gpu-check.sh\` on $(date -u +%Y-%m-%d). Environment:"
    echo
    echo '```text'
    cat "$OUT/environment.txt"
    echo '```'
    echo
    echo "## Conformance (every case ran on the GPU unless listed as skipped)"
    echo
    echo '```text'
    grep -v '^passed' "$OUT/conformance-cuda/summary.txt" 2>/dev/null || tail -n 20 "$OUT/conformance.txt"
    echo '```'
    echo
    echo "## unihal against direct driver and cuBLAS calls"
    echo
    cat "$OUT/bench-vs-direct.md" 2>/dev/null || echo "(not run)"
    echo
    echo "## all_reduce (nccl-tests format)"
    echo
    echo '```text'
    cat "$OUT/bench-all_reduce.txt" 2>/dev/null
    echo '```'
} > "$OUT/cuda-report.md"

tail -n 5 "$OUT/conformance.txt"
echo "reports under $OUT (commit $OUT/cuda-report.md as docs/conformance/cuda-<gpu>.md)"
