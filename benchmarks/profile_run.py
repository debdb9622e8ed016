"""Where ``diagnose run`` spends its time: per stage (imports, load, each analyzer, verdicts,
JSON) and per function, in one process.

The stages are timed with ``time.process_time`` (CPU of this process) and wall clock; the
analyzers are whatever :func:`diagnose.analyzers.analyze` calls directly, found with
cProfile in a second analysis of the same file (each callee of ``analyze`` is one row:
``<module>.<function>``), so the table follows the code as analyzers are added or rewired;
their shares are applied to the CPU time of the first, unprofiled analysis. The load's forked decoding workers are
counted separately (``RUSAGE_CHILDREN``).

Usage::

    python benchmarks/profile_run.py TRACE [--top 30] [--workers N]

``--top`` also prints the functions with the most own time in the analysis (cProfile:
deterministic, adds overhead to Python-heavy code; py-spy gives sampled numbers without it:
``py-spy record -f raw -o out.txt -- python benchmarks/profile_run.py TRACE``). Not a test
assertion.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import sys
import time
from pathlib import Path


def _stage(stages: list, name: str, t0: float, c0: float) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    stages.append((name, t - t0, c - c0))
    return t, c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--top", type=int, default=0, help="also list the N functions with the most own time in the analysis")
    ap.add_argument("--workers", type=int, default=None, help="decoding processes for a large Kineto file (default: the loader's)")
    args = ap.parse_args(argv)
    stages: list[tuple[str, float, float]] = []
    t, c = time.perf_counter(), time.process_time()
    from diagnose.trace.reading import Prefetch, sniff

    prefetch = Prefetch(str(args.trace)) if sniff(str(args.trace)) == "kineto" else None
    if prefetch is not None and args.workers is None:  # as `diagnose run`: workers decode while the rest imports
        from diagnose.trace.kineto import start_prefetched

        start_prefetched(prefetch)
    from diagnose.analyzers import analyze
    from diagnose.engine import load_ruleset
    from diagnose.pipeline import attach_verdicts
    from diagnose.report.jsonout import to_json
    from diagnose.trace.load import load_trace

    ruleset = load_ruleset()
    t, c = _stage(stages, "read; imports (+ rules) while the workers decode", t, c)
    trace = load_trace(str(args.trace), prefetch=prefetch, workers=args.workers)
    t, c = _stage(stages, "load: rest of the wait, merge (this process)", t, c)
    analysis = analyze(trace)
    t, c = _stage(stages, "analyze", t, c)
    attach_verdicts(analysis, ruleset)
    t, c = _stage(stages, "verdicts", t, c)
    to_json(analysis.to_dict())
    t, c = _stage(stages, "JSON report", t, c)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the second load
    # the breakdown: a second analysis of a fresh load, under cProfile (CPU time: a shared
    # machine stretches wall time); its shares are applied to the unprofiled analysis' CPU
    trace = load_trace(str(args.trace), workers=args.workers)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    analyze(trace)
    prof.disable()
    plain = next(cpu for name, _w, cpu in stages if name == "analyze")

    st = pstats.Stats(prof)
    entry = next(k for k in st.stats if k[2] == "analyze" and k[0].endswith(os.path.join("analyzers", "__init__.py")))
    rows = []
    for func, (_cc, _nc, _tt, ct, callers) in st.stats.items():
        if entry in callers:
            cc, nc, tt, ct_from = callers[entry]
            mod = Path(func[0]).stem
            rows.append((f"{mod}.{func[2]}", ct_from))
    total = st.stats[entry][3]
    print(f"{args.trace.name}: {len(trace.gpu):,} GPU activities, {len(trace.runtime):,} runtime calls, "
          f"{len(trace.cpu_ops):,} ops; pid {os.getpid()}")
    print()
    print("| stage | wall s | CPU s (this process) |")
    print("|---|---:|---:|")
    for name, w, cpu in stages:
        print(f"| {name} | {w:.3f} | {cpu:.3f} |")
    print(f"| load: forked decoding workers | | {kids.ru_utime + kids.ru_stime:.3f} |")
    print()
    print("| analyzer (callee of analyze) | share of analyze (cProfile) | CPU s (share x unprofiled analyze) |")
    print("|---|---:|---:|")
    for name, ct in sorted(rows, key=lambda r: -r[1]):
        if ct >= 0.0005:
            print(f"| `{name}` | {ct / total:.0%} | {plain * ct / total:.3f} |")
    print(f"| total | | {plain:.3f} |")
    if args.top:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
        print()
        print(buf.getvalue())
    print(f"peak RSS of this process through the JSON report: {peak_mib:.0f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
