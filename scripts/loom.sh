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
#
# Every run takes the three builds, every planted defect and the quick models; the CPU backend's
# two costly groups (the stream worker's models, about 30 s; the rendezvous abort and timeout
# models, about 45 s) rotate, one per submission (matrix `loom` of .ci/slices;
# UNIHAL_CI_SLICE=all runs both).
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom"
export CARGO_TARGET_DIR=target/loom

echo "== loom: unihal-hal (host buffer, buffer lease) ($(date +%T))"
cargo test --release -p unihal-hal --features planted-defects --test loom --test loom_lease -- --nocapture
source scripts/lib/rotation.sh
CPU_MODELS=(planted_ rendezvous_success rendezvous_one_rank_fails compute_pool_jobs)
if in_slice loom 0; then CPU_MODELS+=(worker_); fi
if in_slice loom 1; then CPU_MODELS+=(rendezvous_abort rendezvous_timeout); fi
echo "== loom: unihal-cpu (stream worker, collective rendezvous, compute pool: ${CPU_MODELS[*]}) ($(date +%T))"
cargo test --release -p unihal-cpu --test loom -- "${CPU_MODELS[@]}"
echo "== loom: unihal-plugin (recycled host callback nodes) ($(date +%T))"
cargo test --release -p unihal-plugin --features planted-defects --test loom -- --nocapture
echo "== loom: all models passed ($(date +%T))"
