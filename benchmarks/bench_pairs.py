"""Paired, interleaved A/B: ``diagnose run`` against HTA's load of the same trace (or against
another diagnose checkout), so that any change can be held to a ratio.

Each pair runs both sides back to back, each in a fresh subprocess, the order alternating
from pair to pair (A B, B A, A B...): on a shared machine both sides of a pair see about the
same load, and a drift in load cancels in the per-pair ratio. Measured per run:

* ``wall``: the subprocess from spawn to exit (interpreter start, imports, work, exit);
* ``cpu``: user + system time of the subprocess and of every child it waited for (diagnose
  decodes a large file on forked workers: their CPU counts), from ``os.wait4``;
* ``hwm``: peak resident set of the main process (``VmHWM`` from ``/proc/PID/status``, read
  when it exits), and ``tree``: the peak of the main process's resident set plus its
  children's private memory (a forked worker's own pages: what it shares copy-on-write
  with the main process, the decompressed document, is counted once), sampled every 100 ms
  (:data:`SAMPLE_S`: at 20 ms, reading the workers' ``smaps_rollup`` took 0.67 s of this
  script's CPU during a 3.9 s diagnose run, 17 % of a core taken from the measured side on a
  2-core machine)
  (workers run beside the main process); the summed RSS peak (shared pages counted in every
  process) is in the JSON;
* the machine's load: ``/proc/loadavg`` (1-minute) before each pair, and the CPU time other
  processes used during the pair (``/proc/stat`` busy jiffies minus the pair's own), as a
  share of the machine's CPUs.

Sides:

* ``diagnose``: ``diagnose run --trace TRACE --format json`` (JSON to /dev/null), as the
  console script runs it.
* ``hta`` (default B side): ``hta.trace_analysis.TraceAnalysis(trace_dir=DIR)`` with DIR a
  temporary directory holding a symlink to TRACE: parse + align + ProfilerStep filter, no
  analysis, HTA's defaults. Needs ``traceinsight`` (``pip install traceinsight==0.6.1``).
* ``--vs-checkout DIR``: diagnose from the source tree DIR (``PYTHONPATH=DIR``) instead of
  HTA: an A/B of two versions of diagnose (e.g. ``git worktree add /tmp/base main``).

Usage::

    python benchmarks/bench_pairs.py TRACE [--pairs 5] [--vs-checkout DIR] [--json out.json]

Both diagnose sides run from source trees with their bytecode written first
(``compileall``), as an installed package has it. Prints one row per pair and the summary: medians of each side, the median and the geometric
mean of the per-pair ratios B/A (wall, CPU) and the peaks. Not a test assertion.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the console script's function: ``entry`` where the tree has it (it ends the process with
# os._exit after the output), ``main`` in older trees
CHILD_DIAGNOSE = """
import sys
import diagnose.cli as cli
sys.argv = ['diagnose', 'run', '--trace', sys.argv[1], '--format', 'json']
(getattr(cli, 'entry', None) or cli.main)()
"""

CHILD_HTA = """
import logging, sys, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings('ignore')
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
assert ta.t.is_parsed and ta.t.traces, 'HTA parsed no rank'
"""

# Prepended to every child: report VmHWM of the main process at exit (after the work, before
# the interpreter tears down), into the file named by $BENCH_HWM.
_HWM_HOOK = """
import atexit as _ax, os as _os
def _hwm():
    import sys as _s
    with open('/proc/self/status') as f:
        hwm = next((int(l.split()[1]) for l in f if l.startswith('VmHWM:')), 0)
    d = _s.modules.get('diagnose')
    with open(_os.environ['BENCH_HWM'], 'w') as f:
        f.write(str(hwm) + ' ' + (getattr(d, '__file__', '') or ''))
