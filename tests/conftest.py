"""Shared fixtures: path to the real trace corpus and a builder for inline Kineto traces."""
from __future__ import annotations

import copy
import functools
import gzip
import json
from pathlib import Path

import pytest

from diagnose.collectors.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


# Python lines that print the process's own peak RSS in bytes. Read from VmHWM, not
# getrusage's ru_maxrss: Linux carries the pre-exec high-water mark into ru_maxrss across
# execve, so a child started from a large pytest process would report the parent's peak.
PRINT_PEAK_RSS_BYTES = (
    "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')))\n"
)


# domain.md section 2, reference config "7B-like": the collector preset's model fields (a
# Hugging Face config.json's names; 32 layers, hidden 4096, 32 heads / 8 KV heads of 128,
# intermediate 11008, vocabulary 128000, untied embeddings).
REF_7B_CONFIG = {k: v for k, v in PRESETS["ref7b"].items()
                 if k not in ("model_type", "max_position_embeddings", "hidden_act", "rms_norm_eps")}


def shared_trace(rel: str) -> Path:
    """Path of a file in ../shared/traces; skips the test when the corpus is absent."""
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"shared trace corpus not available: {p}")
    return p


@functools.cache
def _report_once(path: str, opts: tuple) -> dict:
    from diagnose.options import AnalysisOptions
    from diagnose.pipeline import diagnose_trace

    return diagnose_trace(path, AnalysisOptions(**dict(opts))).to_dict()


def shared_report(path, **opts) -> dict:
    """The JSON report (verdicts by the packaged rules, default thresholds) of ``path`` with
    these analysis options: ``diagnose_trace(path, AnalysisOptions(**opts)).to_dict()``. A
    corpus trace or a shipped sample (files no test writes) is analysed once per test session,
    whichever test file asks first; each call returns a fresh deep copy. Other paths are
    analysed on each call."""
    p = Path(path).resolve()
    if not (p.is_relative_to(SHARED_TRACES.resolve()) or p.is_relative_to((ROOT / "samples").resolve())):
        return _report_once.__wrapped__(str(path), tuple(sorted(opts.items())))
    return copy.deepcopy(_report_once(str(path), tuple(sorted(opts.items()))))


def sweep(argvalues, keep, ids=None) -> list:
    """A ``parametrize`` sweep split for the inner loop: the cases in ``keep`` (indices, or ids
    when ``ids`` is given) are the representatives that run under ``-m "not slow"``; every
    other case is marked ``slow``, so the full suite (README, .ci/run) still runs them all.
    A tuple case is unpacked into the argnames, anything else is one argument."""
    out, reps = [], 0
    for i, v in enumerate(argvalues):
        rep = i in keep or (ids is not None and ids[i] in keep)
        reps += rep
        out.append(pytest.param(*(v if isinstance(v, tuple) else (v,)), id=None if ids is None else ids[i],
                                marks=() if rep else pytest.mark.slow))
    if argvalues and not reps:
        raise ValueError(f"sweep keeps none of its cases in the inner loop: {keep!r}")
    return out


def kineto_files() -> list[Path]:
    """Every Kineto JSON trace in the shared corpus (the sidecar execution_details.json is not one)."""
    if not SHARED_TRACES.exists():
        return []
    return sorted(
        p for p in SHARED_TRACES.rglob("*.json*") if p.name != "execution_details.json"
    )


