"""Interleaved A/B of ``diagnose run --format json`` between two source trees.

    python benchmarks/ab_interleaved.py --a /tmp/src_before --b . --trace /tmp/t316.json.gz --runs 12

Each round runs A and B once, in alternating order (A first on odd rounds), each in a fresh
interpreter with the source tree first on ``sys.path`` (``python -m diagnose.cli``), the JSON
report to /dev/null. Prints per-side median, min and max wall seconds and the B / A ratio of
the medians; interleaving spreads machine noise over both sides. It also prints the CPU seconds
(user + system of the run and the decode workers it forked, ``RUSAGE_CHILDREN``): on a shared
machine under load they vary less than wall time. A measurement, not a test.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def _one(src: str, trace: str, cpu: list[float] | None = None) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "diagnose.cli", "run", "--trace", trace, "--format", "json"], env=env,
                   check=True, stdout=subprocess.DEVNULL, cwd=os.path.abspath(src))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="source tree of side A (the commit before)")
    ap.add_argument("--b", required=True, help="source tree of side B (the change)")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--runs", type=int, default=12, help="runs per side")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"A": [], "B": []}
    cpus: dict[str, list[float]] = {"A": [], "B": []}
    _one(args.a, args.trace), _one(args.b, args.trace)  # warm the page cache, not counted
    for i in range(args.runs):
        order = (("A", args.a), ("B", args.b)) if i % 2 == 0 else (("B", args.b), ("A", args.a))
        for side, src in order:
            times[side].append(_one(src, args.trace, cpus[side]))
    for side in ("A", "B"):
        t = times[side]
        print(f"{side}: median {statistics.median(t):.3f} s (min {min(t):.3f}, max {max(t):.3f}) over {len(t)} runs")
    print(f"B / A (medians): {statistics.median(times['B']) / statistics.median(times['A']):.3f}")
    for side in ("A", "B"):
        c = cpus[side]
        print(f"{side} CPU: median {statistics.median(c):.3f} s (min {min(c):.3f}, max {max(c):.3f})")
    print(f"B / A (CPU medians): {statistics.median(cpus['B']) / statistics.median(cpus['A']):.3f}")


if __name__ == "__main__":
    main()
