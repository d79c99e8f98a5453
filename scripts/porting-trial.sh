#!/usr/bin/env bash
# The porting trial: docs/PORTING.md followed from an empty directory outside the tree, as a
# porting team follows it, with the one edit it documents (the package name), to a conformance
# report. Fails, never skips, when a component is missing (cargo, a C compiler, the unihal
# binary, a plugin library, a report file) or when any step's result differs from the guide's.
#
#   scripts/porting-trial.sh [--unihal BIN] [--keep DIR]
#
#   --unihal BIN  the unihal binary to load the plugins into (default: `cargo build --release
#                 --bin unihal` in this checkout, the guide's way to get it)
#   --keep DIR    work in DIR (created; it must not exist or be empty) and keep it, instead of a
#                 temporary directory removed at the end
#
# In the work directory, beside a link `unihal` to this checkout (the layout the template's
# Cargo.toml expects):
# 1. Rust: copy plugin/template to mychip-plugin, rename the package (sed, one line), build it
#    with `cargo build --release --offline` (the crates it needs are in cargo's cache once this
#    checkout built), load it with UNIHAL_PLUGIN_PATH: `unihal devices` lists it, and
#    `unihal conformance --backend mychip --report` passes with every case skipped for the
#    manifest's reason, which names mychip; summary.txt, conformance.json, conformance.xml.
# 2. Refusals: the same plugin renamed cpu-plugin (backend cpu, a built-in name) is refused, and
#    `--backend cpu` fails naming the refusal instead of testing the built-in CPU backend; a file
#    that is no plugin makes `--backend mychip` fail naming that refusal.
# 3. C: the guide's compile line on plugin/tests/c/minimal_plugin.c (memory, streams, events and
#    their misuse cases) and async_plugin.c (the same and host callbacks); each area it claims
#    runs with passes and no failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

UNIHAL=""
KEEP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --unihal) UNIHAL="$2"; shift 2 ;;
        --keep) KEEP="$2"; shift 2 ;;
        *) echo "usage: $0 [--unihal BIN] [--keep DIR]" >&2; exit 2 ;;
    esac
done

die() { echo "porting trial: FAILED: $*" >&2; exit 1; }
say() { echo "== porting trial: $*"; }
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 )) s"; }

command -v cargo >/dev/null || die "cargo is missing (a Rust toolchain)"
CC="${CC:-cc}"
command -v "$CC" >/dev/null || die "no C compiler ($CC) for the C plugins"

if [ -z "$UNIHAL" ]; then
    say "building the unihal binary (cargo build --release --bin unihal)"
    (cd "$ROOT" && cargo build --release --bin unihal)
    UNIHAL="$ROOT/target/release/unihal"
fi
UNIHAL="$(cd "$(dirname "$UNIHAL")" && pwd)/$(basename "$UNIHAL")"
[ -x "$UNIHAL" ] || die "no unihal binary at $UNIHAL"

if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP"
    [ -z "$(ls -A "$KEEP")" ] || die "$KEEP is not empty"
    WORK="$(cd "$KEEP" && pwd)"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/unihal-porting-trial.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
fi
cd "$WORK"
say "work directory $WORK (unihal binary $UNIHAL)"
# The guide's layout: a unihal checkout beside the plugin's directory.
ln -s "$ROOT" unihal
mkdir out
# Nothing of this checkout's build settings reaches the plugin's build.
unset CARGO_TARGET_DIR RUSTFLAGS CARGO_BUILD_TARGET CARGO_ENCODED_RUSTFLAGS

# --- 1. The Rust template, renamed -------------------------------------------------------------
say "copy the template and rename it (the one documented edit)"
cp -r unihal/plugin/template mychip-plugin
[ ! -e mychip-plugin/target ] || die "the template in the checkout has a build directory inside it"
sed -i 's/^name = "unihal-template-plugin"$/name = "mychip-plugin"/' mychip-plugin/Cargo.toml
[ "$(grep -c '^name = "mychip-plugin"$' mychip-plugin/Cargo.toml)" = 1 ] \
    || die "the rename did not change the package name (plugin/template/Cargo.toml's name line moved?)"

say "build it: cargo build --release --offline"
B0=$(date +%s)
(cd mychip-plugin && cargo build --release --offline)
BUILD_S=$(( $(date +%s) - B0 ))
LIB="$WORK/mychip-plugin/target/release/libmychip_plugin.so"
[ -f "$LIB" ] || die "the build made no $LIB"
say "built $LIB in $BUILD_S s"

say "load it: unihal devices"
devices="$(UNIHAL_PLUGIN_PATH="$LIB" "$UNIHAL" devices)"
grep -q "libmychip_plugin.so: loaded, backend mychip" <<<"$devices" \
    && grep -q "mychip:0  mychip device 0 (mychip)" <<<"$devices" \
    || { echo "$devices"; die "unihal devices does not list backend mychip and its device"; }

