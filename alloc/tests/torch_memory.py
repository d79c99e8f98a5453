"""PyTorch's own memory tools over unihal's allocator.

Usage:
  torch_memory.py summary STATS.json   memory_summary(device=0) over the statistics in the file
                                       (`CachingAllocator::stats().to_map()`), which stand in for
                                       torch.cuda.memory_stats (memory_summary calls it itself);
                                       a key torch needs that unihal lacks is a KeyError (exit 1).
  torch_memory.py snapshot FILE        checks the pickled snapshot's layout against what
                                       torch.cuda.memory._snapshot() returns (the keys its tools
                                       read), then prints `python -m torch.cuda._memory_viz stats`
                                       (torch's `segsum`, which asserts free + allocated =
                                       reserved per segment and in total) and `trace` of it, run
                                       as torch's command line runs them.
"""

import json
import pickle
import runpy
import sys

mode, path = sys.argv[1], sys.argv[2]

if mode == "summary":
    import torch.cuda.memory as memory

    with open(path) as f:
        stats = json.load(f)
    memory.memory_stats = lambda device=None: stats
    print(memory.memory_summary(device=0))
    sys.exit(0)

with open(path, "rb") as f:
    snap = pickle.load(f)
SEGMENT = {"device", "address", "total_size", "allocated_size", "active_size",
           "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
           "frames", "blocks"}
BLOCK = {"address", "size", "requested_size", "state", "frames"}
ENTRY = {"action", "addr", "size", "stream", "frames"}
assert {"segments", "device_traces"} <= set(snap), set(snap)
for seg in snap["segments"]:
    assert SEGMENT <= set(seg), SEGMENT - set(seg)
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"], seg
    for b in seg["blocks"]:
        assert BLOCK <= set(b), BLOCK - set(b)
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive"), b
for trace in snap["device_traces"]:
    for e in trace:
        assert ENTRY <= set(e), ENTRY - set(e)
for action in ("stats", "trace"):
    print(f"== _memory_viz {action}")
    sys.stdout.flush()
    sys.argv = ["_memory_viz", action, path]
    runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
