# Shared by .ci/run: sourced, not run.
#
# Steps, their budgets and the run's report. A step is opened with its name and its budget in
# seconds (build and run together); `ci_build CMD...` runs a command that compiles and counts its
# seconds as the step's build time (the rest of the step is run time). When the run ends, passed
# or failed, a table of every step is printed: build, run and total seconds, the budget, and
# `OVER` on a step that took longer than its budget; the last line reads `CI total: N s`.
#
# A step over its budget does not fail the run (a slow machine is not a defect); the table shows
# it, and docs/RELIABILITY.md keeps the latest cold run's table. The run as a whole has a hard
# limit, CI_LIMIT_S (80 minutes): a watchdog then stops every process the run started, and the run
# prints the table so far and fails, naming the step it stopped in (CI's own limit is 90 minutes:
# a clear failure beats a run killed with nothing said).
#
#   ci_begin                  check the budgets' sum, start the clock, the watchdog and the report
#                             (once, at the top)
#   ci_step NAME BUDGET_S     close the open step and open the next
#   ci_build CMD...           run CMD, counting its time as build time of the open step

CI_LIMIT_S="${CI_LIMIT_S:-4800}"
# The sum of every step's budget may not pass this (45 minutes): a new step takes its seconds from
# another step's budget or from a rotation (CONTRIBUTING.md).
CI_BUDGETS_MAX_S=2700
CI_STEPS_FILE=""
CI_STEP_NAME=""
CI_STEP_BUDGET=0
CI_STEP_START=0
CI_STEP_BUILD=0

ci_now() { date +%s; }

ci_free_space() {
    df -h . | awk 'NR == 2 { printf "== ci: disk: %s free of %s", $4, $2 }'
    echo "; target/ $(du -sh target 2>/dev/null | cut -f1)"
}

# The open step's line goes to the report file: name, build s, run s, budget s.
ci_close_step() {
    [ -n "$CI_STEP_NAME" ] || return 0
    local now total run
    now=$(ci_now); total=$((now - CI_STEP_START)); run=$((total - CI_STEP_BUILD))
    printf '%s\t%s\t%s\t%s\n' "$CI_STEP_NAME" "$CI_STEP_BUILD" "$run" "$CI_STEP_BUDGET" >>"$CI_STEPS_FILE"
    echo "== ci: step '$CI_STEP_NAME' took $total s (build $CI_STEP_BUILD s, run $run s; budget $CI_STEP_BUDGET s; CI so far $((now - CI_START)) s)"
    CI_STEP_NAME=""
}

ci_step() {
    ci_close_step
    CI_STEP_NAME="$1"; CI_STEP_BUDGET="$2"; CI_STEP_START=$(ci_now); CI_STEP_BUILD=0
    echo "$1" >>"$CI_STEPS_FILE.open"
    echo "== ci: $1 (budget $2 s)"
    ci_free_space
}

ci_build() {
    local t0 rc=0
    t0=$(ci_now)
    "$@" || rc=$?
    CI_STEP_BUILD=$((CI_STEP_BUILD + $(ci_now) - t0))
    return "$rc"
}

# The table of every closed step, as Markdown (docs/RELIABILITY.md quotes it as printed).
ci_report() {
    local end; end=$(ci_now)
    echo
    echo "| step | build s | run s | total s | budget s | |"
    echo "|---|---:|---:|---:|---:|---|"
    awk -F'\t' '{
        total = $2 + $3; mark = (total > $4) ? "OVER" : ""
        printf "| %s | %d | %d | %d | %d | %s |\n", $1, $2, $3, total, $4, mark
        sb += $2; sr += $3; st += total; sg += $4
    } END { printf "| **all steps** | %d | %d | %d | %d | |\n", sb, sr, st, sg }' "$CI_STEPS_FILE"
    echo
    echo "CI total: $((end - CI_START)) s"
}

# Every process this shell started, children first (the watchdog's own excepted).
ci_descendants() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do
        [ "$child" = "$2" ] && continue
        ci_descendants "$child" "$2"
        echo "$child"
    done
}

ci_on_exit() {
    local rc=$?
    ci_close_step
    if [ -e "$CI_STEPS_FILE.limit" ]; then
        echo "== ci: FAILED: the run reached its limit of $CI_LIMIT_S s in step '$(cat "$CI_STEPS_FILE.limit")'; every process it started was stopped"
        rc=1
    fi
    if [ -n "${CI_WATCHDOG:-}" ]; then
        kill $(ci_descendants "$CI_WATCHDOG" none) "$CI_WATCHDOG" 2>/dev/null || true
    fi
    ci_report
    if [ "$rc" != 0 ]; then echo "== ci: FAILED (exit status $rc)"; fi
    exit "$rc"
}

# The budgets declared in the calling script (every `ci_step "NAME" SECONDS` line) add up to at
# most CI_BUDGETS_MAX_S; a script over it fails before anything runs.
ci_check_budgets() {
    local sum
    sum="$(sed -n 's/^ci_step ".*" \([0-9][0-9]*\)$/\1/p' "$1" | awk '{ s += $1 } END { print s + 0 }')"
    if [ "$sum" -gt "$CI_BUDGETS_MAX_S" ]; then
        echo "== ci: the steps' budgets in $1 add up to $sum s, over $CI_BUDGETS_MAX_S s: take the new seconds from another step or a rotation (CONTRIBUTING.md)" >&2
        exit 1
    fi
    echo "== ci: the steps' budgets add up to $sum s (at most $CI_BUDGETS_MAX_S s)"
}

ci_begin() {
    ci_check_budgets "$0"
    CI_START=$(ci_now)
    mkdir -p target
    CI_STEPS_FILE="$PWD/target/ci-steps.tsv"
    : >"$CI_STEPS_FILE"; : >"$CI_STEPS_FILE.open"; rm -f "$CI_STEPS_FILE.limit"
    trap ci_on_exit EXIT
    # On reaching the limit the watchdog names the open step (the last name ci_step
    # wrote beside the steps file) and stops every descendant of the run; the run's own
    # shell then fails on the killed command and ci_on_exit reports.
    local main=$$
    (
        trap - EXIT
        me=$BASHPID
        sleep "$CI_LIMIT_S" </dev/null >/dev/null 2>&1 &
        wait $!
        tail -n 1 "$CI_STEPS_FILE.open" 2>/dev/null >"$CI_STEPS_FILE.limit" || echo "?" >"$CI_STEPS_FILE.limit"
        echo "== ci: the run reached its limit of $CI_LIMIT_S s: stopping every process it started"
        kill -TERM $(ci_descendants "$main" "$me") 2>/dev/null
        sleep 15
        kill -KILL $(ci_descendants "$main" "$me") 2>/dev/null
    ) &
    CI_WATCHDOG=$!
}
