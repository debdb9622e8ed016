"""Short fuzz run over mutated real traces (the long run is benchmarks/fuzz_loaders.py):
loading and analysing never raises anything but DiagnoseError.

Plain seeded loops: seed N always builds the same mutant (``random.Random(N)``), so a failure
names its seed (``-k "seed17"``) and reproduces. The first FAST_SEEDS seeds run in the inner
loop; the rest are marked ``slow`` (the full suite runs all N_SEEDS).
"""
from __future__ import annotations

import gzip
import random

import msgspec
import pytest
from conftest import shared_trace
from diagnose.errors import DiagnoseError
from diagnose.fuzzing import mutant, mutant2, mutate_issue15
from diagnose.pipeline import run_analysis

SEEDS = ["tracelens/torch_compile_triton/trace.json.gz", "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"]
N_SEEDS = 150
FAST_SEEDS = 4


def _seeds():
    return [pytest.param(n, id=f"seed{n}", marks=() if n < FAST_SEEDS else pytest.mark.slow) for n in range(N_SEEDS)]


@pytest.fixture(scope="module")
def seeds():
    out = []
    for rel in SEEDS:
        raw = gzip.decompress(shared_trace(rel).read_bytes())
        out.append((msgspec.json.decode(raw), raw))
    return out


@pytest.mark.parametrize("seed", _seeds())
def test_no_exception_escapes(seeds, tmp_path, seed):
    doc, raw = seeds[seed % len(SEEDS)]
    data = mutant(doc, raw, random.Random(seed))
    p = tmp_path / f"m{seed}.json"
    p.write_bytes(data)
    try:
        a = run_analysis(str(p))
    except DiagnoseError:
        return
    d = a.to_dict()  # the report must also serialise
    for ph in d["phases"]:
        for k in ("gpu_idle_share", "launch_gap_share", "attention_share"):
            assert ph[k] is None or 0.0 <= ph[k] <= 1.0, (seed, k, ph[k])


# Inputs that escaped as UnicodeDecodeError in the first 100k-input run (benchmarks/README.md):
# invalid UTF-8 inside an event whose other fields also had odd types (loose-decode path).
FOUND_SEEDS = [7094, 10627, 25410, 37815, 40738, 41956, 50195, 52577, 57320, 62517, 67084, 76955, 77183, 84254, 96515, 99698,
               207753]  # invalid UTF-8 in a skipped top-level value: the strict decode passes, the metadata read does not


@pytest.mark.slow  # replays the long fuzz run's findings
def test_long_run_findings_stay_fixed():
    import importlib.util

    from conftest import ROOT, SHARED_TRACES

    if not SHARED_TRACES.exists():
        pytest.skip("shared trace corpus not available")
    spec = importlib.util.spec_from_file_location("fuzz_loaders", ROOT / "benchmarks" / "fuzz_loaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    outcomes = [mod.one(s, generator=1)[0] for s in FOUND_SEEDS]
    assert "BUG" not in outcomes
    assert outcomes.count("ok") == 13 and outcomes.count("diagnose_error") == 4


@pytest.mark.parametrize("seed", _seeds())
def test_no_exception_escapes_issue15_inputs(seeds, tmp_path, seed):
    """mutant2: begin/end pairs, other backends, merged ranks, 1e400, bad durations, deep
    nesting, empty lists... load, split into ranks and analyse, or one DiagnoseError."""
    from diagnose.analyzers import analyze
    from diagnose.trace import load_trace, split_ranks

    doc, raw = seeds[(seed // 2) % len(SEEDS)]  # both mutators on both traces
    rng = random.Random(seed)
    data = mutate_issue15(doc, rng) if seed % 2 else mutant2(doc, raw, rng)
    p = tmp_path / f"m{seed}.json"
    p.write_bytes(data)
    try:
        trace = load_trace(str(p))
    except DiagnoseError:
        return
    for _label, part in split_ranks(trace):
        d = analyze(part).to_dict()
        for ph in d["phases"]:
            for k in ("gpu_idle_share", "launch_gap_share", "attention_share"):
                assert ph[k] is None or 0.0 <= ph[k] <= 1.0, (seed, k, ph[k])


def _harness():
    import importlib.util

    from conftest import ROOT, SHARED_TRACES

    if not SHARED_TRACES.exists():
        pytest.skip("shared trace corpus not available")
    spec = importlib.util.spec_from_file_location("fuzz_loaders", ROOT / "benchmarks" / "fuzz_loaders.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # fuzz loop (60 inputs); the seeded fuzz tests above are the inner loop's
def test_issue20_inputs_end_cleanly_and_quickly():
    """mutant3 (encodings, 64-bit ids, shapes, duplicates, names, nsys exports, side inputs):
    every one of 60 inputs is read as the command line reads it and ends ok or with one
    DiagnoseError, none of them near the 10 s bound of the long run."""
    mod = _harness()
    kinds, outcomes = set(), []
    for seed in range(60):
        kind, _data = mod._input(seed, 3)
        kinds.add(kind)
        outcome, detail, seconds, size = mod.one_timed(seed, 3)
        assert outcome in ("ok", "diagnose_error"), (seed, outcome, detail)
        assert size > 1 << 20 or seconds < 10, (seed, seconds)
        outcomes.append(outcome)
    assert kinds == {"trace", "nsys", "model_config", "metrics", "rules_config", "rule"}
    assert outcomes.count("ok") >= 20 and outcomes.count("diagnose_error") >= 10
