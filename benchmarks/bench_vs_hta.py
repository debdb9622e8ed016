"""Benchmark: ``diagnose run`` vs Holistic Trace Analysis (HTA) load vs the JSON parse floor.

For each trace, each of these runs ``--repeat`` times in its **own subprocess**, so wall time
includes interpreter start and imports, and peak RSS (``ru_maxrss`` from ``os.wait4`` of
that one child) is per tool and per run:

* ``diagnose``: ``diagnose run --trace TRACE --format json`` end to end (load, every
  analyzer, JSON report written to stdout, which goes to /dev/null). Run as the console
  script does it: ``from diagnose.cli import main; main()``.
* ``hta``: ``hta.trace_analysis.TraceAnalysis(trace_dir=DIR)`` -- parse + align + filter
  only, no analysis -- where DIR is a temporary directory holding a symlink to TRACE (HTA
  wants one directory of per-rank files). HTA's defaults (``ParserBackend.JSON``, ns rounding
  on).
* ``floor``: stdlib gunzip (when gzipped) + a msgspec *typed* decode of every event's ``ph``,
  ``cat``, ``name``, ``ts``, ``dur``, ``pid``, ``tid`` (args skipped) -- the floor of issue
  "Scale": the cost of just reading the events, which any tool pays.
* ``startup`` rows (once, not per trace): the same interpreter importing only what each
  tool needs (``STARTUP_MODULES``) -- the fixed cost inside every wall time above.

Each child also reports its own in-process ``work`` time (after its imports), shown next to
the wall time. Reported: median wall (and min-max over repeats), median work, max peak RSS,
and the ratios HTA/diagnose (wall, work, RSS) and diagnose wall and work over the floor work.

Usage::

    python benchmarks/bench_vs_hta.py TRACE [TRACE ...] [--repeat N] [--json out.json]

Needs ``pip install traceinsight==0.6.1`` for the HTA rows (skipped with a note otherwise).
Not a test assertion.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

# Each child prints one JSON line {"import_s": ..., "work_s": ...} to the file named by
# $BENCH_TIMING (stdout is the tool's own output and goes to /dev/null).
_PRELUDE = "import json, os, sys, time\nt0 = time.perf_counter()\n"
_POSTLUDE = (
    "\ndef _done(t1):\n"
    "    with open(os.environ['BENCH_TIMING'], 'w') as f:\n"
    "        json.dump({'import_s': t1 - t0, 'work_s': time.perf_counter() - t1}, f)\n"
)

# Run as the console script does (but for its os._exit at the end, ``diagnose.cli.entry``:
# the timing is written after main() returns): import diagnose.cli (light), then main(). ``run`` starts
# reading and gunzipping the trace on a thread before it imports pandas and the analyzers,
# so those imports overlap the read; ``work_s`` (after the cli import) includes them.
CHILD_DIAGNOSE = _PRELUDE + """
from diagnose.cli import main
t1 = time.perf_counter()
""" + _POSTLUDE + """
sys.argv = ['diagnose', 'run', '--trace', sys.argv[1], '--format', 'json']
try:
    main()
finally:
    _done(t1)
"""

CHILD_HTA = _PRELUDE + """
import logging, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings('ignore')
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
""" + _POSTLUDE + """
ta = TraceAnalysis(trace_dir=sys.argv[1])
assert ta.t.is_parsed and ta.t.traces, 'HTA parsed no rank'
_done(t1)
"""

# The floor of issue "Scale": stdlib gunzip + a msgspec *typed* decode of every event into the
# fields any trace tool must look at (phase, category, name, times, process/thread); args skipped.
CHILD_FLOOR = _PRELUDE + """import gzip, msgspec
class Event(msgspec.Struct, gc=False):
    ph: str = ''
    cat: str = ''
    name: str = ''
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event]
t1 = time.perf_counter()
""" + _POSTLUDE + """
data = open(sys.argv[1], 'rb').read()
if data[:2] == b'\\x1f\\x8b':
    data = gzip.decompress(data)
