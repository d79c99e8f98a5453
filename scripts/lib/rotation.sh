# Shared by .ci/run and the heavy tools' scripts (asan.sh, fuzz.sh, loom.sh): sourced, not run.
#
# Rotation of the matrices too costly to run whole on every submission (docs/RELIABILITY.md,
# "CI time"). Every matrix, its fixed core and its slices are defined once, in .ci/slices; a
# matrix's period is its number of slices (at most 6). Slice k of a matrix runs in the submission
# whose number, modulo the period, is k. The number is .ci/submission, which every submission
# advances by exactly one (scripts/next-submission.sh): consecutive submissions step through
# every slice of every matrix, whatever else they change, and a run's coverage never depends on
# the machine's speed. The decision is printed in the log.
#   UNIHAL_CI_SLICE=all   every slice of every matrix (scripts/full-matrix.sh sets it);
#   UNIHAL_CI_SLICE=K     submission number K instead of .ci/submission's.

ROTATION_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ROTATION_SLICES="$ROTATION_ROOT/.ci/slices"

# rotation_count: the submission number the slices are taken from (empty when every slice runs).
rotation_count() {
    local wanted="${UNIHAL_CI_SLICE:-}"
    if [ "$wanted" = all ]; then return 0; fi
    if [ -n "$wanted" ]; then
        [[ "$wanted" =~ ^[0-9]+$ ]] || { echo "UNIHAL_CI_SLICE must be 'all' or a number, not '$wanted'" >&2; return 1; }
        echo "$wanted"; return 0
    fi
    local n
    n="$(tr -d ' \n' <"$ROTATION_ROOT/.ci/submission" 2>/dev/null)" || true
    [[ "$n" =~ ^[0-9]+$ ]] || { echo ".ci/submission must hold the submission number, not '$n'" >&2; return 1; }
    echo "$n"
}

# rotation_slices MATRIX: the slices of MATRIX in .ci/slices, one per line, in order.
rotation_slices() {
    awk -v m="$1" '
        /^matrix / { cur = substr($0, 8); next }
        /^slice / && cur == m { print substr($0, 7) }' "$ROTATION_SLICES"
}

# in_slice MATRIX K: true when slice K of MATRIX runs in this run; prints the decision. Fails the
# run when .ci/slices has no such slice (a script and the definitions out of step).
in_slice() {
    local matrix="$1" k="$2" count n what
    n="$(rotation_slices "$matrix" | wc -l)"
    what="$(rotation_slices "$matrix" | sed -n "$((k + 1))p")"
    if [ "$n" = 0 ] || [ -z "$what" ]; then
        echo "rotation: .ci/slices defines no slice $k of matrix '$matrix'" >&2; exit 1
    fi
    count="$(rotation_count)" || exit 1
    if [ -z "$count" ]; then
        echo "== rotation: $matrix: slice $k of 0..$((n - 1)) runs (every slice: UNIHAL_CI_SLICE=all): $what"
        return 0
    fi
    if [ $((count % n)) = "$k" ]; then
        echo "== rotation: $matrix: slice $k of 0..$((n - 1)) runs (submission $count): $what"
        return 0
    fi
    echo "== rotation: $matrix: slice $k of 0..$((n - 1)) rotated out (submission $count; scripts/full-matrix.sh runs it): $what"
    return 1
}
