#!/usr/bin/env bash
# The whole CI matrix in one command: `.ci/run` with every slice of every rotated matrix
# (scripts/lib/rotation.sh): both HIP attribute numberings and both Ascend chips in the simulated
# suites, and every simulated GPU backend's suite under AddressSanitizer. Run it before a change
# to a backend's numbering, layout or sanitizer-relevant code lands, or to cover what recent CI
# runs rotated out. Takes about 10 minutes more than a CI run (docs/RELIABILITY.md, "CI time").
set -euo pipefail
cd "$(dirname "$0")/.."
export UNIHAL_CI_SLICE=all
exec .ci/run "$@"
