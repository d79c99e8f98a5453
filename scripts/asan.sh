#!/usr/bin/env bash
# AddressSanitizer and LeakSanitizer over the code paths that matter most when something fails.
# Every run (the core): the planted bugs must be reported (proof the sanitizer works), the CPU
# conformance suite (collectives included) and the fault sweeps of every backend (every failure
# path of the training step on CPU, CUDA, HIP and Ascend). By rotation, one slice of three per run
# (scripts/lib/rotation.sh; UNIHAL_CI_SLICE=all, as scripts/full-matrix.sh sets, runs all):
#   0: the unit and integration tests of hal and the CPU backend (collective early-leave tests
#      included), and the CUDA backend's whole suite on the simulated driver;
#   1: the caching allocator and DLPack tests, the plugin boundary's tests, and the HIP backend's
#      whole suite on the simulated runtime;
#   2: the simulated CANN stack's and the Ascend backend's tests, and the Ascend backend's whole
#      suite on the simulated CANN stack.
# Each slice is mostly compile time (a sanitized build of its test targets): the three take about
# the same.
#
# Nightly toolchain (the image has no rust-src, so std is not rebuilt: `-Zsanitizer=address
# --target <host>`). Its own target dir, so the ordinary build cache stays valid. A sanitized host
# that loads the sanitized simulated driver must export the ASan runtime's symbols
# (`-Wl,--export-dynamic`). Suppressions (scripts/lsan.supp) only for vendor and system libraries, each with
# its reason. Fails, never skips, when the nightly toolchain or NVRTC is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

TRIPLE=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR="$PWD/target/asan"
export RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes -Clink-arg=-Wl,--export-dynamic"
export RUSTDOCFLAGS="-Zsanitizer=address"
# use_sigaltstack=0: at a thread's exit ASan unmaps whatever alternate signal stack is registered,
# assuming it is its own; LLVM inside hiprtc (comgr) registers a malloc'd one (MINSIGSTKSZ + 64 KiB)
# on a thread where it installs its signal handlers, so that thread's exit killed the run ("AddressSanitizer failed to
# deallocate 0x134c0 bytes ... UnsetAlternateSignalStack", a conformance case thread of the HIP
# suite). Fixed upstream in compiler-rt (llvm-project PR 194868); Rust's own stack-overflow
# handler keeps its alternate stacks. Memory errors and leaks are reported as before.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1:use_sigaltstack=0"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
# One feature resolution for every cargo command below (nightly's workspace-wide unification,
# dev-dependencies included): each command otherwise resolves features for the packages and
# targets it selects, and the root package's dev-dependencies (criterion: serde's `alloc`,
# either's `std`, regex's `meta`) and the fault sweeps' `unihal-cpu/fault-injection` gave the
# fault sweeps' build other feature sets than the rest, so it compiled the sanitized stack a
# second time (serde and all above it). Every command also builds a target that needs the
# dev-dependencies (a test or an example), as the workspace-wide resolution then includes them.
export CARGO_RESOLVER_FEATURE_UNIFICATION=workspace CARGO_UNSTABLE_FEATURE_UNIFICATION=true
BIN="$CARGO_TARGET_DIR/$TRIPLE/debug"
CARGO="cargo +nightly"

step() { echo "== asan: $* ($(date +%T))"; }

source scripts/lib/rotation.sh
source scripts/lib/side-by-side.sh
SLICE0=false SLICE1=false SLICE2=false
in_slice "ASan slice: hal and CPU tests, CUDA suite" 0 3 && SLICE0=true
in_slice "ASan slice: allocator, DLPack and plugin tests, HIP suite" 1 3 && SLICE1=true
in_slice "ASan slice: simulated CANN and Ascend tests, Ascend suite" 2 3 && SLICE2=true

step "planted bugs must be reported"
$CARGO build -q --target "$TRIPLE" -p unihal-hal --example asan_planted
for bug in use-after-free:heap-use-after-free leak:detected\ memory\ leaks; do
    arg="${bug%%:*}"; want="${bug#*:}"
    if out="$("$BIN/examples/asan_planted" "$arg" 2>&1)"; then
        echo "$out"; echo "AddressSanitizer missed the planted $arg" >&2; exit 1
    fi
    grep -q "$want" <<<"$out" || { echo "$out"; echo "no '$want' report for the planted $arg" >&2; exit 1; }
    echo "planted $arg: reported ($want)"
done

