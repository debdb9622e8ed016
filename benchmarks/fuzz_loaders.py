"""Long fuzz run of the loaders + analyzers over mutated real traces (diagnose.fuzzing).

    python benchmarks/fuzz_loaders.py --n 100000 [--workers 2] [--seed 0] [--out fuzz.json] [--generator 2]

Every input is loaded (every 10th is also analysed, a merged-ranks file rank by rank) as
`diagnose run` would; an input may succeed or raise DiagnoseError (one clear line, exit 2).
Anything else is a bug: its seed is recorded so it can be replayed with `--replay SEED`
(with the same `--generator`). Generator 2 (default) is diagnose.fuzzing.mutant2 (half of the
inputs from the issue-15 family); generator 1 is the first one, diagnose.fuzzing.mutant, whose
recorded seeds tests/test_fuzz.py replays.
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
import sys
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


def one(seed: int, generator: int = 2) -> tuple[str, str | None]:
    global _seeds
    from diagnose.analyzers import analyze
    from diagnose.errors import DiagnoseError
    from diagnose.fuzzing import mutant, mutant2
    from diagnose.trace import load_trace, split_ranks

    if _seeds is None:
        _seeds = _load_seeds()
    rng = random.Random(seed)
    doc, raw = _seeds[seed % len(_seeds)]
    data = (mutant2 if generator == 2 else mutant)(doc, raw, rng)
    fd, path = tempfile.mkstemp(suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            trace = load_trace(path)
            if seed % ANALYZE_EVERY == 0:  # the full analysis on every 10th input
                analyze(trace).to_dict()
                if trace.ranks:
                    for _label, part in split_ranks(trace):
                        analyze(part).to_dict()
            return "ok", None
        except DiagnoseError:
            return "diagnose_error", None
        except Exception as e:  # noqa: BLE001 — this is what we are hunting
            return "BUG", f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        os.unlink(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", type=int, default=None)
    ap.add_argument("--generator", type=int, choices=(1, 2), default=2,
                    help="2: diagnose.fuzzing.mutant2 (with the issue-15 family); 1: the first generator")
    a = ap.parse_args(argv)
    if a.replay is not None:
        print(one(a.replay, a.generator))
        return 0
    t0 = time.time()
    counts: collections.Counter = collections.Counter()
    bugs: list[dict] = []
    seeds = range(a.seed, a.seed + a.n)
    with mp.get_context("spawn").Pool(a.workers) as pool:
        for s, (kind, msg) in zip(seeds, pool.imap(functools.partial(one, generator=a.generator), seeds, chunksize=64)):
            counts[kind] += 1
            if kind == "BUG" and len(bugs) < 50:
                bugs.append({"seed": s, "error": msg})
    res = {"inputs": a.n, "seed_start": a.seed, "generator": a.generator, "counts": dict(counts), "bugs": bugs,
           "elapsed_s": round(time.time() - t0, 1), "workers": a.workers, "seeds": SEEDS}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
