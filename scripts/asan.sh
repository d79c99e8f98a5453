#!/usr/bin/env bash
# AddressSanitizer and LeakSanitizer over the code paths that matter most when something fails,
# from the one sanitized build the fuzzers share (scripts/lib/sanitized.sh).
# Every run (the core): the planted bugs must be reported (proof the sanitizer works), the gloo
# engine one rank per process with killed ranks, and the fault sweeps of every backend (every
# failure path of the training step on CPU, CUDA, HIP and Ascend). By rotation, one slice of six
# per submission (matrix `asan` of .ci/slices; UNIHAL_CI_SLICE=all, as scripts/full-matrix.sh
# sets, runs all). A GPU backend's suite takes about eight minutes here, so each is split in two
# shares (`unihal conformance --partition K/2`: every other case), one per slice, and the shares
# of the slices are about equal:
#   0: the CUDA backend's suite on the simulated driver and NCCL, share 1/2; the unit and
#      integration tests of hal and the CPU backend (collective early-leave tests included);
#   1: the CUDA suite, share 2/2; the simulated CANN stack's and the Ascend backend's tests;
#   2: the HIP backend's suite on the simulated runtime, RCCL and rocBLAS, share 1/2; the caching
#      allocator and DLPack tests, and the plugin boundary's tests;
#   3: the HIP suite, share 2/2;
#   4: the Ascend backend's suite on the simulated CANN stack and HCCL, share 1/2; the CPU
#      conformance suite (collectives included), share 1/2;
#   5: the Ascend suite and the CPU suite, share 2/2.
# The runs are independent processes, two at a time (scripts/lib/side-by-side.sh): the slice
# beside the core's runs (the gloo processes, then the fault sweeps).
#
# Suppressions (scripts/lsan.supp) only for vendor and system libraries, each with its reason.
# Fails, never skips, when the nightly toolchain or NVRTC is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib/sanitized.sh
# use_sigaltstack=0: at a thread's exit ASan unmaps whatever alternate signal stack is registered,
# assuming it is its own; LLVM inside hiprtc (comgr) registers a malloc'd one (MINSIGSTKSZ + 64 KiB)
# on a thread where it installs its signal handlers, so that thread's exit killed the run ("AddressSanitizer failed to
# deallocate 0x134c0 bytes ... UnsetAlternateSignalStack", a conformance case thread of the HIP
# suite). Fixed upstream in compiler-rt (llvm-project PR 194868); Rust's own stack-overflow
# handler keeps its alternate stacks. Memory errors and leaks are reported as before.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1:use_sigaltstack=0"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
BIN="$SANITIZED_BIN"

step() { echo "== asan: $* ($(date +%T))"; }

source scripts/lib/rotation.sh
source scripts/lib/side-by-side.sh
SLICE=()
for k in 0 1 2 3 4 5; do if in_slice asan "$k"; then SLICE[k]=true; else SLICE[k]=false; fi; done

step "planted bugs must be reported"
sanitized_cargo build -q -p unihal-hal --example asan_planted
for bug in use-after-free:heap-use-after-free leak:detected\ memory\ leaks; do
    arg="${bug%%:*}"; want="${bug#*:}"
    if out="$("$BIN/examples/asan_planted" "$arg" 2>&1)"; then
        echo "$out"; echo "AddressSanitizer missed the planted $arg" >&2; exit 1
    fi
    grep -q "$want" <<<"$out" || { echo "$out"; echo "no '$want' report for the planted $arg" >&2; exit 1; }
    echo "planted $arg: reported ($want)"
done

# Everything the runs below start, built before any of them starts (builds beside runs would
# only slow both): the `unihal` binary (with the gloo engine), the simulated runtimes, the fault
# sweeps, the fuzz targets, and the slice's test binaries.
step "build the sanitized unihal binary, simulated runtimes, fault sweeps, fuzz targets and the slice's tests"
sanitized_cargo build -q -p unihal-sim-cuda -p unihal-sim-hip -p unihal-sim-cann -p unihal \
    --lib --bins --example make_layout --test fault_sweep
"$BIN/examples/make_layout" "$PWD/target/asan-cann" "$BIN/libunihal_sim_cann.so" >/dev/null
SLICE_TESTS=()
if ${SLICE[0]}; then SLICE_TESTS+=("-p unihal-hal -p unihal-cpu"); fi
if ${SLICE[1]}; then SLICE_TESTS+=("-p unihal-sim-cann" "-p unihal-ascend"); fi
if ${SLICE[2]}; then
    # (Not DLPack's numpy test: Python would load a sanitized library.)
    SLICE_TESTS+=("-p unihal-alloc" "-p unihal-dlpack --lib" "-p unihal-dlpack --test all -- roundtrip::"
        "-p unihal-plugin --test all -- ownership:: export_boundary:: refusals::"
        "-p unihal-plugin --test c_plugin --test c_async_plugin --test template_plugin")
