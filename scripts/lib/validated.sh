# Shared by .ci/run's conformance steps: sourced, not run.
#
# validate_if_concurrent MODE prints the UNIHAL_VALIDATE value of a run in MODE: error (the
# validation layer in error mode: a finding refuses its call, and fails its case) for concurrent
# runs, nothing (off) for deferred ones, whose
# runtime runs work only at synchronisation points (the layer's verdicts do not depend on timing,
# so one mode per backend covers it).
# check_validated MODE REPORT fails when a run that should have been validated was not (the
# layer's line missing from REPORT/summary.txt); a finding already failed its case.
validate_if_concurrent() {
    if [ "$1" = concurrent ]; then echo error; fi
}
check_validated() {
    if [ "$1" = concurrent ]; then
        grep -q 'ran under the validation layer (error mode)' "$2/summary.txt" \
            || { echo "the run in $2 did not run under the validation layer" >&2; exit 1; }
    fi
    return 0
}