_ax.register(_hwm)
"""


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def _private_kib(pid: int) -> int:
    """Unique set size: the pages only this process maps (a forked worker's own objects; not
    the parent's decompressed document it reads copy-on-write, nor shared libraries)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return sum(int(ln.split()[1]) for ln in f if ln.startswith(("Private_Clean:", "Private_Dirty:")))
    except (OSError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _busy_jiffies() -> int:
    """CPU time (all CPUs, all processes) spent busy since boot, in clock ticks."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # minus idle and iowait


_NEUTRAL_CWD = tempfile.mkdtemp(prefix="bench-pairs-cwd-")


#: Seconds between samples of the process tree's memory (see the module docstring).
SAMPLE_S = 0.1


def run_side(argv: list[str], env: dict) -> dict:
    """One run: wall, cpu (incl. waited-for children), VmHWM of the main process, sampled
    peak of the process tree's summed RSS."""
    with tempfile.NamedTemporaryFile("r", suffix=".hwm", delete=False) as tf:
        hwm_path = tf.name
    env = {**env, "BENCH_HWM": hwm_path}
    err = tempfile.TemporaryFile()
    peak = [0, 0]
    stop = threading.Event()

    def sample(pid: int) -> None:
        while not stop.wait(SAMPLE_S):
            kids = _children(pid)
            peak[0] = max(peak[0], _rss_kib(pid) + sum(_rss_kib(c) for c in kids))
            peak[1] = max(peak[1], _rss_kib(pid) + sum(_private_kib(c) for c in kids))

    try:
        t0 = time.perf_counter()
        # cwd: an empty directory, so that ``python -c``'s sys.path[0] (the working directory)
        # never shadows the checkout that PYTHONPATH names with another ``diagnose``
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=_NEUTRAL_CWD)
        th = threading.Thread(target=sample, args=(p.pid,), daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        stop.set()
        th.join()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            raise RuntimeError(f"child failed (exit {code}): {' '.join(argv[:4])}...\n{err.read().decode(errors='replace')[-2000:]}")
        with open(hwm_path) as f:
            hwm_text, _, imported = f.read().partition(" ")
        hwm = int(hwm_text or 0)
        return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
                "hwm_mib": hwm / 1024, "tree_rss_sum_peak_mib": peak[0] / 1024, "tree_peak_mib": peak[1] / 1024,
                "maxrss_mib": ru.ru_maxrss / 1024, "diagnose_from": imported or None}
    finally:
        err.close()
        os.unlink(hwm_path)


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def compile_bytecode(root: Path) -> None:
    """Write ``root``'s bytecode (``__pycache__``, ignored by git) as an installed package has
    it: a source tree without it (``PYTHONDONTWRITEBYTECODE``, a fresh checkout) recompiles
    every module on every run, ~0.1 s that no user pays."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "diagnose")], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    for sub in ("collectors", "app", "rules", "samples"):
        if (root / sub).is_dir():
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / sub)], check=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})


def bench(trace: Path, pairs: int, vs_checkout: Path | None) -> dict:
    py = sys.executable
    compile_bytecode(ROOT)
    if vs_checkout is not None:
        compile_bytecode(vs_checkout)
    env_a = {**os.environ, "PYTHONPATH": str(ROOT)}
    trace = trace.resolve()  # the children run in another directory
    a_argv = [py, "-c", _HWM_HOOK + CHILD_DIAGNOSE, str(trace)]
    tmp = None
    if vs_checkout is not None:
        b_name = f"diagnose@{vs_checkout}"
        env_b = {**os.environ, "PYTHONPATH": str(vs_checkout)}
        b_argv = [py, "-c", _HWM_HOOK + CHILD_DIAGNOSE, str(trace)]
    else:
        b_name = "HTA 0.6.1 load"
        tmp = tempfile.TemporaryDirectory()
        (Path(tmp.name) / trace.name).symlink_to(trace.resolve())
        env_b = dict(os.environ)
        b_argv = [py, "-c", _HWM_HOOK + CHILD_HTA, tmp.name]
    ncpu = os.cpu_count() or 1
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    try:
        for i in range(pairs):
            load1 = os.getloadavg()[0]
            j0, t0 = _busy_jiffies(), time.perf_counter()
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            got = {}
            for side in order:
                got[side] = run_side(a_argv if side == "a" else b_argv, env_a if side == "a" else env_b)
            span = time.perf_counter() - t0
            others = max(0.0, (_busy_jiffies() - j0) / tick - got["a"]["cpu_s"] - got["b"]["cpu_s"])
            rows.append({"pair": i + 1, "order": "".join(order), "loadavg_1m": load1,
                         "others_cpu_share": others / (span * ncpu), **{f"{s}_{k}": v for s in "ab" for k, v in got[s].items()}})
            r = rows[-1]
            print(f"pair {i + 1}/{pairs} ({r['order']}): diagnose {r['a_wall_s']:.2f} s wall {r['a_cpu_s']:.2f} s cpu "
                  f"{r['a_hwm_mib']:.0f} MiB | {b_name} {r['b_wall_s']:.2f} s wall {r['b_cpu_s']:.2f} s cpu "
                  f"{r['b_hwm_mib']:.0f} MiB | load {load1:.1f}, others {r['others_cpu_share']:.0%} of the CPUs", file=sys.stderr)
    finally:
        if tmp is not None:
            tmp.cleanup()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k[:2] in ("a_", "b_") and k[2:] != "diagnose_from"}
    for side, want in (("a", ROOT), ("b", vs_checkout)):  # each side ran the code it names
        got = {r[f"{side}_diagnose_from"] for r in rows}
        if want is not None and got != {str(Path(want).resolve() / "diagnose" / "__init__.py")}:
            raise RuntimeError(f"side {side} imported diagnose from {sorted(map(str, got))}, not from {want}")
    ratios = {m: [r[f"b_{m}"] / r[f"a_{m}"] for r in rows] for m in ("wall_s", "cpu_s", "hwm_mib", "tree_peak_mib")}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "trace": str(trace), "trace_bytes": trace.stat().st_size,
        "machine": {"cpus": ncpu, "cpu": _cpu_model(), "mem_gib": _mem_gib(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "a": "diagnose (this checkout" + (f", {_commit(ROOT)})" if _commit(ROOT) else ")"),
        "b": b_name + (f" ({_commit(vs_checkout)})" if vs_checkout is not None and _commit(vs_checkout) else ""),
        "pairs": rows, "median": med,
        "ratio_median": {m: statistics.median(v) for m, v in ratios.items()},
        "ratio_gmean": {m: _gmean(v) for m, v in ratios.items()},
        "ratio_min": {m: min(v) for m, v in ratios.items()},
        "load": {"loadavg_1m_median": statistics.median(r["loadavg_1m"] for r in rows),
                 "others_cpu_share_median": statistics.median(r["others_cpu_share"] for r in rows)},
    }


def _commit(root: Path) -> str | None:
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return c + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            return round(int(next(ln for ln in f if ln.startswith("MemTotal:")).split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        return None


def markdown(res: dict) -> str:
    m, md, rm, rg, rmin = res["machine"], res["median"], res["ratio_median"], res["ratio_gmean"], res["ratio_min"]
    lines = [
        f"{res['date']}; {m['cpus']} CPUs ({m['cpu']}), {m['mem_gib']} GiB; Python {m['python']}; "
        f"`{Path(res['trace']).name}` ({res['trace_bytes'] / 2**20:.1f} MiB on disk); {len(res['pairs'])} interleaved pairs; "
        f"load average (1 min) median {res['load']['loadavg_1m_median']:.1f}, other processes used a median "
        f"{res['load']['others_cpu_share_median']:.0%} of the CPUs during the pairs.",
        "",
        "| side | wall s (median) | CPU s (median) | peak RSS MiB, main process (VmHWM) | peak MiB, main RSS + workers' private |",
        "|---|---:|---:|---:|---:|",
        f"| A: {res['a']} | {md['a_wall_s']:.2f} | {md['a_cpu_s']:.2f} | {md['a_hwm_mib']:.0f} | {md['a_tree_peak_mib']:.0f} |",
        f"| B: {res['b']} | {md['b_wall_s']:.2f} | {md['b_cpu_s']:.2f} | {md['b_hwm_mib']:.0f} | {md['b_tree_peak_mib']:.0f} |",
        "",
        "| B / A per pair | wall | CPU | peak (VmHWM) | peak (tree) |",
        "|---|---:|---:|---:|---:|",
        f"| median | {rm['wall_s']:.2f}x | {rm['cpu_s']:.2f}x | {rm['hwm_mib']:.2f}x | {rm['tree_peak_mib']:.2f}x |",
        f"| geometric mean | {rg['wall_s']:.2f}x | {rg['cpu_s']:.2f}x | {rg['hwm_mib']:.2f}x | {rg['tree_peak_mib']:.2f}x |",
        f"| worst pair | {rmin['wall_s']:.2f}x | {rmin['cpu_s']:.2f}x | {rmin['hwm_mib']:.2f}x | {rmin['tree_peak_mib']:.2f}x |",
        "",
        "| pair | order | load 1m | others' CPU | A wall / CPU s | B wall / CPU s | B/A wall | B/A CPU |",
        "|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in res["pairs"]:
        lines.append(f"| {r['pair']} | {r['order'].upper()} | {r['loadavg_1m']:.1f} | {r['others_cpu_share']:.0%} | "
                     f"{r['a_wall_s']:.2f} / {r['a_cpu_s']:.2f} | {r['b_wall_s']:.2f} / {r['b_cpu_s']:.2f} | "
                     f"{r['b_wall_s'] / r['a_wall_s']:.2f}x | {r['b_cpu_s'] / r['a_cpu_s']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--pairs", type=int, default=5, help="interleaved pairs (default 5)")
    ap.add_argument("--vs-checkout", type=Path, default=None, metavar="DIR",
                    help="B side: diagnose from this source tree instead of HTA")
    ap.add_argument("--json", type=Path, default=None, dest="json_out", help="also write every number here")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        ap.error(f"no such trace: {args.trace}")
    if args.pairs < 1:
        ap.error("--pairs must be >= 1")
    if args.vs_checkout is None:
        from importlib.util import find_spec

        if find_spec("hta") is None:
            ap.error("HTA is not installed (pip install traceinsight==0.6.1); or give --vs-checkout DIR")
    res = bench(args.trace, args.pairs, args.vs_checkout)
    print(markdown(res))
    if args.json_out:
        args.json_out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