if $SLICE0; then
    step "hal and CPU backend unit and integration tests"
    $CARGO test -q --target "$TRIPLE" -p unihal-hal -p unihal-cpu
fi
if $SLICE1; then
    step "caching allocator and DLPack tests (not the numpy one: Python would load a sanitized library)"
    $CARGO test -q --target "$TRIPLE" -p unihal-alloc
    $CARGO test -q --target "$TRIPLE" -p unihal-dlpack --lib --test roundtrip
fi
if $SLICE2; then
    step "the simulated CANN stack's tests (descriptors, executors, workspaces, HCCL failure paths)"
    $CARGO test -q --target "$TRIPLE" -p unihal-sim-cann
    step "the Ascend backend's tests on the simulated CANN stack (layouts, ops, HCCL failure paths)"
    $CARGO test -q --target "$TRIPLE" -p unihal-ascend
fi

# The suite through the sanitized `unihal` binary, each case on device 0 (the other devices take
# part as peer ranks): the whole suite once, at a quarter of the per-device run's time. The runs
# are independent processes, two at a time (scripts/lib/side-by-side.sh).
step "build the sanitized unihal binary, simulated runtimes, fault sweeps and plugin tests"
$CARGO build -q --target "$TRIPLE" -p unihal-sim-cuda -p unihal-sim-hip -p unihal-sim-cann -p unihal \
    --features unihal/gloo --lib --bin unihal --example make_layout --test fault_sweep
"$BIN/examples/make_layout" "$PWD/target/asan-cann" "$BIN/libunihal_sim_cann.so" >/dev/null
PLUGIN_TESTS=(-p unihal-plugin --test ownership --test export_boundary --test refusals --test c_plugin --test c_async_plugin --test template_plugin)
if $SLICE1; then $CARGO test -q --target "$TRIPLE" "${PLUGIN_TESTS[@]}" --no-run; fi
SIM="$BIN/libunihal_sim_cuda.so"
HIP_SIM="$BIN/libunihal_sim_hip.so"
test -e "$SIM" || { echo "no sanitized simulated driver at $SIM" >&2; exit 1; }

cpu_suite() {
    "$BIN/unihal" conformance --backend cpu --max-devices 1 --report target/asan-conformance-cpu
}
cuda_suite() {
    UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_CUDA_LIB="$SIM" UNIHAL_NCCL_LIB="$SIM" \
        UNIHAL_KERNEL_CACHE="$PWD/target/kernel-cache" \
        "$BIN/unihal" conformance --backend cuda --max-devices 1 --report target/asan-conformance-cuda
    grep -q '"simulated": true' target/asan-conformance-cuda/conformance.json \
        || { echo "the sanitized CUDA run did not use the simulated driver" >&2; exit 1; }
}
hip_suite() {
    UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_HIP_LIB="$HIP_SIM" UNIHAL_RCCL_LIB="$HIP_SIM" \
        UNIHAL_ROCBLAS_LIB="$HIP_SIM" \
        UNIHAL_SIM_NCCL_FLAVOR=rccl UNIHAL_SIM_HIP_NUMBERING=legacy UNIHAL_SIM_HIP_ARCH=gfx906 \
        UNIHAL_KERNEL_CACHE="$PWD/target/kernel-cache" \
        "$BIN/unihal" conformance --backend hip --max-devices 1 --report target/asan-conformance-hip
    grep -q '"simulated": true' target/asan-conformance-hip/conformance.json \
        || { echo "the sanitized HIP run did not use the simulated runtime" >&2; exit 1; }
}
ascend_suite() {
    UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_ASCEND_LIB="$PWD/target/asan-cann/classic/lib64" \
        "$BIN/unihal" conformance --backend ascend --max-devices 1 --report target/asan-conformance-ascend
    grep -q '"simulated": true' target/asan-conformance-ascend/conformance.json \
        || { echo "the sanitized Ascend run did not use the simulated CANN stack" >&2; exit 1; }
}
# The gloo engine one rank per process (the binary's CPU backend has it; libgloo itself is not
# instrumented, but ASan checks every range its `read`/`recv` write into): the collective suite on
# two processes meeting through rank 0's c10d store, then dead ranks, the failure path where a
# late transfer could write into a dropped buffer: 5 times, rank 1 of a benchmark killed and
# rank 0 must fail (its connection broken, or its 5 s timeout) with no sanitizer report.
gloo_spmd() {
    local dir="target/asan-gloo" port r
    rm -rf "$dir"; mkdir -p "$dir"
    ranks() {  # N ARGS...: N ranks with torchrun's variables, rank 0 serving the store
        local n="$1"; shift
        port=$((20000 + RANDOM % 20000))
        for r in $(seq 0 $((n - 1))); do
            RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
                "$BIN/unihal" "$@" >"$dir/rank-$r.log" 2>&1 &
            eval "PID$r=\$!"
        done
    }
    ranks 2 conformance --backend cpu --filter ccl.
    wait "$PID0" && wait "$PID1" \
        || { cat "$dir"/rank-*.log; echo "the sanitized gloo suite failed" >&2; return 1; }
    grep -q 'SPMD run: 2 ranks of gloo' "$dir/rank-0.log" \
        || { cat "$dir/rank-0.log"; echo "the sanitized suite was not a gloo SPMD run" >&2; return 1; }
    # (This runs in side_by_side's subshell: the timeout stays here.)
    export UNIHAL_CCL_TIMEOUT=5
    for trial in 1 2 3 4 5; do
        ranks 2 bench all_reduce -b 1K -e 64K -f 2 -n 100000 -w 1
        local waited=0
        until grep -q '#wrong' "$dir/rank-0.log" 2>/dev/null; do
            sleep 0.05; waited=$((waited + 1))
            [ "$waited" -lt 1200 ] || { cat "$dir"/rank-*.log; echo "gloo trial $trial never started" >&2; return 1; }
        done
        sleep "0.$((RANDOM % 7))"
        kill -9 "$PID1"; wait "$PID1" 2>/dev/null || true
        if wait "$PID0"; then cat "$dir/rank-0.log"; echo "gloo trial $trial: rank 0 succeeded without rank 1" >&2; return 1; fi
        if grep -q 'AddressSanitizer\|LeakSanitizer' "$dir/rank-0.log" \
            || ! grep -q 'connection broke\|ranks \[1\] left\|timed out' "$dir/rank-0.log"; then
            cat "$dir/rank-0.log"; echo "gloo trial $trial: the survivor did not fail cleanly" >&2; return 1
        fi
    done
    echo "gloo under ASan: the suite on 2 processes passed; 5 killed ranks, 5 clean survivor failures"
}

