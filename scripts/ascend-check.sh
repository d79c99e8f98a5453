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

log() { echo "$1" | tee -a "$OUT/environment.txt"; }
{
    echo "# unihal Ascend check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    (npu-smi info 2>/dev/null || echo "no npu-smi") | head -n 30
    echo "ASCEND_TOOLKIT_HOME=${ASCEND_TOOLKIT_HOME:-} ASCEND_HOME_PATH=${ASCEND_HOME_PATH:-}"
    echo "ASCEND_RT_VISIBLE_DEVICES=${ASCEND_RT_VISIBLE_DEVICES:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    cat "${ASCEND_HOME_PATH:-/usr/local/Ascend/ascend-toolkit/latest}/version.cfg" 2>/dev/null | head -n 5
} > "$OUT/environment.txt"

"$BIN" devices --backend ascend > "$OUT/devices.txt" 2>&1
log "devices: rc=$?"
SOC="$("$BIN" devices --backend ascend --json 2>/dev/null | python3 -c 'import json,sys
for b in json.load(sys.stdin):
    for d in b.get("devices", []):
        print(d["capabilities"]["optional"]["arch"]); sys.exit()' 2>/dev/null || echo unknown)"
NDEV="$("$BIN" devices --backend ascend --json 2>/dev/null | python3 -c 'import json,sys; print(sum(len(b.get("devices",[])) for b in json.load(sys.stdin) if b.get("name")=="ascend"))' 2>/dev/null || echo 1)"

# The whole suite; fault cases run isolated (a device fault poisons the process's context).
"$BIN" conformance --backend ascend --report "$OUT/conformance-ascend" > "$OUT/conformance.txt" 2>&1
log "conformance: rc=$?"

if [ -x "$DIRECT" ]; then
    "$DIRECT" > "$OUT/bench-vs-direct.md" 2>&1
    log "bench vs direct: rc=$?"
else
    log "bench vs direct: $DIRECT not found"
fi

"$BIN" bench all_reduce --backend ascend -b 1K -e 256M -f 4 -g "${NDEV:-1}" > "$OUT/bench-all_reduce.txt" 2>&1
log "bench all_reduce (-g ${NDEV:-1}): rc=$?"

{
    echo "# Ascend backend on $SOC"
    echo
    echo "Produced by \`scripts/ascend-check.sh\` on $(date -u +%Y-%m-%d). Environment:"
    echo
    echo '```text'; cat "$OUT/environment.txt"; cat "$OUT/devices.txt"; echo '```'
    echo
    echo "## Conformance (every case ran on the device unless listed as skipped)"
    echo
    echo '```text'
    grep -v '^passed' "$OUT/conformance-ascend/summary.txt" 2>/dev/null || tail -n 20 "$OUT/conformance.txt"
    echo '```'
    echo
    echo "## unihal against direct aclnn calls"
    echo
    cat "$OUT/bench-vs-direct.md" 2>/dev/null
    echo
    echo "## HCCL all_reduce"
    echo
    echo '```text'; cat "$OUT/bench-all_reduce.txt"; echo '```'
} > "$OUT/ascend-$SOC.md"
log "report: $OUT/ascend-$SOC.md"
