#!/usr/bin/env bash
# The README's test command as a newcomer runs it, on a machine without any vendor package, from
# the build the full test command just made (CI step "README test command on a bare machine").
#
# `env -i` does not hide a Debian library (the loader finds it through ld.so.cache), so this runs
# in a private mount namespace (`unshare -m`; needs root, as CI has): every file of the vendor
# packages .ci/run installs (AMD's HIP runtime, hiprtc and comgr, ROCr, Open MPI, libclang) is
# covered by a bind mount of /dev/null, and the private Python environments (NVIDIA's NVRTC and
# NCCL, numpy, PyTorch) and the extracted torch-npu headers by an empty tmpfs. The environment is emptied
# but for the toolchain's and the build's own settings (PATH, HOME, RUSTUP_*, CARGO_*, the kernel
# library's build cache, which its build script watches), so no UNIHAL_TEST_* requirement is set
# and nothing rebuilds.
#
# It first proves the components are hidden (so the check can fail): `unihal devices --json`
# must report the HIP and CUDA backends unavailable, naming their runtime libraries, and neither
# numpy nor mpirun may work. Then it reruns, with the README's command and the same workspace
# selection (`cargo test --workspace`, so feature resolution and the build are the same), the
# tests that look for vendor components: every one of them must pass, taking its "not
# installed" path. Fails, never skips, when unshare or root is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "bare-machine.sh needs root (a private mount namespace)" >&2; exit 1; }
command -v unshare >/dev/null || { echo "bare-machine.sh needs unshare (util-linux)" >&2; exit 1; }
unshare -m --propagation private true \
    || { echo "bare-machine.sh cannot make a private mount namespace (unshare -m): it needs root with CAP_SYS_ADMIN" >&2; exit 1; }

# The tests whose code opens a vendor library, compiler, Python or MPI when it finds one (the rest
# run the same either way): modules of the crates' gathered test binaries (`--test all`), given as
# name filters (a module several crates have runs in each), and the fault sweeps' own binary.
VENDOR_MODULES=(
    # unihal-hip: the real runtime's absence, the simulated runtime with and without hiprtc
    unavailable simulated simulated_legacy simulated_init_fails blas_keep blas_without_compiler
    # unihal-cuda: the simulated driver and NCCL, with NVRTC when found
    ctx_release foreign_arch_library nccl_abort nccl_bounded nccl_drop nccl_simulated
    rccl_instance stream_errors sync_race wrong_library ccl_lacks
    # unihal-dlpack: numpy through DLPack
    numpy
    # unihal-launch: PyTorch's TCPStore against unihal's
    torch_store
    # unihal-alloc: PyTorch's memory_summary over unihal's statistics
    torch_memory
    # unihal: `unihal devices` and backend preference over every backend
    cli open_preferred
    # unihal-sim: the simulated core's kernels (the NVRTC-compiled library when found)
    core kernels
)
FILTERS=()
for m in "${VENDOR_MODULES[@]}"; do FILTERS+=("$m::"); done

# Every regular file of the vendor packages that are installed.
PACKAGES=(libamdhip64-5 libamdhip64-dev libamd-comgr2 libamd-comgr-dev libhsa-runtime64-1
    libhsa-runtime-dev libhsakmt1 libopenmpi3 libopenmpi-dev openmpi-bin libclang1-14
    libclang-14-dev libclang-cpp14 libclang-dev libgloo0 libgloo-dev)
HIDE_LIST="$(mktemp)"
for p in "${PACKAGES[@]}"; do
    dpkg -L "$p" 2>/dev/null || true
done | while read -r f; do
    # An `if`, not `&&`: a list ending on a link would end the loop (and, under pipefail, the
    # script) with its status.
    if [ -f "$f" ] && [ ! -L "$f" ]; then echo "$f"; fi
done | sort -u >"$HIDE_LIST"
grep -q 'libamdhip64.so' "$HIDE_LIST" \
    || { echo "bare-machine.sh: AMD's HIP runtime is not installed, so hiding it proves nothing (run .ci/run's install first)" >&2; exit 1; }
HIDE_DIRS=()
for d in .venv-cuda .venv-numpy target/torch-npu-*; do [ -d "$d" ] && HIDE_DIRS+=("$PWD/$d"); done
# PyTorch's venv lives outside the clone (.ci/run).
if [ -n "${UNIHAL_TORCH_VENV:-}" ] && [ -d "$UNIHAL_TORCH_VENV" ]; then HIDE_DIRS+=("$UNIHAL_TORCH_VENV"); fi

KEEP=(PATH="$PATH" HOME="$HOME")
while IFS='=' read -r name _; do
    case "$name" in RUSTUP_*|CARGO_*|UNIHAL_KERNELS_BUILD_CACHE) KEEP+=("$name=${!name}") ;; esac
done < <(env)

echo "bare machine: hiding $(wc -l <"$HIDE_LIST") files of ${#PACKAGES[@]} packages and ${#HIDE_DIRS[@]} directories (${HIDE_DIRS[*]})"
# shellcheck disable=SC2016
unshare -m --propagation private env -i "${KEEP[@]}" HIDE_LIST="$HIDE_LIST" bash -euo pipefail -c '
    while read -r f; do mount --bind /dev/null "$f"; done <"$HIDE_LIST"
    for d in "$@"; do
        [ "$d" = -- ] && break
        mount -t tmpfs -o size=1m,mode=0755 bare-machine "$d"
    done
    while [ "$1" != -- ]; do shift; done; shift

    # The components are gone, as far as the tests and unihal can tell.
    if python3 -c "import numpy" 2>/dev/null; then echo "numpy is still importable" >&2; exit 1; fi
    if mpirun --version >/dev/null 2>&1; then echo "mpirun still runs" >&2; exit 1; fi
    devices="$(target/debug/unihal devices --json)"
    python3 - "$devices" <<"PY"
import json, sys
listed = {b["name"]: b for b in json.loads(sys.argv[1])["backends"]}
for backend, lib in (("hip", "libamdhip64"), ("cuda", "libcuda")):
    b = listed.get(backend)
    reason = (b or {}).get("reason") or ""
    if b is None or b["available"] or lib not in reason:
        sys.exit(f"unihal devices does not report {backend} missing ({lib}): {b}")
    print(f"bare machine: {backend} unavailable: {reason}")
PY
    cargo test --workspace --test all -- "$@"
    cargo test --workspace --test fault_sweep
' bare-machine "${HIDE_DIRS[@]}" -- "${FILTERS[@]}"
rm -f "$HIDE_LIST"