doc = msgspec.json.decode(data, type=Doc)
_done(t1)
"""

CHILD_IMPORT = _PRELUDE + "import MODULE\nt1 = time.perf_counter()\n" + _POSTLUDE + "_done(t1)\n"


def run_child(argv: list[str]) -> dict:
    """Run one child; return wall_s, maxrss_mib, import_s, work_s (raises on failure)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as tf:
        timing_path = tf.name
    env = {**os.environ, "BENCH_TIMING": timing_path}
    err = tempfile.TemporaryFile()
    try:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"child failed (rc={p.returncode}): {' '.join(argv[:3])}...\n{tail}")
        with open(timing_path) as f:
            t = json.load(f)
        return {"wall_s": wall, "maxrss_mib": ru.ru_maxrss / 1024.0, **t}
    finally:
        err.close()
        os.unlink(timing_path)


def measure(argv: list[str], repeat: int) -> dict:
    runs = [run_child(argv) for _ in range(repeat)]
    walls = [r["wall_s"] for r in runs]
    return {
        "wall_s": statistics.median(walls),
        "wall_min_s": min(walls),
        "wall_max_s": max(walls),
        "work_s": statistics.median(r["work_s"] for r in runs),
        "import_s": statistics.median(r["import_s"] for r in runs),
        "maxrss_mib": max(r["maxrss_mib"] for r in runs),
        "runs": runs,
    }


_CHILD_INFO = """
import gzip, json, sys, msgspec
class Doc(msgspec.Struct):
    traceEvents: list[msgspec.Raw]
raw = open(sys.argv[1], 'rb').read()
data = gzip.decompress(raw) if raw[:2] == b'\\x1f\\x8b' else raw
events = msgspec.json.decode(data, type=list[msgspec.Raw]) if data.lstrip()[:1] == b'[' else msgspec.json.decode(data, type=Doc).traceEvents
print(json.dumps({"bytes": len(raw), "raw_bytes": len(data), "events": len(events)}))
"""


def trace_info(path: Path) -> dict:
    """Sizes and event count, counted in a child: a child forked by a process that had decoded
    the whole file would inherit that peak in its own ``ru_maxrss`` (Linux keeps the
    high-water mark across exec), which would then show in every tool's peak RSS."""
    out = subprocess.run([sys.executable, "-c", _CHILD_INFO, str(path)], check=True, capture_output=True, text=True)
    return {"path": str(path), **json.loads(out.stdout)}


def have_hta() -> bool:
    try:
        metadata.version("traceinsight")
    except metadata.PackageNotFoundError:
        return False
    return True


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("diagnose-llm", "traceinsight", "msgspec", "numpy", "pandas"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit() -> str | None:
    """Short commit of the diagnose checkout (with ``+dirty`` when the tree has changes)."""
    root = Path(__file__).resolve().parents[1]
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return c + ("+dirty" if dirty else "")


def machine() -> dict:
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "mem_gib": mem_gib, "cpu": cpu, "platform": platform.platform()}


STARTUP_MODULES = {
    # What each child imports (diagnose imports the pipeline and the JSON writer lazily inside
    # ``run``, overlapped with reading the trace; its startup row imports them all serially).
    "diagnose": ("diagnose.cli", "diagnose.pipeline", "diagnose.report.jsonout"),
    "hta": ("hta.trace_analysis",),
    "floor": ("gzip", "msgspec"),
}
LABELS = {
    "diagnose": "diagnose run --format json",
    "hta": "HTA TraceAnalysis load",
    "floor": "floor: gunzip + msgspec typed decode",
}


def bench(traces: list[Path], repeat: int, hta: bool = True) -> dict:
    from importlib.util import find_spec

    py = sys.executable
    hta = hta and have_hta()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "versions": versions(),
        "commit": git_commit(),
        "repeat": repeat,
        "startup": {},
        "traces": [],
    }
    for tool, mods in STARTUP_MODULES.items():
        if tool == "hta" and not hta:
            continue
        mods = tuple(m for m in mods if find_spec(m.split(".")[0]) and _spec(m))
        result["startup"][tool] = {"modules": mods, **measure([py, "-c", CHILD_IMPORT.replace("MODULE", ", ".join(mods))], repeat)}
    for path in traces:
        info = trace_info(path)
        row = {**info, "tools": {}}
        row["tools"]["diagnose"] = measure([py, "-c", CHILD_DIAGNOSE, str(path)], repeat)
        if hta:
            with tempfile.TemporaryDirectory() as d:
                link = Path(d) / path.name
                try:
                    link.symlink_to(path.resolve())
                except OSError:
                    import shutil

                    shutil.copy(path, link)
                row["tools"]["hta"] = measure([py, "-c", CHILD_HTA, d], repeat)
        row["tools"]["floor"] = measure([py, "-c", CHILD_FLOOR, str(path)], repeat)
        result["traces"].append(row)
    return result


