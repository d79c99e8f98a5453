#!/usr/bin/env bash
# The whole CI matrix in one command: `.ci/run` with every slice of every rotated matrix
# (scripts/lib/rotation.sh): both HIP attribute numberings and both Ascend chips in the simulated
# suites, the GPT tests on both simulated GPU runtimes, the three ASan slices (every simulated GPU
# backend's suite, the hal, CPU, allocator, DLPack, plugin, simulated CANN and Ascend tests) and a
# fuzzing run of every target. Run it before a change to a backend's numbering, layout or
# sanitizer-relevant code lands, or to cover what recent CI runs rotated out
# (docs/RELIABILITY.md, "CI time", has its cost). Its steps pass their budgets (the table marks
# them OVER); its hard limit is three hours, not a CI run's 80 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
export UNIHAL_CI_SLICE=all
export CI_LIMIT_S="${CI_LIMIT_S:-10800}"
exec .ci/run "$@"
