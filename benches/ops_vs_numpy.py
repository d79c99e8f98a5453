#!/usr/bin/env python3
"""unihal's CPU backend against numpy, side by side in one run.

For each op, runs `examples/ops_bench.rs` (unihal: the op, then a device-to-device copy of the
op's input bytes) and numpy alternately, round by round, with the same thread count, and prints
medians, the speed ratio against numpy (>1: unihal is faster) and the bandwidth unihal reaches as a
fraction of its plain copy of the same bytes.

  add        f32 add of 32 Mi elements           numpy: np.add(a, b, out=c)          1 thread
  sum        f32 row sums, 8192 x 4096           numpy: x.sum(axis=1)                1 thread
  softmax    f32 softmax of 8192 rows of 4096    numpy: its best composite (in place) 1 thread
  layer_norm f32 layer norm of 8192 rows of 4096 numpy: its best composite (in place) 1 thread
  matmul     f32 2048 x 2048 x 2048              numpy: a @ b (OpenBLAS)             2 threads
  mm_*       f32 matmuls at the shapes of examples/gpt's step (2048 tokens, width 64):
             mm_qkv 2048x64 @ 64x192, mm_fc 2048x64 @ 64x256, mm_out 2048x256 @ 256x64,
             mm_wgrad 64x2048 @ 2048x256                numpy: a @ b (OpenBLAS)  2 threads

Usage: python3 benches/ops_vs_numpy.py [--ops add,sum,...] [--rounds R] [--markdown]
Needs numpy (it makes .venv-bench with a pinned numpy when it is missing).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Seconds of idle before each measured side (environment PAUSE_S; 0 to disable).
PAUSE_S = float(os.environ.get("PAUSE_S", "1.0"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMPY = "numpy==2.1.3"
ROWS, COLS = 8192, 4096
# (m, k, n) of the GPT step's matmuls (examples/gpt at its default size).
GPT_SHAPES = {
    "mm_qkv": (2048, 64, 192),
    "mm_fc": (2048, 64, 256),
    "mm_out": (2048, 256, 64),
    "mm_wgrad": (64, 2048, 256),
}


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


def threads_for(op):
    return 2 if op == "matmul" or op.startswith("mm_") else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="add,sum,softmax,layer_norm,matmul")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    ops = args.ops.split(",")
    # numpy's thread count is fixed when it loads: the most any op uses; single-threaded ops
    # (numpy's elementwise and reductions) do not use the BLAS pool.
    os.environ["OPENBLAS_NUM_THREADS"] = str(max(threads_for(o) for o in ops))
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"]
    ensure_numpy()
    import numpy as np

    subprocess.check_call(["cargo", "build", "-q", "--release", "--example", "ops_bench"], cwd=ROOT)
    exe = os.path.join(ROOT, "target", "release", "examples", "ops_bench")
    rng = np.random.default_rng(1)

    def numpy_op(op):
        """(numpy's version to time, bytes the op reads and writes, dims for ops_bench, bytes of
        the array ops_bench copies as its yardstick)."""
        if op == "add":
            n = 32 << 20
            a, b, c = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
            return (lambda: np.add(a, b, out=c)), 3 * n * 4, [str(n)], n * 4
        if op in GPT_SHAPES:
            m, k, n = GPT_SHAPES[op]
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), dtype=np.float32)
            return ((lambda: np.matmul(a, b, out=c)), (m * k + k * n + m * n) * 4,
                    [str(m), str(k), str(n)], m * k * 4)
        if op == "matmul":
            n = 2048
            a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
            c = np.empty((n, n), dtype=np.float32)
            return (lambda: np.matmul(a, b, out=c)), 3 * n * n * 4, [str(n)], n * n * 4
        x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
        y = np.empty_like(x)
        dims = [str(ROWS), str(COLS)]
        if op == "sum":
            out = np.empty(ROWS, dtype=np.float32)
            return (lambda: np.sum(x, axis=1, out=out)), x.nbytes, dims, x.nbytes
        if op == "softmax":
            def softmax():
                m = x.max(axis=1, keepdims=True)
                np.subtract(x, m, out=y)
                np.exp(y, out=y)
                s = y.sum(axis=1, keepdims=True)
                np.divide(y, s, out=y)
            return softmax, 2 * x.nbytes, dims, x.nbytes
        if op == "layer_norm":
            w = np.ones(COLS, dtype=np.float32)
            b = np.zeros(COLS, dtype=np.float32)

            def layer_norm():
                mu = x.mean(axis=1, keepdims=True)
                np.subtract(x, mu, out=y)
                var = np.einsum("ij,ij->i", y, y) / COLS
                rstd = 1.0 / np.sqrt(var + 1e-5)
                np.multiply(y, rstd[:, None].astype(np.float32), out=y)
                np.multiply(y, w, out=y)
                np.add(y, b, out=y)
            return layer_norm, 2 * x.nbytes, dims, x.nbytes
        raise SystemExit(f"unknown op {op}")

    def time_numpy(f, reps):
        f()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    med = statistics.median
    rows = []
    for op in ops:
        f, nbytes, dims, copied = numpy_op(op)
        reps = 3 if op == "matmul" else 7
        env = dict(os.environ, UNIHAL_CPU_THREADS=str(threads_for(op)))
        u_op, u_copy, n_op, isa = [], [], [], "?"
        for _ in range(args.rounds):
            exe_op = "mm" if op in GPT_SHAPES else op
            # A pause before each side, so that neither measures the other's threads still
            # spinning (OpenBLAS's after numpy, the pool's after unihal): without it, mm_qkv read
            # 0.66 ms right after numpy and 0.36 ms after a 1 s pause.
            time.sleep(PAUSE_S)
            out = subprocess.run([exe, exe_op, *dims, str(reps)], env=env, cwd=ROOT, check=True,
                                 capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            u_op.append(r["op_s"])
            u_copy.append(r["copy_s"])
            isa = r["isa"]
            time.sleep(PAUSE_S)
            n_op.append(time_numpy(f, reps))
        uo, uc, no = med(u_op), med(u_copy), med(n_op)
        # The copy reads and writes the copied array: 2 * its bytes.
        frac = (nbytes / uo) / (2 * copied / uc)
        rows.append((op, " x ".join(dims), threads_for(op), uo, no, no / uo, frac, isa))

    print(f"unihal vs numpy {np.__version__}, median of {args.rounds} alternating rounds (unihal ISA: {rows[0][7]})")
    hdr = ("op", "size", "threads", "unihal ms", "numpy ms", "speed vs numpy", "bandwidth / copy")
    if args.markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    for op, size, th, uo, no, ratio, frac in (r[:7] for r in rows):
        cells = (op, size, str(th), f"{uo * 1e3:.2f}", f"{no * 1e3:.2f}", f"{ratio:.2f}x",
                 f"{frac:.2f}" if op != "matmul" and op not in GPT_SHAPES else "-")
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  " + "  ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