class KinetoBuilder:
    """Build a Kineto trace in memory. Times in µs (as Kineto writes them)."""

    def __init__(self, **top):
        self.events: list[dict] = []
        self.top = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], **top}
        self._corr = 1000

    def kernel(self, name, ts, dur, corr=None, stream=7, device=0, cat="kernel", **args):
        a = {"device": device, "stream": stream, **args}
        if corr is not None:
            a["correlation"] = corr
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": a})
        return self

    def memcpy(self, ts, dur, corr=None, stream=7, device=0, nbytes=1024):
        return self.kernel("Memcpy DtoD (Device -> Device)", ts, dur, corr, stream, device, cat="gpu_memcpy", bytes=nbytes)

    def runtime(self, name, ts, dur, corr, cat="cuda_runtime"):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur, "args": {"correlation": corr}})
        return self

    def launch(self, name, kernel_ts, kernel_dur, launch_ts, launch_dur=2, stream=7, api="cudaLaunchKernel"):
        """A kernel plus the runtime call that launched it (same correlation id)."""
        self._corr += 1
        self.runtime(api, launch_ts, launch_dur, self._corr)
        return self.kernel(name, kernel_ts, kernel_dur, self._corr, stream)

    def annotation(self, name, ts, dur, cat="user_annotation", pid=100, tid=100):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {}})
        return self

    def cpu_op(self, name, ts, dur, input_dims=None):
        args = {"External id": len(self.events)}
        if input_dims is not None:
            args["Input Dims"] = input_dims
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur, "args": args})
        return self

    def python_frame(self, name, ts, dur, tid=100):
        """A with_stack python frame (``python_function``) on the host thread."""
        self.events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
                            "args": {}})
        return self

    def overhead(self, name, ts, dur):
        """A profiler overhead event (Kineto writes them on pid -1, tid 0)."""
        self.events.append({"ph": "X", "cat": "overhead", "name": name, "pid": -1, "tid": 0, "ts": ts, "dur": dur, "args": {}})
        return self

    def doc(self) -> dict:
        return {**self.top, "traceEvents": self.events}

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.doc()).encode()
        if gz:
            path = path.with_suffix(path.suffix + ".gz") if not str(path).endswith(".gz") else path
            path.write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)
        return path


@pytest.fixture
def kineto():
    return KinetoBuilder


#: Tests of 0.25 s or more, left out of the inner loop (tests/inner_loop_heavy.txt).
HEAVY = frozenset(line.strip() for line in (Path(__file__).parent / "inner_loop_heavy.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the heavy tests slow before ``-m`` selects (their ids: tests/inner_loop_heavy.txt)."""
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.slow)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite tests/golden/*.json from the current reports (review the diff).")


def _neutral(tp):
    """A neutral value of a model field type: None if nullable, else 0 / 0.0 / "" / [] / {} /
    the first literal / a neutral record."""
    import typing

    import msgspec

    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _neutral(args[0])
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if type(None) in args:
            return None
        return _neutral(args[0])
    if origin is typing.Literal:
        return args[0]
    if origin in (list, tuple):
        return []
    if origin is dict:
        return {}
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _fill(tp, {})
    return {int: 0, float: 0.0, str: "", bool: False}.get(tp)


def _fill(tp, partial: dict) -> dict:
    """``partial`` (JSON names) with every required field of record type ``tp`` it lacks set to
    a neutral value, nested records and lists of records filled the same way."""
    import typing

    import msgspec

    hints = typing.get_type_hints(tp, include_extras=True)
    out = dict(partial)
    for f in msgspec.structs.fields(tp):
        t = hints[f.name]
        if f.encode_name not in out:
            if f.required:
                out[f.encode_name] = _neutral(t)
            continue
        inner = typing.get_args(t)[0] if typing.get_origin(t) is typing.Annotated else t
        alts = list(typing.get_args(inner)) if typing.get_origin(inner) in (typing.Union, __import__("types").UnionType) else [inner]
        rec = [a for a in alts if isinstance(a, type) and issubclass(a, msgspec.Struct)]
        lst = [typing.get_args(a)[0] for a in alts if typing.get_origin(a) is list]
        v = out[f.encode_name]
        if rec and isinstance(v, dict):
            out[f.encode_name] = _fill(rec[0], v)
        elif lst and isinstance(v, list) and isinstance(lst[0], type) and issubclass(lst[0], msgspec.Struct):
            out[f.encode_name] = [_fill(lst[0], x) if isinstance(x, dict) else x for x in v]
    return out


def make_report(partial: dict):
    """A :class:`diagnose.model.Report` from a partial JSON report (tests state only the numbers
    they check; every other required field is neutral: None, 0, empty)."""
    from diagnose.model import Report, decode_report

    return decode_report(_fill(Report, partial))