# The whole CPU suite through a sanitized plugin found the launch-argument use-after-free
# (RELIABILITY.md, defect 13); here the plugin tests carry its regression test, the C plugins'
# and the template's suites (the template built out of the tree, sanitized: plugin/tests/support)
# and the loader's refusals (the full suite through the plugin runs unsanitized in the test
# command).
plugin_tests() {
    $CARGO test -q --target "$TRIPLE" "${PLUGIN_TESTS[@]}"
}

# The CPU suite (in process, and on gloo across processes) runs every time; the three simulated GPU
# backends' suites come with their slices:
# each is a whole suite of 4-6 minutes under the sanitizer, the fault sweeps below take every
# backend's failure paths on every run, and each backend's suite runs unsanitized in CI every time.
SUITES=(cpu_suite gloo_spmd)
if $SLICE0; then SUITES+=(cuda_suite); fi
if $SLICE1; then SUITES+=(hip_suite); fi
if $SLICE2; then SUITES+=(ascend_suite); fi
step "conformance suites: ${SUITES[*]} (CUDA on the simulated driver and NCCL, HIP on the simulated runtime, RCCL and rocBLAS with the legacy numbering, Ascend on the simulated CANN stack with HCCL)"
while [ "${#SUITES[@]}" -ge 2 ]; do
    side_by_side "${SUITES[0]}" "${SUITES[1]}"
    SUITES=("${SUITES[@]:2}")
done
if [ "${#SUITES[@]}" = 1 ]; then "${SUITES[0]}"; fi
if $SLICE1; then
    step "the plugin boundary: ownership, the exporter, the C and template plugins, the loader's refusals"
    plugin_tests
fi
# The fault sweeps take every failure path of the training step on the four backends, where
# memory bugs hide: they found a heap-use-after-free in the simulated collectives (RELIABILITY.md,
# defect 22) only under the sanitizer reliably. Leak checking off here: the sweeps account for
# every object themselves (live counters), their planted leak leaks on purpose, and a release a
# failed call left to the runtime stays with it.
step "fault sweeps (CPU, and CUDA, HIP, Ascend on their simulated runtimes)"
ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" $CARGO test -q --target "$TRIPLE" --test fault_sweep
step "done"
