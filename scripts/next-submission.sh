#!/usr/bin/env bash
# Advances .ci/submission by exactly one and regenerates docs/RELIABILITY.md's rotation table:
# run once per submission (CONTRIBUTING.md), so that consecutive submissions step through every
# slice of every rotated matrix (.ci/slices, scripts/lib/rotation.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
n="$(tr -d ' \n' <.ci/submission)"
[[ "$n" =~ ^[0-9]+$ ]] || { echo ".ci/submission must hold a number, not '$n'" >&2; exit 1; }
echo $((n + 1)) >.ci/submission
scripts/rotation-table.sh --write
echo "submission $((n + 1)): commit .ci/submission and docs/RELIABILITY.md with the change"
