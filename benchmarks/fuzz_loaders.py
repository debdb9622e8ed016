"""Long fuzz run of the loaders + analyzers over mutated real traces (diagnose.fuzzing).

    python benchmarks/fuzz_loaders.py --n 100000 [--workers 2] [--seed 0] [--out fuzz.json] [--generator 2]

Every input is read as the command line would read it: a trace is loaded (every 10th is also
analysed, a merged-ranks file rank by rank), a model config goes through `diagnose bounds`
and `diagnose kv-budget`, a metrics file, rules config or rule file through its loader. An
input may succeed or raise DiagnoseError (one clear line, exit 2). Anything else is a bug;
an input still running after 60 s is stopped (SLOW). Each input is timed: the result lists
the ten slowest and counts the inputs of at most 1 MB that took over 10 s. Seeds are
recorded so that `--replay SEED` (with the same `--generator`) reproduces an input.
Generator 3 (default) is diagnose.fuzzing.mutant3 (issue-20 families: encodings, 64-bit
ids, shapes, duplicates, names, nsys exports, side inputs); 2 is mutant2 (the issue-15
family); 1 is the first one, diagnose.fuzzing.mutant, whose recorded seeds tests/test_fuzz.py
replays.
"""
from __future__ import annotations

import argparse
import collections
import functools
import gzip
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import threading
import tempfile
import time
from pathlib import Path

import msgspec

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
SEEDS = ["tracelens/torch_compile_triton/trace.json.gz", "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
         "nano-vllm-zhang-yuhui/forward_10.json"]

_seeds = None
ANALYZE_EVERY = 10


def _load_seeds():
    out = []
    for rel in SEEDS:
        raw = (SHARED / rel).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        out.append((msgspec.json.decode(raw), raw))
    return out


NSYS_SEED = "nvfuser/64ee035/report1.sqlite"
_nsys = None
#: An input still running after this many seconds is stopped and counted as SLOW.
STOP_AFTER_S = 60


def _input(seed: int, generator: int) -> tuple[str, bytes]:
    """(kind, bytes) of input ``seed``: kind "trace" for generators 1 and 2."""
    global _seeds, _nsys
    from diagnose.fuzzing import mutant, mutant2, mutant3

    if _seeds is None:
        _seeds = _load_seeds()
    rng = random.Random(seed)
    doc, raw = _seeds[seed % len(_seeds)]
    if generator == 3:
        if _nsys is None:
            _nsys = (SHARED / NSYS_SEED).read_bytes()
        return mutant3(doc, raw, rng, _nsys)
    return "trace", (mutant2 if generator == 2 else mutant)(doc, raw, rng)


def _consume(kind: str, path: str, seed: int) -> None:
    """Read one input the way the command line would; the full analysis on every 10th trace."""
    from diagnose.analyzers import analyze
    from diagnose.trace import load_trace, split_ranks

    if kind in ("trace", "nsys"):
        trace = load_trace(path)
        if seed % ANALYZE_EVERY == 0:
            analyze(trace).to_dict()
            if trace.ranks:
                for _label, part in split_ranks(trace):
                    analyze(part).to_dict()
    elif kind == "model_config":
        from click.testing import CliRunner

        from diagnose.cli import main

        for args in (["bounds", "--model-config", path, "--gpu", "H100-SXM"],
                     ["kv-budget", "--model-config", path, "--seq-len", "4096", "--memory-gb", "80"]):
            r = CliRunner().invoke(main, args)
            if r.exit_code == 2:
                from diagnose.errors import DiagnoseError

                raise DiagnoseError(r.output.strip().splitlines()[-1] if r.output.strip() else "exit 2")
            if r.exit_code != 0:
                raise RuntimeError(f"exit {r.exit_code}: {r.output.strip()[-200:]}")
    elif kind == "metrics":
        from diagnose.findings import load_metrics

        load_metrics(path)
    elif kind == "rules_config":
        from diagnose.engine import load_ruleset

        load_ruleset(None, path)
    else:  # one rule file, in a folder of its own
        from diagnose.engine import load_rules

        load_rules(os.path.dirname(path))


def _warm() -> None:
    """Pool initializer: import what the inputs use once per worker (jsonschema alone takes
    seconds on a loaded machine), so an input's time is its own work, not the imports."""
    import jsonschema  # noqa: F401

    import diagnose.analyzers  # noqa: F401
    import diagnose.cli  # noqa: F401
    import diagnose.engine  # noqa: F401
    import diagnose.trace.nsys  # noqa: F401
    from diagnose.engine.rule import rule_schema

    rule_schema()
    _input(0, 3)


