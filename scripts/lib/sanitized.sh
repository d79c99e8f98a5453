# Shared by scripts/asan.sh and scripts/fuzz.sh: sourced, not run.
#
# The one sanitized build both tools run from (target/asan): the nightly toolchain (the image has
# no rust-src, so std is not rebuilt: `-Zsanitizer=address --target <host>`), AddressSanitizer and
# LeakSanitizer, and libFuzzer's coverage instrumentation (inline 8-bit counters, the PC table,
# comparison tracing: the flags cargo fuzz passes). The fuzz targets link libFuzzer; every other
# binary (the `unihal` CLI, the tests, the simulated runtimes) gets the sanitizer runtime's
# no-op coverage hooks, so one compilation of the stack serves the sanitizer runs and the
# fuzzers. A sanitized host that loads a sanitized simulated runtime exports the runtime's
# symbols (`-Wl,--export-dynamic`). Its own target dir, so the ordinary build cache stays valid.
#
# `sanitized_cargo SUBCOMMAND ARGS...` runs cargo on this build. Every command resolves features
# once for the whole workspace (nightly's workspace-wide unification, dev-dependencies included)
# with one feature set (the fuzz crate's `sanitized-build`: its targets, the HAL's run-time
# planted-defect switches, the CPU backend's gloo engine), so that no command resolves another
# and compiles the sanitized stack a second time (each did: the root package's dev-dependencies
# gave serde and everything above it other features). Every command also builds a target that needs the
# dev-dependencies (a test or an example), as the workspace-wide resolution then includes them.

SANITIZED_TRIPLE=x86_64-unknown-linux-gnu
SANITIZED_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/target/asan"
# The binaries: "$SANITIZED_BIN/unihal", "$SANITIZED_BIN/cpu_hal", ...
SANITIZED_BIN="$SANITIZED_DIR/$SANITIZED_TRIPLE/debug"

# libFuzzer's coverage instrumentation for the workspace's crates only (nightly's profile
# rustflags: the dev profile's for every package, none for the dependencies, `"*"`, and none for
# build scripts and proc macros): the fuzzers steer by our code's branches, and the dependencies
# (faer's generated GEMM kernels above all) compile without it, in about half the time. ASan
# itself is in RUSTFLAGS, for every crate (its flag must agree across a binary's crates).
# The dependencies at opt-level 1 here (2 in the ordinary dev build): the cold sanitized build
# took 409 s at 2 and 272 s at 1, and ASan's HIP slice ran as fast (246 s against 258 s); the
# simulated runtimes keep their own opt-level 2 (named packages, Cargo.toml).
SANCOV='["-Cpasses=sancov-module", "-Cllvm-args=-sanitizer-coverage-level=4",
"-Cllvm-args=-sanitizer-coverage-inline-8bit-counters", "-Cllvm-args=-sanitizer-coverage-pc-table",
"-Cllvm-args=-sanitizer-coverage-trace-compares"]'

sanitized_cargo() {
    local sub="$1"; shift
    CARGO_TARGET_DIR="$SANITIZED_DIR" \
    RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes -Clink-arg=-Wl,--export-dynamic --cfg fuzzing" \
    RUSTDOCFLAGS="-Zsanitizer=address" \
    CARGO_RESOLVER_FEATURE_UNIFICATION=workspace CARGO_UNSTABLE_FEATURE_UNIFICATION=true \
        cargo +nightly -Zprofile-rustflags --config "profile.dev.rustflags=$SANCOV" \
        --config 'profile.dev.package."*".rustflags=[]' --config 'profile.dev.build-override.rustflags=[]' \
        --config 'profile.dev.package."*".opt-level=1' \
        "$sub" --target "$SANITIZED_TRIPLE" -p unihal-fuzz \
        --features unihal-fuzz/sanitized-build "$@"
}
