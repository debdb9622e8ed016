"""Benchmark: ``diagnose run`` and the nsys SQLite loader alone on one (large) export.

    python benchmarks/bench_nsys.py FILE [--repeat N] [--reader auto|adbc|sqlite3] [--skip-run]

Each measurement runs in a fresh subprocess, reaped with ``os.wait4`` so that its peak RSS
(``ru_maxrss``) and CPU time (user + system, all threads) belong to that one child
(``getrusage(RUSAGE_CHILDREN)`` would report the max over every earlier child as well):

* ``diagnose run --trace FILE --format json`` end to end (``python -m diagnose.cli``:
  interpreter start, imports, load, every analyzer, JSON report to /dev/null);
* ``load_nsys_sqlite(FILE)`` alone: the child's wall, CPU and peak RSS, and ``load s`` timed
  inside it after its imports.

``--reader`` sets ``DIAGNOSE_NSYS_READER`` in the children: ``adbc`` (columnar, needs
``adbc-driver-sqlite``), ``sqlite3`` (the standard-library fallback) or ``auto`` (adbc when
importable). The children import ``diagnose`` from wherever ``PYTHONPATH`` / the environment
says, so another checkout can be timed the same way (``PYTHONPATH=/tmp/old python ...``; a
loader without the ``reader`` metadata shows reader "?"). Build a ~1 GB input with::

    python benchmarks/make_large_trace.py SRC /tmp/nsys_1g.sqlite --nsys --copies 1000

Prints a markdown table: median (min–max) over the repeats. CPU s above wall s means
parallel reads; on a shared machine wall time is noisy, CPU time much less so. Not a test
assertion.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_LOADER = r"""
import json, sys, time
from diagnose.trace import nsys
t = time.perf_counter()
tr = nsys.load_nsys_sqlite(sys.argv[1])
dt = time.perf_counter() - t
print(json.dumps({"load_s": dt, "reader": tr.metadata["nsys"].get("reader", "?"),
                  "gpu": len(tr.gpu), "runtime": len(tr.runtime), "annotations": len(tr.annotations)}))
"""


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float, str]:
    """Run ``cmd``: (wall s, CPU s, peak RSS MiB, stdout). Raises on a non-zero exit."""
    with tempfile.TemporaryFile() as errf:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env)
        out = proc.stdout.read()  # to EOF; the child is reaped below, by wait4, not by Popen
        proc.stdout.close()
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            errf.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed ({code}): {errf.read().decode(errors='replace')[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, out.decode(errors="replace")


def _fmt(xs: list[float], nd: int = 2) -> str:
    if not xs:
        return "–"
    if len(xs) == 1:
        return f"{xs[0]:.{nd}f}"
    return f"{statistics.median(xs):.{nd}f} ({min(xs):.{nd}f}–{max(xs):.{nd}f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reader", choices=("auto", "adbc", "sqlite3"), default="auto")
    ap.add_argument("--skip-run", action="store_true", help="time the loader only")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    if a.reader != "auto":
        env["DIAGNOSE_NSYS_READER"] = a.reader
    else:
        env.pop("DIAGNOSE_NSYS_READER", None)
    load_cmd = [sys.executable, "-c", _LOADER, a.file]
    run_cmd = [sys.executable, "-m", "diagnose.cli", "run", "--trace", a.file, "--format", "json"]

    rows: list[tuple[str, list[float], list[float], list[float], list[float]]] = []
    info: dict = {}
    lw, lc, lr, ls = [], [], [], []
    for _ in range(a.repeat):
        wall, cpu, rss, out = _run(load_cmd, env)
        info = json.loads(out.strip().splitlines()[-1])
        lw.append(wall)
        lc.append(cpu)
        lr.append(rss)
        ls.append(info["load_s"])
    rows.append(("load_nsys_sqlite (child process)", lw, lc, ls, lr))
    if not a.skip_run:
        rw, rc, rr = [], [], []
        for _ in range(a.repeat):
            wall, cpu, rss, _out = _run(run_cmd, env)
            rw.append(wall)
            rc.append(cpu)
            rr.append(rss)
        rows.append(("diagnose run --format json", rw, rc, [], rr))

    size = os.path.getsize(a.file)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(
        f"file: `{a.file}` ({size / 1e6:,.0f} MB); reader: {info.get('reader')}; rows: gpu {info.get('gpu'):,}, "
        f"runtime {info.get('runtime'):,}, annotations {info.get('annotations'):,}; repeat {a.repeat}; "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at the end\n"
    )
    print("| what | wall s | CPU s | load s (in process) | peak RSS MiB |")
    print("|---|---|---|---|---|")
    for name, wall, cpu, load_s, rss in rows:
        print(f"| {name} | {_fmt(wall)} | {_fmt(cpu)} | {_fmt(load_s)} | {_fmt(rss, 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
