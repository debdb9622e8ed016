"""In-process A/B of the layer analyzer (per-layer time, issue 26) on one loaded trace:
``analyze()`` with :func:`diagnose.analyzers.layers.layer_section` and with a stub that returns
nothing, interleaved (this VM's timings drift by ±20 % within minutes), then the analyzer
alone. A measurement, not a test.

    python benchmarks/ab_layers.py /tmp/t316.json.gz -n 10
"""
from __future__ import annotations

import argparse
import statistics
import time


def inproc(trace_path: str, n: int) -> dict[str, list[float]]:
    """``analyze()`` with the layer analyzer and with a stub, interleaved; then the analyzer alone."""
    from diagnose.analyzers import analyze, layers
    from diagnose.trace import load_trace

    trace = load_trace(trace_path)
    real = layers.layer_section
    captured = {}

    def grab(*a, **k):
        captured["args"] = (a, k)
        return real(*a, **k)

    def stub(*a, **k):
        return layers.LayerSection([], [], [])

    layers.layer_section = grab
    analyze(trace)
    res: dict[str, list[float]] = {"with": [], "without": [], "alone": []}
    try:
        for i in range(n):
            for side in (("with", "without") if i % 2 == 0 else ("without", "with")):
                layers.layer_section = real if side == "with" else stub
                t0 = time.perf_counter()
                analyze(trace)
                res[side].append(time.perf_counter() - t0)
    finally:
        layers.layer_section = real
    a, k = captured["args"]
    for _ in range(n):
        t0 = time.perf_counter()
        real(*a, **k)
        res["alone"].append(time.perf_counter() - t0)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-n", type=int, default=10, help="runs per side")
    args = ap.parse_args()
    for side, v in inproc(args.trace, args.n).items():
        print(f"{side}: median {statistics.median(v):.4f} s, min {min(v):.4f}, max {max(v):.4f} ({len(v)} runs)")


if __name__ == "__main__":
    main()
