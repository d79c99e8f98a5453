# Shared by .ci/run and scripts/asan.sh: sourced, not run.
#
# Rotation of the large matrices (docs/RELIABILITY.md, "CI time"). Every run covers a fixed core;
# a matrix too costly to run whole on every submission runs one slice of it per run, chosen by
# the commit: slice = (number of commits reachable from HEAD) mod (the matrix's slice count), so
# consecutive commits on main walk through every slice. The slice is printed in the log.
#   UNIHAL_CI_SLICE=all   every slice of every matrix (scripts/full-matrix.sh sets it);
#   UNIHAL_CI_SLICE=K     slice K of every matrix (K modulo each matrix's count).
# A shallow clone takes the number from the commit's hash instead (every slice equally likely,
# consecutive ones not guaranteed to differ); outside git every slice runs.

# rotation_count: the number the slices are taken from (empty when every slice runs).
rotation_count() {
    local wanted="${UNIHAL_CI_SLICE:-}"
    if [ "$wanted" = all ]; then return 0; fi
    if [ -n "$wanted" ]; then
        [[ "$wanted" =~ ^[0-9]+$ ]] || { echo "UNIHAL_CI_SLICE must be 'all' or a number, not '$wanted'" >&2; return 1; }
        echo "$wanted"; return 0
    fi
    if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
        local hash; hash="$(git rev-parse --short=7 HEAD)"
        echo $((16#$hash)); return 0
    fi
    git rev-list --count HEAD 2>/dev/null || true
}

# in_slice MATRIX K N: true when slice K (of N) of MATRIX runs in this run; prints the decision
# once per slice so the log says what ran and what rotated out.
in_slice() {
    local matrix="$1" k="$2" n="$3" count
    count="$(rotation_count)" || exit 1
    if [ -z "$count" ]; then
        echo "== rotation: $matrix: slice $k of 0..$((n - 1)) runs (every slice: UNIHAL_CI_SLICE=all, or not a git checkout)"
        return 0
    fi
    if [ $((count % n)) = "$k" ]; then
        echo "== rotation: $matrix: slice $k of 0..$((n - 1)) runs (rotation number $count)"
        return 0
    fi
    echo "== rotation: $matrix: slice $k of 0..$((n - 1)) rotated out (rotation number $count; scripts/full-matrix.sh runs it)"
    return 1
}
