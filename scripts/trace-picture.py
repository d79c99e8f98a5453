#!/usr/bin/env python3
"""Renders a unihal timeline (UNIHAL_TRACE=FILE, Trace Event Format) to an SVG picture.

    python3 scripts/trace-picture.py TRACE.json OUT.svg [--from MS] [--to MS] [--width PX]

One band per device (a process of the trace), one lane per stream with what the device executed,
coloured by kind (computation, collectives, copies, fills, event records and waits), the arrows
from each event record to the waits it released, and the caching allocator's allocated bytes as a
line under each band. Host-thread tracks are left out: the picture shows the devices. Times are
milliseconds from the trace's start; --from and --to choose the window (default: all of it).

Only the Python standard library is needed.
"""

import argparse
import html
import json
import sys

HOST_TRACK_BASE = 1 << 40
COLOURS = {
    "op": "#4c78a8",
    "kernel": "#1f4e79",
    "collective": "#f58518",
    "copy": "#54a24b",
    "fill": "#9d9d9d",
    "event": "#222222",
}
NAMES = {
    "op": "computation (library op)",
    "kernel": "kernel",
    "collective": "collective",
    "copy": "copy",
    "fill": "fill",
    "event": "event record / wait",
}
LANE, GAP, LEFT, MEM = 22, 10, 190, 26


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from", dest="t0", type=float, default=None, help="window start, ms")
    ap.add_argument("--to", dest="t1", type=float, default=None, help="window end, ms")
    ap.add_argument("--width", type=int, default=1200, help="picture width, pixels")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()

    with open(a.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    pnames, tnames, slices, flows, counters = {}, {}, [], {}, {}
    for e in events:
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        if ph == "M":
            if e["name"] == "process_name":
                pnames[pid] = e["args"]["name"]
            elif e["name"] == "thread_name":
                tnames[(pid, tid)] = e["args"]["name"]
        elif ph == "X" and tid < HOST_TRACK_BASE and e.get("cat") != "host":
            slices.append((pid, tid, e["ts"] / 1000, (e["ts"] + e["dur"]) / 1000, e.get("cat", ""), e["name"]))
        elif ph in ("s", "f"):
            flows.setdefault(e["id"], {})[ph] = (pid, tid, e["ts"] / 1000)
        elif ph == "C" and "allocated" in e.get("args", {}):
            counters.setdefault(pid, []).append((e["ts"] / 1000, e["args"]["allocated"]))
    if not slices:
        sys.exit(f"{a.trace}: no device spans")
    t0 = a.t0 if a.t0 is not None else min(s[2] for s in slices)
    t1 = a.t1 if a.t1 is not None else max(s[3] for s in slices)
    if t1 <= t0:
        sys.exit("--to must be after --from")
    span = t1 - t0
    plot = a.width - LEFT - 20

    def x(t):
        return LEFT + (min(max(t, t0), t1) - t0) / span * plot

    # Lanes: per process, its streams in id order.
    lanes, y = {}, 46
    bands = []
    for pid in sorted({s[0] for s in slices}):
        top = y
        y += 16  # the device's name
        for tid in sorted({s[1] for s in slices if s[0] == pid}):
            lanes[(pid, tid)] = y
            y += LANE
        bands.append((pid, top, y))
        y += MEM + GAP
    height = y + 40

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{a.width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{a.width}" height="{height}" fill="white"/>',
        '<defs><marker id="arrow" markerWidth="6" markerHeight="6" refX="5" refY="3" '
        'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#d62728"/></marker></defs>',
    ]
    title = a.title or f"{a.trace}: {t0:.1f} to {t1:.1f} ms"
    out.append(f'<text x="10" y="18" font-size="13" font-weight="bold">{html.escape(title)}</text>')
    for pid, top, bottom in bands:
        out.append(f'<rect x="2" y="{top - 4}" width="{a.width - 4}" height="{bottom - top + MEM + 4}" '
                   'fill="#f6f6f6" stroke="#dddddd"/>')
        out.append(f'<text x="8" y="{top + 10}" font-weight="bold">{html.escape(pnames.get(pid, str(pid)))}</text>')
        for (p, tid), ly in lanes.items():
            if p == pid:
                out.append(f'<text x="24" y="{ly + 15}">{html.escape(tnames.get((p, tid), str(tid)))}</text>')
        # The allocator's bytes, scaled to the band's memory strip.
        samples = sorted(counters.get(pid, []))
        before = [v for t, v in samples if t < t0]
        pts = ([(t0, before[-1])] if before else []) + [(t, v) for t, v in samples if t0 <= t <= t1]
        if pts:
            pts.append((t1, pts[-1][1]))
            peak = max(v for _, v in pts) or 1
            base = bottom + MEM - 4
            steps, last = [], None
            for t, v in pts:  # a counter holds its value until the next sample
                yv = base - v / peak * (MEM - 8)
                if last is not None:
                    steps.append(f"{x(t):.1f},{last:.1f}")
                steps.append(f"{x(t):.1f},{yv:.1f}")
                last = yv
            path = " ".join(steps)
            out.append(f'<polyline points="{path}" fill="none" stroke="#7f7f7f" stroke-width="1"/>')
            out.append(f'<text x="24" y="{bottom + 16}" fill="#555">allocated (peak {peak / 2**20:.1f} MiB)</text>')
    for pid, tid, s, e, cat, name in slices:
        if e < t0 or s > t1:
            continue
        ly = lanes[(pid, tid)]
        w = max(x(e) - x(s), 0.6)
        h = 8 if cat == "event" else 16
        off = (LANE - 4 - h) / 2
        out.append(f'<rect x="{x(s):.2f}" y="{ly + 2 + off:.1f}" width="{w:.2f}" height="{h}" '
                   f'fill="{COLOURS.get(cat, "#cccccc")}"><title>{html.escape(name)} '
                   f'({e - s:.3f} ms)</title></rect>')
    for f in flows.values():
        if "s" not in f or "f" not in f:
            continue
        (p1, t1_, a1), (p2, t2_, a2) = f["s"], f["f"]
        if (p1, t1_) not in lanes or (p2, t2_) not in lanes or a2 < t0 or a1 > t1:
            continue
        y1, y2 = lanes[(p1, t1_)] + LANE / 2, lanes[(p2, t2_)] + LANE / 2
        if y1 == y2:
            continue
        out.append(f'<line x1="{x(a1):.1f}" y1="{y1:.1f}" x2="{x(a2):.1f}" y2="{y2:.1f}" '
                   'stroke="#d62728" stroke-width="0.7" marker-end="url(#arrow)"/>')
    # Time axis and legend.
    ay = height - 30
    out.append(f'<line x1="{LEFT}" y1="{ay}" x2="{LEFT + plot}" y2="{ay}" stroke="black"/>')
    for k in range(11):
        t = t0 + span * k / 10
        out.append(f'<line x1="{x(t):.1f}" y1="{ay}" x2="{x(t):.1f}" y2="{ay + 4}" stroke="black"/>')
        out.append(f'<text x="{x(t):.1f}" y="{ay + 15}" text-anchor="middle">{t:.1f} ms</text>')
    lx = 10
    for cat, colour in COLOURS.items():
        out.append(f'<rect x="{lx}" y="26" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{lx + 14}" y="35">{NAMES[cat]}</text>')
        lx += 24 + 6 * len(NAMES[cat])
    out.append(f'<line x1="{lx}" y1="31" x2="{lx + 16}" y2="31" stroke="#d62728" marker-end="url(#arrow)"/>')
    out.append(f'<text x="{lx + 20}" y="35">record to wait</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out))
    print(f"{a.out}: {sum(1 for s in slices if s[3] >= t0 and s[2] <= t1)} spans, "
          f"{len(bands)} device(s), {t0:.1f} to {t1:.1f} ms")


if __name__ == "__main__":
    main()