say "unihal conformance --backend mychip --report out/mychip"
CASES="$("$UNIHAL" conformance --list 2>/dev/null | wc -l)"
[ "$CASES" -gt 0 ] || die "unihal conformance --list printed no case"
UNIHAL_PLUGIN_PATH="$LIB" "$UNIHAL" conformance --backend mychip --report out/mychip >out/mychip.log 2>&1 \
    || { cat out/mychip.log; die "the suite on the untouched template failed"; }
SUMMARY=out/mychip/summary.txt
for f in "$SUMMARY" out/mychip/conformance.json out/mychip/conformance.xml; do
    [ -s "$f" ] || die "the report has no $f"
done
grep -q "^total: $CASES cases, 0 passed, 0 failed, $CASES skipped, 0 xfail, 0 xpass in .*: OK$" "$SUMMARY" \
    || { tail -3 "$SUMMARY"; die "the summary's total line is not $CASES cases, all skipped"; }
REASON="unsupported by the mychip manifest: the mychip backend implements nothing yet"
skips="$(grep -c '^skipped mychip:0 ' "$SUMMARY" || true)"
[ "$skips" = "$CASES" ] || die "$skips skip lines for $CASES cases"
if grep '^skipped mychip:0 ' "$SUMMARY" | grep -v -q -F "$REASON"; then
    grep '^skipped mychip:0 ' "$SUMMARY" | grep -v -F "$REASON" | head -3
    die "cases skipped for another reason than the template's, naming mychip"
fi
grep -q '"name": "mychip device 0"' out/mychip/conformance.json \
    || die "conformance.json does not describe mychip device 0"

# --- 2. Refusals ---------------------------------------------------------------------------------
say "a plugin named after a built-in backend (cpu), refused: --backend cpu must fail naming it"
sed -i 's/^name = "mychip-plugin"$/name = "cpu-plugin"/' mychip-plugin/Cargo.toml
(cd mychip-plugin && cargo build --release --offline --quiet)
CPU_LIB="$WORK/mychip-plugin/target/release/libcpu_plugin.so"
[ -f "$CPU_LIB" ] || die "the build made no $CPU_LIB"
if out="$(UNIHAL_PLUGIN_PATH="$CPU_LIB" "$UNIHAL" conformance --backend cpu --filter memory.alloc.sizes 2>&1)"; then
    echo "$out"; die "--backend cpu tested the built-in CPU backend in place of the refused plugin"
fi
grep -q "would test the built-in backend, not the plugin: $CPU_LIB: .*UNIHAL_PLUGIN_REPLACE=cpu" <<<"$out" \
    || { echo "$out"; die "--backend cpu does not name the refused plugin"; }
echo "this is not a shared library" >libnot_a_plugin.so
if out="$(UNIHAL_PLUGIN_PATH="$WORK/libnot_a_plugin.so" "$UNIHAL" conformance --backend mychip 2>&1)"; then
    echo "$out"; die "--backend mychip passed with its plugin refused"
fi
grep -q "backend \"mychip\" is not registered.*$WORK/libnot_a_plugin.so: " <<<"$out" \
    || { echo "$out"; die "--backend mychip does not name the refused plugin"; }

# --- 3. The C examples, with the guide's compile line ------------------------------------------
# area: the --filter text and what must pass in it
check_c() {
    local name="$1" src="$2"; shift 2
    say "C plugin $src: cc -std=c11 -O2 -Wall -Wextra -shared -fPIC -pthread -I unihal/plugin/abi/include"
    "$CC" -std=c11 -O2 -Wall -Wextra -shared -fPIC -pthread -I unihal/plugin/abi/include \
        -o "lib${name}_plugin.so" "unihal/plugin/tests/c/$src"
    local lib="$WORK/lib${name}_plugin.so"
    for area in "$@"; do
        local log="out/$name-${area//[^a-z_]/_}.log"
        UNIHAL_PLUGIN_PATH="$lib" "$UNIHAL" conformance --backend "$name" --filter "$area" >"$log" 2>&1 \
            || { grep -v '^skipped' "$log"; die "$src: a case of $area failed"; }
        local total; total="$(grep '^total: ' "$log")"
        local passed; passed="$(sed -E 's/^total: [0-9]+ cases, ([0-9]+) passed, ([0-9]+) failed.*/\1 \2/' <<<"$total")"
        [ "${passed% *}" -gt 0 ] && [ "${passed#* }" = 0 ] \
            || { echo "$total"; die "$src: no case of $area passed"; }
        echo "  $area: $total"
    done
}
check_c cminimal minimal_plugin.c memory. streams. events. misuse.
check_c casync async_plugin.c memory. streams. events. misuse. host_callback

say "passed in $(elapsed) (the template's out-of-tree build: $BUILD_S s)"
