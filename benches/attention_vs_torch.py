#!/usr/bin/env python3
"""unihal's fused attention on the CPU backend against PyTorch's scaled_dot_product_attention on
the CPU (itself a fused flash-attention kernel), side by side in one run.

For each shape, runs `examples/attention_bench.rs` (unihal) and this script's torch side in turn,
round by round, each in its own process with the same thread count and a pause between them (so
neither side measures the other's spinning threads), and prints the medians over rounds of each
run's median, and the speed ratio (>1: unihal is faster). f32, (B, H, S, D), forward alone and
forward + backward (torch: autograd of SDPA; unihal: the attention and attention_backward ops).

Extra memory: unihal's forward keeps the row log-sum-exp (B*H*S floats) and its backward a scratch
of 2*B*H*S floats; no S x S buffer on either side.

Usage: python3 benches/attention_vs_torch.py [--threads N] [--rounds R] [--reps K] [--markdown]
Needs torch (the venv .ci/run makes: ~/.cache/unihal/venv-torch-2.15.0, or --python).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PY = os.path.expanduser("~/.cache/unihal/venv-torch-2.15.0/bin/python3")
# (B, H, S, D, causal): examples/gpt's default step (32 sequences, 4 heads of 16, context 64), then
# long sequences with 64- and 128-wide heads.
SHAPES = [
    (32, 4, 64, 16, 1),
    (1, 8, 1024, 64, 1),
    (1, 8, 2048, 64, 1),
    (1, 8, 4096, 64, 1),
    (1, 4, 1024, 128, 1),
    (1, 4, 2048, 128, 1),
    (1, 4, 4096, 128, 1),
    (1, 4, 1024, 128, 0),
]

TORCH_SIDE = r"""
import json, statistics, sys, time, torch
B, H, S, D, causal, reps, threads = map(int, sys.argv[1:8])
torch.set_num_threads(threads)
torch.manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
do = torch.randn(B, H, S, D)
sdpa = torch.nn.functional.scaled_dot_product_attention
def fwd():
    with torch.no_grad():
        return sdpa(q, k, v, is_causal=bool(causal))
def both():
    sdpa(q, k, v, is_causal=bool(causal)).backward(do)
fwd(); both()
tf, tb = [], []
for _ in range(reps):
    t0 = time.perf_counter(); fwd(); tf.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); both(); tb.append(time.perf_counter() - t0)
print(json.dumps({"fwd_s": statistics.median(tf), "fwd_bwd_s": statistics.median(tb),
                  "torch": torch.__version__}))
"""


def run(cmd, env):
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--python", default=TORCH_PY)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "-q", "--release", "--example", "attention_bench"],
                   cwd=ROOT, check=True)
    exe = os.path.join(ROOT, "target", "release", "examples", "attention_bench")
    env = dict(os.environ, UNIHAL_CPU_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    res = {s: {"u_f": [], "u_b": [], "t_f": [], "t_b": []} for s in SHAPES}
    version = "?"
    for _ in range(a.rounds):
        for s in SHAPES:
            args = [str(x) for x in s] + [str(a.reps)]
            u = run([exe] + args, env)
            time.sleep(0.5)
            t = run([a.python, "-c", TORCH_SIDE] + args + [str(a.threads)], env)
            time.sleep(0.5)
            version = t["torch"]
            res[s]["u_f"].append(u["fwd_s"])
            res[s]["u_b"].append(u["fwd_bwd_s"])
            res[s]["t_f"].append(t["fwd_s"])
            res[s]["t_b"].append(t["fwd_bwd_s"])
    med = statistics.median
    print(f"f32 attention, {a.threads} thread(s), {a.rounds} rounds of {a.reps} reps, torch {version}")
    hdr = ("| B, H, S, D | causal | unihal fwd ms | torch fwd ms | fwd ratio "
           "| unihal fwd+bwd ms | torch fwd+bwd ms | fwd+bwd ratio |")
    print(hdr)
    print("|---|---|---|---|---|---|---|---|")
    for s, r in res.items():
        uf, tf, ub, tb = (med(r[k]) * 1e3 for k in ("u_f", "t_f", "u_b", "t_b"))
        print(f"| {s[0]}, {s[1]}, {s[2]}, {s[3]} | {'yes' if s[4] else 'no'} | {uf:.2f} | {tf:.2f} "
              f"| **{tf / uf:.2f}x** | {ub:.2f} | {tb:.2f} | **{tb / ub:.2f}x** |")


if __name__ == "__main__":
    sys.exit(main())