fi
# (An entry is cargo's arguments, then `--` and the test binary's name filters where it has any.)
for t in "${SLICE_TESTS[@]}"; do
    # shellcheck disable=SC2086
    sanitized_cargo test -q ${t%% -- *} --no-run
done
SIM="$BIN/libunihal_sim_cuda.so"
HIP_SIM="$BIN/libunihal_sim_hip.so"
test -e "$SIM" || { echo "no sanitized simulated driver at $SIM" >&2; exit 1; }

# The suites through the sanitized `unihal` binary, each case on device 0 (the other devices take
# part as peer ranks), one share of two (`--partition K/2`; the argument).
suite() {  # BACKEND SHARE [VAR=VALUE ...]
    local backend="$1" share="$2"; shift 2
    local report="target/asan-conformance-$backend-${share/\//of}"
    env "$@" UNIHAL_SIM_MODE=concurrent UNIHAL_SIM_DEVICES=4 UNIHAL_KERNEL_CACHE="$PWD/target/kernel-cache" \
        "$BIN/unihal" conformance --backend "$backend" --max-devices 1 --partition "$share" --report "$report"
    if [ "$backend" != cpu ]; then
        grep -q '"simulated": true' "$report/conformance.json" \
            || { echo "the sanitized $backend run did not use its simulated runtime" >&2; exit 1; }
    fi
}
cpu_suite() { suite cpu "$1"; }
cuda_suite() { suite cuda "$1" UNIHAL_CUDA_LIB="$SIM" UNIHAL_NCCL_LIB="$SIM"; }
hip_suite() {
    suite hip "$1" UNIHAL_HIP_LIB="$HIP_SIM" UNIHAL_RCCL_LIB="$HIP_SIM" UNIHAL_ROCBLAS_LIB="$HIP_SIM" \
        UNIHAL_SIM_NCCL_FLAVOR=rccl UNIHAL_SIM_HIP_NUMBERING=legacy UNIHAL_SIM_HIP_ARCH=gfx906
}
ascend_suite() { suite ascend "$1" UNIHAL_ASCEND_LIB="$PWD/target/asan-cann/classic/lib64"; }
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

# The slice's unit and integration tests: the hal and CPU backend tests (collective early-leave
# tests included); the caching allocator and DLPack tests, and the plugin boundary (the whole CPU
# suite through a sanitized plugin found the launch-argument use-after-free, RELIABILITY.md
# defect 13: the plugin tests carry its regression test, the C plugins' and the template's suites,
# the template built out of the tree, sanitized, and the loader's refusals); the simulated CANN
# stack's tests (descriptors, executors, workspaces, HCCL failure paths) and the Ascend backend's
# (layouts, ops, HCCL failure paths).
slice_tests() {
    local t
    for t in "${SLICE_TESTS[@]}"; do
        # shellcheck disable=SC2086
        sanitized_cargo test -q $t
    done
}
# The fault sweeps take every failure path of the training step on the four backends, where
# memory bugs hide: they found a heap-use-after-free in the simulated collectives (RELIABILITY.md,
# defect 22) only under the sanitizer reliably. Leak checking off here: the sweeps account for
# every object themselves (live counters), their planted leak leaks on purpose, and a release a
# failed call left to the runtime stays with it.
fault_sweeps() {
    ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" sanitized_cargo test -q -p unihal --test fault_sweep
}

# The slice: suite shares, then its tests (UNIHAL_CI_SLICE=all: every share and every test).
SLICE_RUNS=()
if ${SLICE[0]}; then SLICE_RUNS+=("cuda_suite 1/2"); fi
if ${SLICE[1]}; then SLICE_RUNS+=("cuda_suite 2/2"); fi
if ${SLICE[2]}; then SLICE_RUNS+=("hip_suite 1/2"); fi
if ${SLICE[3]}; then SLICE_RUNS+=("hip_suite 2/2"); fi
if ${SLICE[4]}; then SLICE_RUNS+=("ascend_suite 1/2" "cpu_suite 1/2"); fi
if ${SLICE[5]}; then SLICE_RUNS+=("ascend_suite 2/2" "cpu_suite 2/2"); fi
if [ "${#SLICE_TESTS[@]}" -gt 0 ]; then SLICE_RUNS+=(slice_tests); fi
SLICE_RUN="$(IFS=';'; echo "${SLICE_RUNS[*]}")"
# The core: gloo one rank per process (its collective timeout in a subshell of its own), then the
# fault sweeps.
core_runs() {
    ( gloo_spmd )
    fault_sweeps
}
step "the slice ($SLICE_RUN) beside the core (gloo one rank per process, then the fault sweeps of the CPU, and CUDA, HIP, Ascend on their simulated runtimes)"
side_by_side "$SLICE_RUN" core_runs
step "done"
