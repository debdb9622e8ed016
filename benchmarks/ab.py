"""Interleaved A/B of two source trees of diagnose on one trace (this VM drifts by +-20 % within
minutes: alternating the two sides cancels the drift out of the comparison).

    git archive BASE | tar -x -C /tmp/ab_a ; git archive HEAD | tar -x -C /tmp/ab_b
    python benchmarks/ab.py --a /tmp/ab_a --b /tmp/ab_b --trace /tmp/t316.json.gz --runs 10

Each run is a fresh ``python -c 'from diagnose.cli import entry; entry()' run --trace T --format
json`` child with ``PYTHONPATH`` set to one tree (the tree's ``diagnose`` package is imported,
not an installed one), stdout to /dev/null; wall time and peak RSS (``ru_maxrss`` from
``os.wait4``) per child. Prints every run and the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CODE = "import sys; sys.argv[0] = 'diagnose'; import diagnose.cli as c; (getattr(c, 'entry', None) or c.main)()"


def one(tree: str, trace: str) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CODE, "run", "--trace", trace, "--format", "json"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{tree}: exit {os.waitstatus_to_exitcode(status)}: {err[-500:]}")
    return wall, ru.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="source tree A (the baseline)")
    ap.add_argument("--b", required=True, help="source tree B (the change)")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--runs", type=int, default=10, help="runs per side (default 10)")
    args = ap.parse_args()
    res: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
    for i in range(args.runs):
        order = (("A", args.a), ("B", args.b)) if i % 2 == 0 else (("B", args.b), ("A", args.a))
        for side, tree in order:
            w, rss = one(tree, args.trace)
            res[side].append((w, rss))
            print(f"run {i + 1:2d} {side}: {w:6.2f} s  {rss:6.0f} MiB", flush=True)
    for side in ("A", "B"):
        ws = [w for w, _ in res[side]]
        print(f"{side}: median {statistics.median(ws):.2f} s (min {min(ws):.2f}, max {max(ws):.2f}), "
              f"peak RSS median {statistics.median(r for _, r in res[side]):.0f} MiB")
    ma, mb = (statistics.median(w for w, _ in res[s]) for s in ("A", "B"))
    print(f"B / A = {mb / ma:.3f}")


if __name__ == "__main__":
    main()