def _spec(mod: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(mod) is not None
    except ModuleNotFoundError:
        return False


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.2f}"


def _ratio(a: float, b: float, fmt: str = "{:.2f}x") -> str:
    return fmt.format(a / b) if b > 0 else "n/a"


def markdown(res: dict) -> str:
    m, v = res["machine"], res["versions"]
    lines = [
        f"Date {res['date']}; {m['cpus']} CPUs ({m['cpu']}), {m['mem_gib']} GiB RAM; "
        + ", ".join(f"{k} {val}" for k, val in v.items() if val)
        + (f" (commit {res['commit']})" if res.get("commit") else "")
        + f"; median of {res['repeat']} runs, each in a fresh subprocess. "
        + "'work' is timed inside the child after its imports; 'wall' is the whole subprocess.",
        "",
        "| trace | size gz / raw (MiB) | events | tool | wall s (min-max) | work s | peak RSS MiB |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for r in res["traces"]:
        name = Path(r["path"]).name
        if len(name) > 48:
            name = name[:45] + "..."
        first = True
        for tool, t in r["tools"].items():
            lines.append(
                "| " + (f"`{name}`" if first else "")
                + " | " + (f"{_mib(r['bytes'])} / {_mib(r['raw_bytes'])}" if first else "")
                + " | " + (f"{r['events']:,}" if first else "")
                + f" | {LABELS[tool]} | {t['wall_s']:.2f} ({t['wall_min_s']:.2f}-{t['wall_max_s']:.2f})"
                + f" | {t['work_s']:.3f} | {t['maxrss_mib']:.0f} |"
            )
            first = False
    for tool, t in res["startup"].items():
        mods = ", ".join(t["modules"])
        lines.append(f"| *startup only* | | | `import {mods}` | {t['wall_s']:.2f} ({t['wall_min_s']:.2f}-{t['wall_max_s']:.2f}) | - | {t['maxrss_mib']:.0f} |")
    lines += [
        "",
        "| trace | HTA / diagnose wall | HTA / diagnose work | HTA / diagnose peak RSS | diagnose wall / floor work | diagnose work / floor work |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in res["traces"]:
        d, f = r["tools"]["diagnose"], r["tools"]["floor"]
        h = r["tools"].get("hta")
        hw = _ratio(h["wall_s"], d["wall_s"]) if h else "n/a"
        hm = _ratio(h["work_s"], d["work_s"]) if h else "n/a"
        hr = _ratio(h["maxrss_mib"], d["maxrss_mib"]) if h else "n/a"
        fwall = _ratio(d["wall_s"], f["work_s"])
        fw = _ratio(d["work_s"], f["work_s"])
        lines.append(f"| `{Path(r['path']).name[:48]}` | {hw} | {hm} | {hr} | {fwall} | {fw} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path, metavar="TRACE")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and trace (median reported; default 3)")
    ap.add_argument("--json", type=Path, default=None, dest="json_out", help="also write all numbers here")
    ap.add_argument("--no-hta", action="store_true", help="skip the HTA rows (e.g. for a 2 GB trace: HTA needs ~10x its size in RAM)")
    args = ap.parse_args(argv)
    for t in args.traces:
        if not t.is_file():
            ap.error(f"no such trace: {t}")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if not args.no_hta and not have_hta():
        print("note: traceinsight (HTA) not installed; HTA rows skipped. pip install traceinsight==0.6.1", file=sys.stderr)
    res = bench(args.traces, args.repeat, hta=not args.no_hta)
    print(markdown(res))
    if args.json_out:
        args.json_out.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
