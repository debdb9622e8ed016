"""Start-up: wall and CPU time of the commands a user types first, in fresh processes,
interleaved round by round (one run of each command per round), so that a change in the
machine's load touches every command alike.

Commands timed (the console script's own code path, ``diagnose.cli:entry``):

* ``diagnose --help``
* ``diagnose run --trace SMALL`` (the terminal report, to a pipe) and ``--format json``;
  SMALL defaults to the 6 KB MI300X torch.compile trace of the shared corpus;
* floors: ``python -c pass`` (the interpreter) and ``python -c "import pandas"`` (what any
  command that analyses a trace must import).

Usage::

    python benchmarks/bench_startup.py [--small TRACE] [--rounds 10] [--json out.json]

Prints the median, min and max of each command's wall and CPU time (user + system) and the
machine's load average. Not a test assertion (tests/test_startup.py checks what is imported).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT.parent / "shared" / "traces" / "tracelens" / "torch_compile_triton" / "trace.json.gz"

_DIAGNOSE = ("import sys\nimport diagnose.cli as cli\nsys.argv[0] = 'diagnose'\n"
             "(getattr(cli, 'entry', None) or cli.main)()\n")  # the console script's function


def commands(small: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "python -c pass": [py, "-c", "pass"],
        "python -c 'import pandas'": [py, "-c", "import pandas"],
        "diagnose --help": [py, "-c", _DIAGNOSE, "--help"],
        "diagnose run --trace SMALL": [py, "-c", _DIAGNOSE, "run", "--trace", str(small)],
        "diagnose run --trace SMALL --format json": [py, "-c", _DIAGNOSE, "run", "--trace", str(small), "--format", "json"],
    }


_NEUTRAL_CWD = __import__("tempfile").mkdtemp(prefix="bench-startup-cwd-")


def run_round(cmds: dict[str, list[str]]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, argv in cmds.items():
        before = os.times()
        t0 = time.perf_counter()
        # cwd: an empty directory, so that ``python -c``'s sys.path[0] never shadows ROOT
        p = subprocess.run(argv, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=_NEUTRAL_CWD)
        wall = time.perf_counter() - t0
        after = os.times()
        if p.returncode != 0:
            raise RuntimeError(f"{name}: exit {p.returncode}\n{p.stderr.decode(errors='replace')[-1000:]}")
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        out[name] = (wall, cpu)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=Path, default=SMALL, help="the small trace (default: the 6 KB MI300X torch.compile trace)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None, dest="json_out")
    args = ap.parse_args(argv)
    if not args.small.is_file():
        ap.error(f"no such trace: {args.small}")
    args.small = args.small.resolve()
    cmds = commands(args.small)
    from bench_pairs import compile_bytecode

    compile_bytecode(ROOT)  # as an installed package has it (see bench_pairs.compile_bytecode)
    run_round(cmds)  # warm-up: page cache
    loads, rounds = [], []
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        rounds.append(run_round(cmds))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
          f"{args.rounds} interleaved rounds after one warm-up; load average (1 min) median {statistics.median(loads):.1f} "
          f"(min {min(loads):.1f}, max {max(loads):.1f}); small trace {args.small.name} ({args.small.stat().st_size:,} bytes)")
    print()
    print("| command | wall s median (min-max) | CPU s median (min-max) |")
    print("|---|---|---|")
    res = {}
    for name in cmds:
        w = [r[name][0] for r in rounds]
        c = [r[name][1] for r in rounds]
        res[name] = {"wall_s": w, "cpu_s": c}
        print(f"| `{name}` | {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | {statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f}) |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"loadavg_1m": loads, "commands": res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
