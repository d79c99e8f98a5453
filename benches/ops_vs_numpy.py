#!/usr/bin/env python3
"""Elementwise f32 add on unihal's CPU backend against numpy, side by side in one run.

Runs `examples/ops_bench.rs` (unihal: add, then a device-to-device copy of the same array) and
numpy (`np.add(a, b, out=c)`, `np.copyto(c, a)`) alternately, round by round, both on one thread,
and prints medians, the speed ratio against numpy and the bandwidth of add as a fraction of a plain
copy of the same bytes (add moves 3 arrays, copy 2).

Usage: python3 benches/ops_vs_numpy.py [--elements N] [--rounds R]
Needs numpy (it makes .venv-bench with a pinned numpy when it is missing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMPY = "numpy==2.1.3"


def ensure_numpy():
    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.join(ROOT, ".venv-bench")
    py = os.path.join(venv, "bin", "python3")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q", NUMPY])
    os.execv(py, [py] + sys.argv)


def main():
    ensure_numpy()
    import numpy as np

    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=32 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.elements
    env = dict(os.environ, UNIHAL_CPU_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess.check_call(["cargo", "build", "-q", "--release", "--example", "ops_bench"], cwd=ROOT)
    exe = os.path.join(ROOT, "target", "release", "examples", "ops_bench")

    a = np.full(n, 1.0, dtype=np.float32)
    b = np.full(n, 2.0, dtype=np.float32)
    c = np.zeros(n, dtype=np.float32)

    def numpy_round(reps=7):
        t_add, t_copy = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            np.add(a, b, out=c)
            t_add.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            np.copyto(c, a)
            t_copy.append(time.perf_counter() - t0)
        return statistics.median(t_add), statistics.median(t_copy)

    u_add, u_copy, n_add, n_copy, isa = [], [], [], [], "?"
    for _ in range(args.rounds):
        out = subprocess.run([exe, str(n), "7"], env=env, cwd=ROOT, check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        u_add.append(r["add_s"])
        u_copy.append(r["copy_s"])
        isa = r["isa"]
        x, y = numpy_round()
        n_add.append(x)
        n_copy.append(y)

    med = statistics.median
    gib = lambda nbytes, t: nbytes / t / 2**30
    arr = n * 4
    print(f"f32 add over {n} elements, {args.rounds} alternating rounds of 7, one thread (unihal ISA: {isa}, numpy {np.__version__})")
    print(f"  unihal add : {med(u_add) * 1e3:8.2f} ms  {gib(3 * arr, med(u_add)):6.2f} GiB/s (3 arrays)")
    print(f"  numpy add  : {med(n_add) * 1e3:8.2f} ms  {gib(3 * arr, med(n_add)):6.2f} GiB/s")
    print(f"  unihal copy: {med(u_copy) * 1e3:8.2f} ms  {gib(2 * arr, med(u_copy)):6.2f} GiB/s (2 arrays)")
    print(f"  numpy copy : {med(n_copy) * 1e3:8.2f} ms  {gib(2 * arr, med(n_copy)):6.2f} GiB/s")
    print(f"  speed of unihal add vs numpy add: {med(n_add) / med(u_add):.3f}x")
    print(f"  unihal add bandwidth / unihal copy bandwidth: {gib(3 * arr, med(u_add)) / gib(2 * arr, med(u_copy)):.3f}")
    print(f"  unihal add bandwidth / numpy copy bandwidth:  {gib(3 * arr, med(u_add)) / gib(2 * arr, med(n_copy)):.3f}")


if __name__ == "__main__":
    main()
