"""Benchmark: ``timeline_figure`` on a synthetic trace of 1,000,000 GPU kernels.

Generates (numpy, seeded) a decode-like activity frame: 4 streams on one GPU plus 1 stream on
a second GPU, kernels of 2-40 µs separated by small gaps (most < 2 µs, some launch-late gaps
of 20-200 µs, a few ms-long stalls), 1,000 steps alternating prefill/decode. Times:

* ``prepare_timeline`` (sorting and gap detection, done once per trace by the app),
* ``timeline_figure`` on the full range (aggregated to at most ``max_points`` elements),
* ``timeline_figure`` zoomed into 0.1 % of the range (full detail),
* JSON serialisation of the full-range figure (what Dash sends to the browser).

Target: full-range figure (prepare + build) under 2 s. Run:
``python benchmarks/bench_timeline.py [--kernels N] [--max-points P]``. Not a test assertion.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd


def synthetic_activities(n: int = 1_000_000, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Activity frame with ``n`` kernels and a matching report dict (steps only)."""
    rng = np.random.default_rng(seed)
    streams = np.array([(0, 7), (0, 13), (0, 21), (0, 29), (1, 7)])
    which = rng.choice(len(streams), size=n, p=[0.55, 0.15, 0.1, 0.05, 0.15])
    dur = rng.integers(2_000, 40_000, size=n)
    gap = rng.integers(300, 2_000, size=n)
    late = rng.random(n) < 0.03
    gap[late] = rng.integers(20_000, 200_000, size=int(late.sum()))
    stall = rng.random(n) < 0.0005
    gap[stall] = rng.integers(1_000_000, 5_000_000, size=int(stall.sum()))
    start = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    t0 = 1_700_000_000_000_000_000
    for s in range(len(streams)):
        m = np.nonzero(which == s)[0]
        st = t0 + np.cumsum(gap[m] + dur[m]) - dur[m]
        start[m] = st
        end[m] = st + dur[m]
    launch_end = np.where(late, start + 500, start - 5_000)
    cats = np.array(["gemm", "attention", "norm", "elementwise", "memcpy", "moe", "other"], dtype=object)
    cat = cats[rng.choice(len(cats), size=n, p=[0.35, 0.15, 0.15, 0.2, 0.05, 0.05, 0.05])]
    names = np.array([f"kernel_{c}_{i}" for c in cats for i in range(4)], dtype=object)
    name = names[rng.integers(0, len(names), size=n)]
    acts = pd.DataFrame({
        "kind": np.where(cat == "memcpy", "memcpy", "kernel"),
        "name": name,
        "device": streams[which, 0],
        "stream": streams[which, 1],
        "start_ns": start,
        "end_ns": end,
        "category": cat,
        "launch_end_ns": launch_end,
        "graph_followup": np.zeros(n, dtype=bool),
        "step": -1,
        "phase": "unknown",
    })
    lo, hi = int(start.min()), int(end.max())
    edges = np.linspace(lo, hi, 1001).astype(np.int64)
    steps = [
        {"name": f"step{i}", "phase": "prefill" if i % 10 == 0 else "decode", "gpu_start_ns": int(edges[i]),
         "gpu_end_ns": int(edges[i + 1]), "batch": 8, "tokens": None}
        for i in range(1000)
    ]
    return acts, {"steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--max-points", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from diagnose.app.timeline import figure_drawn_elements, prepare_timeline, timeline_figure

    t = time.perf_counter()
    acts, report = synthetic_activities(args.kernels)
    print(f"generated {len(acts):,} activities in {time.perf_counter() - t:.2f} s")

    best_prep = best_fig = best_total = best_zoom = best_json = float("inf")
    for _ in range(args.repeat):
        t = time.perf_counter()
        td = prepare_timeline(acts, report)
        t1 = time.perf_counter()
        fig = timeline_figure(td, max_points=args.max_points)
        t2 = time.perf_counter()
        span_ms = td.span_ns / 1e6
        zoom = timeline_figure(td, max_points=args.max_points, x_range=[span_ms * 0.5, span_ms * 0.501])
        t3 = time.perf_counter()
        fig.to_plotly_json()
        import plotly.io as pio
        pio.to_json(fig)
        t4 = time.perf_counter()
        best_prep = min(best_prep, t1 - t)
        best_fig = min(best_fig, t2 - t1)
        best_total = min(best_total, t2 - t)
        best_zoom = min(best_zoom, t3 - t2)
        best_json = min(best_json, t4 - t3)
    # Cold path: what timeline_figure(activities_frame) costs when nothing is prepared.
    t = time.perf_counter()
    cold = timeline_figure(acts, report, max_points=args.max_points)
    cold_s = time.perf_counter() - t
    print(f"prepare_timeline:                 {best_prep:.3f} s")
    print(f"timeline_figure (full, prepared): {best_fig:.3f} s  mode={fig.layout.meta['mode']} "
          f"drawn={figure_drawn_elements(fig):,} (max {args.max_points:,}) traces={len(fig.data)}")
    print(f"prepare + full figure:            {best_total:.3f} s")
    print(f"timeline_figure(frame) cold:      {cold_s:.3f} s  drawn={figure_drawn_elements(cold):,}")
    print(f"zoomed 0.1 % (detail):            {best_zoom:.3f} s  mode={zoom.layout.meta['mode']} "
          f"visible={zoom.layout.meta['visible_activities']:,}")
    print(f"figure to JSON:                   {best_json:.3f} s")
    print(f"target < 2 s for the full-range figure: {'met' if cold_s < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
