# Shared by the hardware check scripts (hip-check.sh, ascend-check.sh): sourced, not run.
#
# vendor_check BACKEND TITLE SCRIPT DIRECT_TITLE CCL_TITLE runs, with BIN, DIRECT and OUT set and
# "$OUT/environment.txt" written by the caller: `unihal devices`, the whole conformance suite
# (fault cases isolated), the unihal-against-direct benchmark, the all_reduce benchmark over every
# device (nccl-tests format), and writes "$OUT/<backend>-<arch>.md", the report to commit as
# docs/conformance/<backend>-<arch>.md.

log() { echo "$1" | tee -a "$OUT/environment.txt"; }

vendor_check() {
    local backend="$1" title="$2" script="$3" direct_title="$4" ccl_title="$5"
    "$BIN" devices --backend "$backend" > "$OUT/devices.txt" 2>&1
    log "devices: rc=$?"
    local json arch ndev
    json="$("$BIN" devices --backend "$backend" --json 2>/dev/null)"
    arch="$(python3 -c 'import json,sys
for b in json.load(sys.stdin):
    for d in b.get("devices", []):
        print(d["capabilities"]["optional"]["arch"]); sys.exit()' <<<"$json" 2>/dev/null || echo unknown)"
    ndev="$(BACKEND="$backend" python3 -c 'import json,os,sys; print(sum(len(b.get("devices",[])) for b in json.load(sys.stdin) if b.get("name")==os.environ["BACKEND"]))' <<<"$json" 2>/dev/null || echo 1)"

    # The whole suite; fault cases run isolated (a device fault poisons the process's context).
    "$BIN" conformance --backend "$backend" --report "$OUT/conformance-$backend" > "$OUT/conformance.txt" 2>&1
    log "conformance: rc=$?"

    if [ -x "$DIRECT" ]; then
        "$DIRECT" > "$OUT/bench-vs-direct.md" 2>&1
        log "bench vs direct: rc=$?"
    else
        log "bench vs direct: $DIRECT not found"
    fi

    "$BIN" bench all_reduce --backend "$backend" -b 1K -e 256M -f 4 -g "${ndev:-1}" > "$OUT/bench-all_reduce.txt" 2>&1
    log "bench all_reduce (-g ${ndev:-1}): rc=$?"

    {
        echo "# $title backend on $arch"
        echo
        echo "Produced by \`scripts/$script\` on $(date -u +%Y-%m-%d). Environment:"
        echo
        echo '```text'; cat "$OUT/environment.txt"; cat "$OUT/devices.txt"; echo '```'
        echo
        echo "## Conformance (every case ran on the device unless listed as skipped)"
        echo
        echo '```text'
        grep -v '^passed' "$OUT/conformance-$backend/summary.txt" 2>/dev/null || tail -n 20 "$OUT/conformance.txt"
        echo '```'
        echo
        echo "## unihal against $direct_title"
        echo
        cat "$OUT/bench-vs-direct.md" 2>/dev/null
        echo
        echo "## $ccl_title all_reduce"
        echo
        echo '```text'; cat "$OUT/bench-all_reduce.txt"; echo '```'
    } > "$OUT/$backend-$arch.md"
    log "report: $OUT/$backend-$arch.md"
}
