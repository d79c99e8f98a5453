# Shared by .ci/run and scripts/asan.sh: sourced, not run.
#
# side_by_side "CMD1" "CMD2" runs two independent shell commands at once, each in its own subshell
# (errexit on), its output in its own log, printed whole (first CMD1's, then CMD2's) once both have
# ended; returns non-zero when either failed, naming it. A conformance run keeps about one core
# busy (its cases wait on timeouts, rendezvous and stream workers: 101% CPU on the CPU suite), so
# on CI's two cores two runs side by side take about the time of one.
# Call it as a plain command, never under `if`, `||` or `&&`: bash ignores errexit in everything a
# tested command runs, so a failing line inside CMD1 or CMD2 would no longer end it.
side_by_side() {
    local log1 log2 pid1 pid2 rc1=0 rc2=0
    log1="$(mktemp)"; log2="$(mktemp)"
    ( set -e; eval "$1" ) >"$log1" 2>&1 & pid1=$!
    ( set -e; eval "$2" ) >"$log2" 2>&1 & pid2=$!
    wait "$pid1" || rc1=$?
    wait "$pid2" || rc2=$?
    echo "--- side by side: '$1' (rc $rc1)"; cat "$log1"
    echo "--- side by side: '$2' (rc $rc2)"; cat "$log2"
    rm -f "$log1" "$log2"
    [ "$rc1" = 0 ] || { echo "failed: $1" >&2; return 1; }
    [ "$rc2" = 0 ] || { echo "failed: $2" >&2; return 1; }
}
