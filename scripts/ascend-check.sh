#!/usr/bin/env bash
# The Ascend backend on real Huawei NPUs, in one run: devices, the whole conformance suite, the
# backend against direct aclnn calls (ascend_vs_direct: enqueue overhead and op throughput) and the
# HCCL all_reduce benchmark (nccl-tests format), written under OUT (default ./ascend-check-out),
# with one markdown report to commit as docs/conformance/ascend-<soc>.md.
# Build on any x86-64 or AArch64 Linux machine (no CANN needed to build):
# `cargo build --release && cargo build --release -p unihal-ascend --example ascend_vs_direct`,
# carry target/release/unihal and target/release/examples/ascend_vs_direct, then run:
#
#   source /usr/local/Ascend/ascend-toolkit/set_env.sh   # or your CANN's set_env.sh
#   OUT=/some/dir scripts/ascend-check.sh [path/to/unihal] [path/to/ascend_vs_direct]
#
# CANN is found through ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH (set_env.sh sets them), the loader
# path, /usr/local/Ascend/ascend-toolkit/latest/lib64 or /usr/local/Ascend/cann/lib64;
# UNIHAL_ASCEND_LIB (a lib64 directory) or UNIHAL_ACL_LIB, UNIHAL_NNOPBASE_LIB, UNIHAL_OPAPI_LIB
# (a ':' list) and UNIHAL_HCCL_LIB override. ASCEND_RT_VISIBLE_DEVICES selects devices, as usual.
set -uo pipefail
BIN="${1:-./target/release/unihal}"
DIRECT="${2:-$(dirname "$BIN")/examples/ascend_vs_direct}"
OUT="${OUT:-./ascend-check-out}"
mkdir -p "$OUT"

# shellcheck source=lib/vendor-check.sh
source "$(dirname "$0")/lib/vendor-check.sh"
{
    echo "# unihal Ascend check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (npu-smi info 2>/dev/null || echo "no npu-smi") | head -n 30
    echo "ASCEND_TOOLKIT_HOME=${ASCEND_TOOLKIT_HOME:-} ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-}"
    echo "ASCEND_RT_VISIBLE_DEVICES=${ASCEND_RT_VISIBLE_DEVICES:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    cat "${ASCEND_HOME_PATH:-/usr/local/Ascend/ascend-toolkit/latest}/version.cfg" 2>/dev/null | head -n 5
} > "$OUT/environment.txt"

vendor_check ascend Ascend ascend-check.sh "direct aclnn calls" HCCL
