#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz/corpus/alloc_blocks (the encoding: fuzz/src/alloc_blocks.rs).

Run from anywhere: python3 fuzz/seeds/alloc_blocks.py. Handle numbers follow the driver's list
(a drop moves the last handle into the dropped one's place); picks on a rank index that rank's
handles in list order.
"""
import os

MIB = 1 << 20


def u16(v):
    return [v & 0xFF, (v >> 8) & 0xFF]


def u24(v):
    return [v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF]


def span(v):  # an offset or length below 2^16 (the driver takes it modulo its bound + 1)
    return [2] + u16(v)


def alloc_small(dev, n):  # 1 <= n <= 1 MiB
    return [0, 0, dev] + u24(n - 1)


def alloc_large(dev, n):  # 1 MiB < n <= 4 MiB
    return [1, 1, dev] + u24(n - MIB - 1)


def drop(h):
    return [2, h]


def slice_(h, off, n, keep):
    return [3, h] + span(off) + span(n) + [0 if keep else 1]


def slice_whole_dropped(h):
    return [3, h, 0, 1, 1]


def clone(h):
    return [4, h]


def write(h, off, n):  # n <= 4096
    return [5, h] + span(off) + u16(n)


def fill(h, off, n, kind):  # kind 0: u8, 1: u16, 2: u32
    return [6, h] + span(off) + span(n) + [kind]


def copy(a, b, ao, bo, n):
    return [7, a, b] + span(ao) + span(bo) + span(n)


def read(h):
    return [8, h]


def empty_cache(dev):
    return [9, dev]


def all_reduce(ranks, count, offs):
    """ranks: per rank (send pick, recv pick or None for in place); offs: per rank (so, ro)."""
    out = [10]
    for a, b in ranks:
        out += [a] + ([0] if b is None else [1, b])
    out += u16(count - 1)
    for (a, b), (so, ro) in zip(ranks, offs):
        out += u16(so) + ([] if b is None else u16(ro))
    return out


def all_to_allv(ranks, c, sd, rd):
    """ranks: per rank (send pick, recv pick); c[src][dst] elements; sd[src][dst], rd[dst][src]."""
    out = [11]
    for a, b in ranks:
        out += [a, b]
    out += [c[0][0], c[0][1], c[1][0], c[1][1]]
    for src in range(2):
        for dst in range(2):
            out += u16(sd[src][dst]) + u16(rd[dst][src])
    return out


SEEDS = {
    # A view dropped at once, a kept view outliving its block's first handle, reuse of the memory.
    "slice-drop-realloc": [
        alloc_small(0, 5000), alloc_small(0, 3000),
        slice_(0, 100, 200, keep=False),
        slice_(1, 8, 1000, keep=True),
        write(2, 10, 500),
        drop(1),
        alloc_small(0, 5000),
        read(1), read(0),
        drop(1),
        alloc_large(0, 2 * MIB),
        slice_whole_dropped(2),
        empty_cache(0),
        alloc_large(0, 2 * MIB),
        copy(0, 1, 0, 16, 4096),
        read(0), read(1), read(2), read(3),
    ],
    # all_to_allv over blocks on both ranks, then its blocks reused.
    "all-to-allv": [
        alloc_small(0, 4096), alloc_small(0, 4096), alloc_small(1, 4096), alloc_small(1, 4096),
        write(0, 0, 4096), write(2, 0, 4096),
        all_to_allv([(0, 1), (0, 1)], [[10, 20], [30, 40]],
                    [[5, 100], [0, 50]], [[3, 7], [0, 1]]),
        read(1), read(3),
        drop(1),
        alloc_small(0, 4096),
        read(0), read(1), read(3),
    ],
    # all_to_allv over kept views, the views' blocks dropped first.
    "all-to-allv-views": [
        alloc_small(0, 8192), alloc_large(0, 2 * MIB), alloc_small(1, 8192), alloc_small(1, 600),
        slice_(0, 512, 4096, keep=True),   # 4
        slice_(2, 1024, 4096, keep=True),  # 5
        drop(0),                           # 5 moves to 0
        drop(2),                           # 4 moves to 2
        fill(0, 0, 4096, 2), fill(2, 0, 4096, 1),
        all_to_allv([(1, 0), (0, 1)], [[64, 3], [17, 64]],
                    [[9, 0], [200, 1]], [[0, 40], [2, 5]]),
        alloc_small(0, 5000), alloc_small(1, 5000),
        read(0), read(1), read(2), read(3),
    ],
    # all_reduce in place on rank 0, out of place on rank 1, over views; clones and fills.
    "all-reduce": [
        alloc_small(0, 4096), alloc_small(1, 4096), alloc_small(1, 2048),
        fill(0, 0, 4096, 2), write(1, 0, 4096), fill(2, 0, 2048, 0),
        clone(1),
        all_reduce([(0, None), (0, 1)], 300, [(40, 0), (8, 100)]),
        drop(3),
        all_reduce([(0, None), (1, None)], 512, [(0, 0), (0, 0)]),
        slice_(0, 0, 4096, keep=False),
        alloc_small(0, 4096),
        read(0), read(1), read(2), read(3),
    ],
}

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "corpus", "alloc_blocks")
os.makedirs(out, exist_ok=True)
for name, steps in SEEDS.items():
    data = bytes(b for step in steps for b in step)
    with open(os.path.join(out, "seed-" + name), "wb") as f:
        f.write(data)
    print(f"seed-{name}: {len(data)} bytes, {len(steps)} steps")
