#!/usr/bin/env bash
# Fuzzing in CI (cargo fuzz, libFuzzer, AddressSanitizer; the nightly toolchain). Every bound is a
# number of executions from a fixed seed (-seed, -runs), never a clock, so what a run covers does
# not depend on the machine's speed:
# 1. the planted panic (a fill whose value byte is in 0x4a..=0x4d, UNIHAL_FUZZ_PLANTED=panic) must
#    be found from a copy of the committed corpus and fuzz/planted/cpu_hal (a fill of 0x49: one
#    mutation away) within PLANTED_RUNS
#    executions; the committed corpus itself holds no such fill (its replay must pass). Proves the
#    fuzzer's mutations reach the calls it drives and that a panic is reported with its input;
# 2. the uncounted view (a dropped `Buffer::slice` of an allocator block freed the block,
#    RELIABILITY.md defect 25; UNIHAL_FUZZ_PLANTED=uncounted-slice) must make `alloc_blocks` fail
#    with its own invariant's message, from a copy of its committed corpus within PLANTED_RUNS
#    executions (its seeds reach it at once: a slice dropped at once, an all_to_allv);
# 3. every crash reproducer (fuzz/regressions/<target>) of every target replays without a
#    failure: they are the regression tests; so does cpu_hal's committed corpus (in 1., with the
#    panic planted);
# 4. one slice by rotation (matrix `fuzz` of .ci/slices; every slice with UNIHAL_CI_SLICE=all,
#    as scripts/full-matrix.sh sets): a target fuzzed from its corpus and reproducers. libFuzzer
#    executes every one of them first (the replay), then FUZZ_MUTATIONS new inputs. cuda_sim_hal
#    runs about 15 inputs a second under ASan (cpu_hal several hundred), so its corpus is replayed
#    in two halves, a slice each (every other file by name), each followed by
#    CUDA_SIM_MUTATIONS new inputs: two consecutive submissions replay all of it.
# The fuzz targets come from the sanitized build scripts/asan.sh runs from (scripts/lib/sanitized.sh:
# AddressSanitizer and libFuzzer's coverage instrumentation, the nightly toolchain), built here
# when that build is not there yet: one compilation of the stack serves both tools. The planted
# defects are chosen at run time (fuzz/src/planted.rs), so no feature switch rebuilds it.
# A soak is a run by time instead: FUZZ_SECONDS=3600 (docs/RELIABILITY.md has its figures).
# Fails, never skips, when the nightly toolchain cannot be had. (`cargo fuzz run --features
# libfuzzer TARGET` in fuzz/ is the same fuzzer by hand.)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

FUZZ_MUTATIONS="${FUZZ_MUTATIONS:-2000}"
CUDA_SIM_MUTATIONS="${CUDA_SIM_MUTATIONS:-300}"
FUZZ_SECONDS="${FUZZ_SECONDS:-}"
PLANTED_RUNS=200000
SEED=1
source ../scripts/lib/sanitized.sh
OUT="$SANITIZED_BIN"

step() { echo "== fuzz: $* ($(date +%T))"; }

# No LeakSanitizer in the fuzzing processes, per input or at exit: the HAL's own threads (stream
# workers, the NCCL watchdog) finish asynchronously after their handles drop, and LeakSanitizer
# reports their thread start-up allocations when an input or the process ends while one is still
# exiting. Leaks are covered by the memory-accounting invariant and by LeakSanitizer over the
# sanitized tests and conformance runs (scripts/asan.sh). AddressSanitizer itself stays on.
export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

# The CUDA target's library ops come from NVRTC when it is on the library path; the kernel cache
# CI filled earlier spares each fuzzing process a compile of the whole library.
export UNIHAL_KERNEL_CACHE="${UNIHAL_KERNEL_CACHE:-$PWD/../target/kernel-cache}"

# The real runs below plant nothing, whatever the caller's environment says.
unset UNIHAL_FUZZ_PLANTED
step "build (every target; the planted defects off unless UNIHAL_FUZZ_PLANTED names one)"
sanitized_cargo build -q --bins

