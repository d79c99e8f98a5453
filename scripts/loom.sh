#!/usr/bin/env bash
# Model checking with loom (https://docs.rs/loom) of unihal's own concurrency protocols, over the
# production code: the host buffer's map/use states (hal/tests/loom.rs, with a planted Relaxed
# ordering loom must report), the buffer lease of sub-allocated blocks (hal/tests/loom_lease.rs:
# clones, views, drops, queued uses and reclaim racing, with the planted uncounted view of feature
# `planted-defects` loom must report) and the CPU backend's stream worker and collective rendezvous
# and compute pool (backends/cpu/tests/loom.rs), and the plugin host's pool of recycled host callback nodes
# (plugin/tests/loom.rs: takes, give-backs and the close racing, with the planted two-step close
# of feature `planted-defects` loom must report). Their primitives come from `unihal_hal::sync`,
# which is loom's under `--cfg loom`; the loom builds of unihal-cpu and unihal-plugin compile only
# those protocols (not faer or the kernels' C++; not libloading or the plugin host).
#
# Its own target dir, so the ordinary build cache stays valid. Release mode: loom explores many
# thousands of executions. Exits non-zero when a model fails (a race, a deadlock, a failed
# assertion) or when the planted bug goes unreported. Environment: LOOM_* variables (see loom's
# docs), e.g. LOOM_LOG=1 or LOOM_LOCATION=1 to investigate a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR=target/loom

echo "== loom: unihal-hal (host buffer, buffer lease) ($(date +%T))"
cargo test --release -p unihal-hal --features planted-defects --test loom --test loom_lease -- --nocapture
echo "== loom: unihal-cpu (stream worker, collective rendezvous) ($(date +%T))"
cargo test --release -p unihal-cpu --test loom
echo "== loom: unihal-plugin (recycled host callback nodes) ($(date +%T))"
cargo test --release -p unihal-plugin --features planted-defects --test loom -- --nocapture
echo "== loom: all models passed ($(date +%T))"