class _Stop(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Stop


def one(seed: int, generator: int = 2) -> tuple[str, str | None]:
    """(outcome, detail) of input ``seed``: see :func:`one_timed`."""
    kind, detail, _s, _n = one_timed(seed, generator)
    return kind, detail


def one_timed(seed: int, generator: int = 2) -> tuple[str, str | None, float, int]:
    """(outcome, detail, seconds, input bytes): outcome "ok", "diagnose_error" (a clean
    one-line error), "BUG" (anything else) or "SLOW" (stopped after STOP_AFTER_S)."""
    from diagnose.errors import DiagnoseError

    kind, data = _input(seed, generator)
    tmpdir = tempfile.mkdtemp(prefix="fuzz-")
    name = {"nsys": "x.sqlite", "rule": "fuzz-rule.yaml", "rules_config": "c.yaml"}.get(kind, "x.json")
    path = os.path.join(tmpdir, name)
    use_alarm = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            f.write(data)
        if use_alarm:
            signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(STOP_AFTER_S)
        try:
            _consume(kind, path, seed)
            return "ok", None, time.perf_counter() - t0, len(data)
        except DiagnoseError:
            return "diagnose_error", None, time.perf_counter() - t0, len(data)
        except _Stop:
            return "SLOW", f"{kind}: stopped after {STOP_AFTER_S} s", time.perf_counter() - t0, len(data)
        except Exception as e:  # noqa: BLE001 — this is what we are hunting
            return "BUG", f"{kind}: {type(e).__name__}: {str(e)[:200]}", time.perf_counter() - t0, len(data)
        finally:
            if use_alarm:
                signal.alarm(0)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", type=int, default=None)
    ap.add_argument("--progress", type=int, default=0, help="print counts to stderr every N inputs")
    ap.add_argument("--generator", type=int, choices=(1, 2, 3), default=3,
                    help="3: diagnose.fuzzing.mutant3 (issue-20 families, nsys and side inputs); 2: mutant2 "
                         "(with the issue-15 family); 1: the first generator")
    a = ap.parse_args(argv)
    if a.replay is not None:
        print(one_timed(a.replay, a.generator))
        return 0
    missing = [rel for rel in SEEDS + ([NSYS_SEED] if a.generator == 3 else []) if not (SHARED / rel).exists()]
    if missing:  # a pool whose initializer fails restarts its workers for ever: fail first
        print(f"seed traces not found under {SHARED}: {', '.join(missing)}", file=sys.stderr)
        return 2
    t0 = time.time()
    counts: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    bugs: list[dict] = []
    slowest: list[tuple[float, int, int]] = []  # (seconds, seed, bytes), the 10 slowest
    over = 0  # inputs of <= 1 MB that took over 10 s
    seeds = range(a.seed, a.seed + a.n)
    with mp.get_context("spawn").Pool(a.workers, initializer=_warm) as pool:
        for s, (kind, msg, secs, size) in zip(seeds, pool.imap(functools.partial(one_timed, generator=a.generator), seeds, chunksize=16)):
            counts[kind] += 1
            if msg and kind != "BUG":
                by_kind[msg.split(":")[0]] += 1
            if kind in ("BUG", "SLOW") and len(bugs) < 50:
                bugs.append({"seed": s, "outcome": kind, "error": msg})
            if size <= 2**20 and secs > 10:
                over += 1
            slowest = sorted(slowest + [(secs, s, size)], reverse=True)[:10]
            if a.progress and (s - a.seed + 1) % a.progress == 0:
                print(f"{s - a.seed + 1} inputs, {dict(counts)}, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    res = {"inputs": a.n, "seed_start": a.seed, "generator": a.generator, "counts": dict(counts), "bugs": bugs,
           "over_10s_at_most_1mb": over,
           "slowest": [{"seed": sd, "seconds": round(t, 2), "bytes": b} for t, sd, b in slowest],
           "elapsed_s": round(time.time() - t0, 1), "workers": a.workers, "seeds": SEEDS + ([NSYS_SEED] if a.generator == 3 else [])}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 1 if counts["BUG"] or counts["SLOW"] or over else 0


if __name__ == "__main__":
    sys.exit(main())