# The checks before the rotated run are independent processes (each target's own controls and
# directories): two at a time (scripts/lib/side-by-side.sh), the longest replay beside the rest.
source ../scripts/lib/side-by-side.sh
planted_panic() {
    step "planted panic must be found"
    rm -rf target/planted-corpus target/planted-artifacts && mkdir -p target/planted-corpus target/planted-artifacts
    # cpu_hal's replay (3. below) runs here, with the panic planted: every committed input and
    # reproducer must pass, so none holds the planted fill and the search below has to mutate.
    mkdir -p corpus/cpu_hal regressions/cpu_hal
    if ! UNIHAL_FUZZ_PLANTED=panic "$OUT/cpu_hal" -runs=0 -timeout=30 -detect_leaks=0 -artifact_prefix=target/planted-artifacts/ \
            corpus/cpu_hal regressions/cpu_hal >target/planted-replay.log 2>&1; then
        tail -30 target/planted-replay.log
        if grep -q "planted panic" target/planted-replay.log; then
            echo "the committed corpus already holds the planted fill" >&2
        else
            echo "cpu_hal: a committed input or reproducer fails" >&2
        fi
        exit 1
    fi
    echo "cpu_hal: the corpus and the crash reproducers replay (the panic planted, not reached)"
    # From a copy of the committed corpus and the planted seed (a fill of 0x49), with a fixed seed
    # and a bound in executions: the same search on every machine. (From the planted seed alone
    # the search wandered: no find in 9,000 executions.)
    cp corpus/cpu_hal/* planted/cpu_hal/* target/planted-corpus/
    if out="$(UNIHAL_FUZZ_PLANTED=panic "$OUT/cpu_hal" target/planted-corpus -seed=$SEED -runs=$PLANTED_RUNS \
            -use_value_profile=1 -timeout=30 -detect_leaks=0 -artifact_prefix=target/planted-artifacts/ 2>&1)"; then
        echo "$out" | tail -5; echo "the fuzzer did not find the planted panic in $PLANTED_RUNS executions" >&2; exit 1
    fi
    grep -q "planted panic" <<<"$out" || { echo "$out" | tail -30; echo "the fuzzer failed, but not on the planted panic" >&2; exit 1; }
    echo "planted panic found after $(grep -o '^#[0-9]*' <<<"$out" | tail -1) executions"
}
planted_uncounted_view() {
    step "planted uncounted view must be caught by alloc_blocks"
    rm -rf target/planted-alloc-corpus && mkdir -p target/planted-alloc-corpus
    cp corpus/alloc_blocks/* target/planted-alloc-corpus/
    if out="$(UNIHAL_FUZZ_PLANTED=uncounted-slice "$OUT/alloc_blocks" target/planted-alloc-corpus -seed=$SEED -runs=$PLANTED_RUNS -timeout=30 -detect_leaks=0 \
            -artifact_prefix=target/planted-artifacts/ 2>&1)"; then
        echo "$out" | tail -5; echo "alloc_blocks did not catch the uncounted view in $PLANTED_RUNS executions" >&2; exit 1
    fi
    grep -qE "alloc_blocks: (allocator statistics|live blocks overlap|live block .* is not allocated|bytes differ)" <<<"$out" \
        || { echo "$out" | tail -30; echo "alloc_blocks failed, but not on a block invariant" >&2; exit 1; }
    echo "uncounted view caught: $(grep -m1 -o 'alloc_blocks: [^:]*' <<<"$out")"
}
# Every crash reproducer of target $1 replays without a failure.
replay() {
    local t="$1"
    mkdir -p "regressions/$t"
    step "$t: replay the crash reproducers"
    # (see ASAN_OPTIONS above)
    "$OUT/$t" -detect_leaks=0 -runs=0 -timeout=30 "regressions/$t"
}
TARGETS=(cpu_hal alloc_blocks cuda_sim_hal)
# The slices of matrix `fuzz`, in .ci/slices' order: TARGET [PART/PARTS of its corpus].
SLICES=(cpu_hal alloc_blocks "cuda_sim_hal 0/2" "cuda_sim_hal 1/2")
source ../scripts/lib/rotation.sh
FUZZED=()
for i in "${!SLICES[@]}"; do if in_slice fuzz "$i"; then FUZZED+=("${SLICES[$i]}"); fi; done
fuzzed() { [[ " ${FUZZED[*]} " == *" $1"* ]]; }
# The targets not fuzzed this run replay their crash reproducers, beside the planted checks.
# (cpu_hal's replay, its corpus too, is part of planted_panic.)
REPLAYS=()
for t in "${TARGETS[@]}"; do fuzzed "$t" || [ "$t" = cpu_hal ] || REPLAYS+=("replay $t"); done
if [ "${#REPLAYS[@]}" = 0 ]; then REPLAYS=(true); fi
side_by_side "${REPLAYS[0]}" "planted_panic; planted_uncounted_view$(printf '; %s' "${REPLAYS[@]:1}")"
for slice in "${FUZZED[@]}"; do
    read -r t part <<<"$slice"
    # (see ASAN_OPTIONS above)
    extra=(-detect_leaks=0)
    mkdir -p "regressions/$t"
    mutations=$FUZZ_MUTATIONS
    if [ -n "$part" ]; then
        # A part of the committed corpus: every PARTS-th file by name from the PART-th, in a
        # working directory of its own, so the replay is the same set in every run.
        work="target/work-corpus/$t.part${part%/*}"
        rm -rf "$work" && mkdir -p "$work"
        ls "corpus/$t" | sort | awk -v k="${part%/*}" -v n="${part#*/}" '(NR - 1) % n == k' \
            | while read -r f; do cp "corpus/$t/$f" "$work/"; done
        mutations=$CUDA_SIM_MUTATIONS
    else
        work="target/work-corpus/$t"
        mkdir -p "$work"
        cp -n "corpus/$t"/* "$work"/ 2>/dev/null || true
    fi
    if [ -n "$FUZZ_SECONDS" ]; then
        bound=(-max_total_time="$FUZZ_SECONDS")
    else
        # libFuzzer counts the corpus's executions in -runs: the new inputs come on top.
        bound=(-seed=$SEED -runs=$(($(ls "$work" "regressions/$t" | wc -l) + mutations)))
    fi
    step "$t${part:+ (corpus part $part)}: its corpus and reproducers, then ${bound[*]}"
    rm -f target/artifacts-"$t"-*
    "$OUT/$t" "${extra[@]}" "$work" "regressions/$t" "${bound[@]}" -timeout=30 \
        -rss_limit_mb=6144 -max_len=1024 -print_final_stats=1 -artifact_prefix="target/artifacts-$t-" \
        2>&1 | grep -E "^#[0-9]+\s+(INITED|DONE)|^Done|stat::number_of_executed_units|ERROR|panicked" || true
    if ls target/artifacts-"$t"-* >/dev/null 2>&1; then
        echo "the fuzzer found a failure in $t: target/artifacts-$t-*" >&2; exit 1
    fi
done
step "done"
