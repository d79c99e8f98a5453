"""PyTorch's own memory_summary over unihal's statistics.

Usage: torch_memory.py STATS.json. The file holds `CachingAllocator::stats().to_map()`; it stands
in for torch.cuda.memory_stats (memory_summary calls it itself) and memory_summary(device=0)
formats it. Prints the summary; fails (KeyError, exit 1) on a key torch needs that unihal lacks.
"""

import json
import sys

import torch.cuda.memory as memory

with open(sys.argv[1]) as f:
    stats = json.load(f)

memory.memory_stats = lambda device=None: stats
print(memory.memory_summary(device=0))
