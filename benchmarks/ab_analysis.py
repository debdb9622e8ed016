"""Interleaved A/B of two installs of diagnose on one trace (a benchmark, not a test).

Each side is a Python interpreter with its own install (e.g. two venvs, each holding a
``pip install --no-deps`` of a ``git archive`` of one commit). Two modes:

* default: one long-lived process per side loads the trace once, then runs analysis +
  verdicts + JSON on request; the sides alternate (A B, B A, ...) after a warm-up round, so
  drift in the machine's load hits both alike;
* ``--e2e``: ``python -m diagnose.cli run --trace T --format json`` per run, alternating.

    python benchmarks/ab_analysis.py /venvA/bin/python /venvB/bin/python /tmp/t316.json.gz --runs 12 [--e2e]

Prints per side the median, min, max and every run (s), and B/A of the medians, the median of
the paired ratios and the ratio of the sums.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time

WORKER = r"""
import sys, time
from diagnose.trace import load_trace
from diagnose.analyzers import analyze
from diagnose.pipeline import attach_verdicts
from diagnose.report.jsonout import to_json
tr = load_trace(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    t = time.perf_counter()
    a = analyze(tr)
    attach_verdicts(a)
    to_json(a.to_dict())
    print(f"{time.perf_counter() - t:.4f}", flush=True)
"""


def _in_process(pythons: dict[str, str], trace: str, runs: int) -> dict[str, list[float]]:
    procs = {v: subprocess.Popen([py, "-c", WORKER, trace], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for v, py in pythons.items()}
    for p in procs.values():
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a worker failed to load the trace")
    res: dict[str, list[float]] = {v: [] for v in pythons}
    for i in range(runs + 1):
        for v in (("A", "B") if i % 2 == 0 else ("B", "A")):
            procs[v].stdin.write("go\n")
            procs[v].stdin.flush()
            x = float(procs[v].stdout.readline())
            if i:  # round 0 warms up
                res[v].append(x)
    for p in procs.values():
        p.stdin.close()
        p.wait()
    return res


def _e2e(pythons: dict[str, str], trace: str, runs: int) -> dict[str, list[float]]:
    res: dict[str, list[float]] = {v: [] for v in pythons}
    for i in range(runs):
        for v in (("A", "B") if i % 2 == 0 else ("B", "A")):
            t = time.perf_counter()
            subprocess.run([pythons[v], "-m", "diagnose.cli", "run", "--trace", trace, "--format", "json"],
                           stdout=subprocess.DEVNULL, check=True)
            res[v].append(time.perf_counter() - t)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("python_a")
    ap.add_argument("python_b")
    ap.add_argument("trace")
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--e2e", action="store_true", help="time `diagnose run --format json` end to end")
    a = ap.parse_args()
    pythons = {"A": a.python_a, "B": a.python_b}
    res = (_e2e if a.e2e else _in_process)(pythons, a.trace, a.runs)
    for v, xs in res.items():
        print(v, "median", round(statistics.median(xs), 3), "min", round(min(xs), 3), "max", round(max(xs), 3),
              [round(x, 3) for x in xs])
    ra, rb = res["A"], res["B"]
    print("B/A median", round(statistics.median(rb) / statistics.median(ra), 4),
          "paired median", round(statistics.median([b / x for x, b in zip(ra, rb)]), 4),
          "sum", round(sum(rb) / sum(ra), 4))


if __name__ == "__main__":
    main()
