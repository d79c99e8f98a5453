#!/usr/bin/env bash
# Fuzzing in CI (cargo fuzz, libFuzzer, AddressSanitizer; the nightly toolchain):
# 1. the planted panic (a fill whose value byte is in 0x4a..=0x4d, UNIHAL_FUZZ_PLANTED=panic) must
#    be found by a short run from the committed corpus, which itself holds no such fill (its
#    replay must pass): proves the fuzzer's mutations reach the calls it drives and that a panic
#    is reported with its input;
# 2. the uncounted view (a dropped `Buffer::slice` of an allocator block freed the block,
#    RELIABILITY.md defect 25; UNIHAL_FUZZ_PLANTED=uncounted-slice) must make `alloc_blocks` fail
#    with its own invariant's message, from a copy of its committed corpus within 120 s (its
#    seeds reach it at once: a slice dropped at once, an all_to_allv);
# 3. every committed corpus input and crash reproducer (fuzz/corpus/<target>,
#    fuzz/regressions/<target>) replays without a failure: they are the regression tests;
# 4. a short run from its corpus of one target by rotation (scripts/lib/rotation.sh; every target
#    with UNIHAL_CI_SLICE=all, as scripts/full-matrix.sh sets).
# One fuzz build serves all four: the planted defects are chosen at run time (fuzz/src/planted.rs),
# so no feature switch rebuilds the sanitized stack (each did: the HAL and everything above it).
# A soak is the same command with a longer FUZZ_SECONDS (docs/RELIABILITY.md has its figures).
# Fails, never skips, when the nightly toolchain or cargo-fuzz cannot be had.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

CARGO_FUZZ_VERSION="0.13.2"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
TRIPLE=x86_64-unknown-linux-gnu
OUT="target/$TRIPLE/release"

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    cargo install -q cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

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
cargo +nightly fuzz build -O

# The checks before the rotated run are independent processes (each target's own controls and
# directories): two at a time (scripts/lib/side-by-side.sh), the longest replay beside the rest.
source ../scripts/lib/side-by-side.sh
planted_panic() {
    step "planted panic must be found"
    rm -rf target/planted-corpus target/planted-artifacts && mkdir -p target/planted-corpus target/planted-artifacts
    # The committed corpus alone must not reach the planted panic: the search below has to mutate.
    UNIHAL_FUZZ_PLANTED=panic "$OUT/cpu_hal" -runs=0 -timeout=30 -detect_leaks=0 -artifact_prefix=target/planted-artifacts/ corpus/cpu_hal \
        >target/planted-replay.log 2>&1 \
        || { tail -30 target/planted-replay.log; echo "the committed corpus already holds the planted fill" >&2; exit 1; }
    # From a copy of the committed corpus, as a short CI run starts. Four planted values of 256 put
    # the search at 14-20 s here (6 runs; the one value 0x42 took 10-290 s, 9.5 minutes once in CI).
    cp corpus/cpu_hal/* target/planted-corpus/
    if out="$(UNIHAL_FUZZ_PLANTED=panic "$OUT/cpu_hal" target/planted-corpus -use_value_profile=1 -max_total_time=300 -timeout=30 -detect_leaks=0 \
            -artifact_prefix=target/planted-artifacts/ 2>&1)"; then
        echo "$out" | tail -5; echo "the fuzzer did not find the planted panic in 300 s" >&2; exit 1
    fi
    grep -q "planted panic" <<<"$out" || { echo "$out" | tail -30; echo "the fuzzer failed, but not on the planted panic" >&2; exit 1; }
    echo "planted panic found after $(grep -o '^#[0-9]*' <<<"$out" | tail -1) executions"
}
planted_uncounted_view() {
    step "planted uncounted view must be caught by alloc_blocks"
    rm -rf target/planted-alloc-corpus && mkdir -p target/planted-alloc-corpus
    cp corpus/alloc_blocks/* target/planted-alloc-corpus/
    if out="$(UNIHAL_FUZZ_PLANTED=uncounted-slice "$OUT/alloc_blocks" target/planted-alloc-corpus -max_total_time=120 -timeout=30 -detect_leaks=0 \
            -artifact_prefix=target/planted-artifacts/ 2>&1)"; then
        echo "$out" | tail -5; echo "alloc_blocks did not catch the uncounted view in 120 s" >&2; exit 1
    fi
    grep -qE "alloc_blocks: (allocator statistics|live blocks overlap|live block .* is not allocated|bytes differ)" <<<"$out" \
        || { echo "$out" | tail -30; echo "alloc_blocks failed, but not on a block invariant" >&2; exit 1; }
    echo "uncounted view caught: $(grep -m1 -o 'alloc_blocks: [^:]*' <<<"$out")"
}
# Every committed corpus input and crash reproducer of target $1 replays without a failure.
replay() {
    local t="$1"
    mkdir -p "corpus/$t" "regressions/$t"
    step "$t: replay the corpus and the crash reproducers"
    # (see ASAN_OPTIONS above)
    "$OUT/$t" -detect_leaks=0 -runs=0 -timeout=30 "corpus/$t" "regressions/$t"
}
TARGETS=(cpu_hal alloc_blocks cuda_sim_hal)
# The longest replay on one side; the planted checks and every other target's replay on the other.
LONGEST=cuda_sim_hal REST="planted_panic; planted_uncounted_view"
for t in "${TARGETS[@]}"; do [ "$t" = "$LONGEST" ] || REST+="; replay $t"; done
side_by_side "replay $LONGEST" "$REST"
source ../scripts/lib/rotation.sh
for i in "${!TARGETS[@]}"; do
    t="${TARGETS[$i]}"
    # (see ASAN_OPTIONS above)
    extra=(-detect_leaks=0)
    mkdir -p "target/work-corpus/$t"
    in_slice "fuzzing run: $t" "$i" "${#TARGETS[@]}" || continue
    step "$t: ${FUZZ_SECONDS} s from the corpus"
    cp -n "corpus/$t"/* "target/work-corpus/$t"/ 2>/dev/null || true
    rm -f target/artifacts-"$t"-*
    "$OUT/$t" "${extra[@]}" "target/work-corpus/$t" -max_total_time="$FUZZ_SECONDS" -timeout=30 \
        -rss_limit_mb=6144 -max_len=1024 -print_final_stats=1 -artifact_prefix="target/artifacts-$t-" \
        2>&1 | grep -E "^#[0-9]+\s+DONE|^Done|stat::number_of_executed_units|ERROR|panicked" || true
    if ls target/artifacts-"$t"-* >/dev/null 2>&1; then
        echo "the fuzzer found a failure in $t: target/artifacts-$t-*" >&2; exit 1
    fi
done
step "done"
