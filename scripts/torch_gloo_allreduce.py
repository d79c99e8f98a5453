"""PyTorch's own gloo all-reduce, timed as `unihal bench all_reduce` times its own in-place column
(scripts/gloo-vs-torch.sh): f32 sum, in place (`dist.all_reduce` reduces its tensor in place), W
warm-up calls, then N calls back to back, the mean per call, the slowest rank's. Run under
torchrun; rank 0 prints `size_bytes time_us` per size."""
import sys
import time
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sizes = [int(s) for s in sys.argv[1].split(",")]
iters, warm = int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    print(f"# torch {torch.__version__} gloo, {dist.get_world_size()} processes", flush=True)
for size in sizes:
    t = torch.ones(size // 4, dtype=torch.float32)
    for _ in range(warm):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    per = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"{size} {per.item() * 1e6:.1f}", flush=True)
dist.destroy_process_group()
