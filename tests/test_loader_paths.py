"""The Kineto loader's decode paths give one result: whole-document (strict, then lenient,
then the split/repair path), chunked (``_load_chunked``: ``_locate_events`` or the
``dict[str, Raw]`` fallback, per-slice strict-then-lenient), and chunked on forked workers
(including a fork that fails and a child that fails). Also: format sniffing and the
background read (:class:`Prefetch`), and the command line around them.

Several tests pin bugs found while writing this file and fixed since: the end of the array
before a trailing list, metadata that differed between paths, row order that depended on
slicing, descriptors left open by a failed fork, a gunzip buffer sized from a cut stream.
"""
from __future__ import annotations

import gzip
import json
import os
import pickle
import threading
import tracemalloc
import zlib

import msgspec
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import SHARED_TRACES, kineto_files, shared_trace
from diagnose.cli import main
from diagnose.pipeline import attach_verdicts
from diagnose.errors import TraceFormatError
from diagnose.pipeline import run_analysis
from diagnose.report.jsonout import to_json
from diagnose.trace import kineto as loader
from diagnose.trace import reading
from diagnose.trace.reading import Prefetch, read_bytes_partial, sniff

FRAMES = ("gpu", "runtime", "cpu_ops", "annotations", "gpu_syncs", "overhead")
MiB = 1 << 20


# helpers ----------------------------------------------------------------------------------
def _quality(t):
    return [(q.code, q.message, q.count) for q in t.quality]


def assert_same(a, b) -> None:
    """Same frames, quality notes, partial flag, devices, metadata (every top-level key),
    event counts (python_function) and merged-rank labels."""
    for f in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, f), getattr(b, f), obj=f)
    assert _quality(a) == _quality(b)
    assert a.partial == b.partial
    assert a.devices == b.devices
    assert a.metadata == b.metadata
    assert a.counts == b.counts
    assert a.ranks == b.ranks and a._rank_counts == b._rank_counts


class _RaisesOnEvents(msgspec.Struct):
    traceEvents: list[int]


def _lenient_only(monkeypatch) -> None:
    """Strict decoders that reject every event list: only the lenient _Event path is left."""
    monkeypatch.setattr(loader, "_strict_list_dec", msgspec.json.Decoder(list[int]))
    monkeypatch.setattr(loader, "_strict_doc_dec", msgspec.json.Decoder(_RaisesOnEvents))
    assert loader._decode_slice(b'[{"ph": "X", "cat": "kernel"}]')[1] is False


class _OneThread:
    """``threading`` as the loader sees it, with only this thread running."""

    def __getattr__(self, name):
        return getattr(threading, name)

    @staticmethod
    def active_count() -> int:
        return 1


@pytest.fixture
def fork_allowed(monkeypatch):
    """The loader forks workers only from a single-threaded process, and an earlier test of
    the session may leave a daemon thread behind (tqdm's monitor): the fork tests below have
    the loader see this thread only. See test_no_fork_while_other_threads_run for the rule."""
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    if threading.active_count() > 1:
        monkeypatch.setattr(loader, "threading", _OneThread())


def _spy(monkeypatch, name: str, record=lambda args, result: result) -> list:
    """Wrap ``loader.<name>``; each call appends ``record(args, result)`` (parent process only)."""
    real = getattr(loader, name)
    calls: list = []

    def wrapper(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(record(args, out))
        return out

    monkeypatch.setattr(loader, name, wrapper)
    return calls


def _synthetic(kineto, n: int = 40, **top):
    """cpu_op + launch (runtime + kernel) + annotation per step; fractional kernel ts."""
    b = kineto(**top)
    for i in range(n):
        b.cpu_op(f"op{i}", 100 * i, 60, input_dims=[[i, 4]])
        b.launch(f"kernel_{i}", 100 * i + 20.25, 30, launch_ts=100 * i + 5)
        b.annotation(f"ann{i}", 100 * i, 70)
    return b


# 1. parity on the shared corpus -----------------------------------------------------------
# Files with a list in a key that FOLLOWS traceEvents (an "INFO" list, or deviceProperties
# written after the events): _locate_events once took that list's "]" for the end of the
# array, so the last slice failed and the chunked work was thrown away.
TAIL_ARRAY_FILES = {
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
}


#: Corpus files whose every-path checks stay in the inner loop (`pytest -m "not slow"`): small,
#: and between them a split trace with a graph replay and a trace with metadata events. Every
#: other file is marked `slow` (the full suite runs them all).
FAST_PATH_FILES = {"tracelens/torch_compile_triton/trace.json.gz", "tracelens/vllm_decode_full/graph_execution.json.gz"}


def _shared_params():
    files = kineto_files()
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"shared trace corpus not available: {SHARED_TRACES}"))]
    out = []
    for p in files:
        rel = p.relative_to(SHARED_TRACES).as_posix()
        out.append(pytest.param(p, id=rel, marks=() if rel in FAST_PATH_FILES else pytest.mark.slow))
    return out


def _default_or_skip(path):
    try:
        return loader.load_kineto(str(path))
    except TraceFormatError as e:
        pytest.skip(f"not a Kineto trace for the default path: {e}")


def test_shared_corpus_has_every_listed_kineto_file():
    files = {p.relative_to(SHARED_TRACES).as_posix() for p in kineto_files()}
    if not files:
        pytest.skip("shared trace corpus not available")
    assert len(files) == 26  # MANIFEST.md: 26 Kineto JSON files (the DLRM .tar.gz is not one)
    assert TAIL_ARRAY_FILES <= files
    assert "hta/trace_diff/control.json.gz" in files


def _children(n_workers: int) -> int:
    """Children forked for ``n_workers``: none for one; on two, one child and the parent
    (``kineto._forked``); else one per worker."""
    return 0 if n_workers <= 1 else 1 if n_workers == 2 else n_workers


@pytest.mark.parametrize("path", _shared_params())
def test_shared_trace_all_paths_equal(path, monkeypatch, fork_allowed):
    default = _default_or_skip(path)
    size = len(read_bytes_partial(str(path))[0])
    assert size < 40 * MiB  # the forced chunking below stays cheap

    # (a) chunked in the parent, (b) chunked on 3 forked workers
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(loader, "CHUNK_BYTES", MiB)
    tried = _spy(monkeypatch, "_load_chunked", lambda a, r: r is not None)
    n_slices = _spy(monkeypatch, "_slices", lambda a, r: len(r))
    forks = _spy(monkeypatch, "_fork_decode")
    for workers in (1, 3):  # pinned: workers_default() may fall back to 1 (see its test)
        monkeypatch.setattr(loader, "workers_default", lambda w=workers: w)
        chunked = loader.load_kineto(str(path))
        assert_same(default, chunked)
    assert len(tried) == 2
    assert tried[0] == tried[1]  # both runs took the chunked path, or both gave up
    assert n_slices[0] == n_slices[1] >= (size - 2 * MiB) // (2 * MiB)
    assert len(forks) == _children(min(3, n_slices[1]))

    # (c) lenient _Event schema only, whole-document path and chunked path
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 64 * MiB)
    _lenient_only(monkeypatch)
    assert_same(default, loader.load_kineto(str(path)))
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(loader, "workers_default", lambda: 1)
    assert_same(default, loader.load_kineto(str(path)))


def test_workers_default_honours_the_environment(monkeypatch, fork_allowed):
    cpus = os.cpu_count() or 1
    for env, expected in (("3", min(3, cpus)), ("1", 1), ("7", min(7, cpus)), (" 2 ", min(2, cpus)), ("99999999999999999999", cpus)):
        monkeypatch.setenv("DIAGNOSE_WORKERS", env)
        assert loader.workers_default() == expected  # never more than the CPUs
    monkeypatch.setenv("DIAGNOSE_WORKERS", "0")  # not a count: the CPUs, at most 4
    assert 1 <= loader.workers_default() <= 4


@pytest.mark.parametrize("path", _shared_params())
def test_shared_trace_chunked_path_is_taken(path, monkeypatch):
    default = _default_or_skip(path)
    buf, cut = read_bytes_partial(str(path))
    assert cut is None
    monkeypatch.setattr(loader, "CHUNK_BYTES", MiB)
    chunked = loader._load_chunked(str(path), buf, workers=1)
    assert chunked is not None
    assert_same(default, chunked)


@pytest.mark.slow  # every loader path on a 1.8 MB corpus file
def test_control_trace_exact_numbers_on_every_path(monkeypatch, fork_allowed):
    path = str(shared_trace("hta/trace_diff/control.json.gz"))

    def check(t):
        assert [len(getattr(t, f)) for f in FRAMES] == [9450, 24692, 40506, 288, 0, 0]
        assert t.gpu["kind"].value_counts().to_dict() == {"kernel": 8568, "memset": 654, "memcpy": 228}
        assert int(t.gpu["start_ns"].min()) == 1661203462599325000
        assert int(t.gpu["end_ns"].max()) == 1661203463063919000
        assert int((t.gpu["end_ns"] - t.gpu["start_ns"]).sum()) == 501567000
        assert int(t.runtime["start_ns"].min()) == 1661203462599215000
        assert t.runtime["api_kind"].value_counts().to_dict() == {"other": 11292, "launch": 8568, "sync": 3950, "memset": 654, "memcpy": 228}
        assert int(t.cpu_ops["external_id"].max()) == 40890
        assert int(t.cpu_ops["input_dims"].notna().sum()) == 36468
        assert t.quality == [] and t.partial is False
        assert t.metadata["distributedInfo"] == {"backend": "nccl", "rank": 3, "world_size": 8}
        assert len(t.devices) == 8 and t.devices[0].name == "NVIDIA A100-PG509-200" and t.devices[0].num_sms == 108

    check(loader.load_kineto(path))
    buf, _ = read_bytes_partial(path)
    monkeypatch.setattr(loader, "CHUNK_BYTES", MiB)
    check(loader._load_chunked(path, buf, workers=1))
    check(loader._load_chunked(path, buf, workers=3))


def test_started_decode_is_the_load(monkeypatch, fork_allowed):
    """The command line starts a large file's workers before pandas imports
    (``start_decode``); the load then collects them: the same trace as the load that forks its
    own workers, and as the default load (the HTA control trace, cut into 1 MiB slices)."""
    path = str(shared_trace("hta/trace_diff/control.json.gz"))
    default = loader.load_kineto(path)
    buf, _ = read_bytes_partial(path)
    monkeypatch.setattr(loader, "CHUNK_BYTES", MiB)
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", MiB)
    monkeypatch.setenv("DIAGNOSE_WORKERS", "2")
    forks = _spy(monkeypatch, "_fork_decode", lambda a, r: a[1])
    parent = _spy(monkeypatch, "_decode_slices", lambda a, r: (a[1], r.n_slices))
    started = loader.start_decode(buf)
    assert started is not None and len(forks) == 1  # forked at once, before the load
    trace = loader.load_kineto(path, buf=buf, started=started)
    assert len(forks) == 1  # the load forked no more
    assert_same(default, trace)
    assert started.buf is None  # handed over: the document is not kept alive by it
    # two CPUs: the child was given every slice; this process decoded the end of them itself
    slices = loader._Plan(buf).slices
    assert forks == [slices] and len(parent) == 1
    tail, n_tail = parent[0]
    assert 1 <= n_tail == len(tail) <= len(slices) // 2 and tail == slices[len(slices) - n_tail:]


@pytest.mark.parametrize("child", ["ok", "late", "fails"])
def test_parent_decoding_the_tail_never_repeats_a_slice(child, monkeypatch, fork_allowed):
    """Two workers: one child decodes the slices from the start, this process takes the later
    half of what the child has not reached and the child stops there. A child that read the
    bound late (it decoded slices the parent took) or one that failed still gives every slice
    once, in order (the parent redoes what is past the child, or what the child did not send)."""
    path = str(shared_trace("hta/trace_diff/control.json.gz"))
    default = loader.load_kineto(path)
    buf, _ = read_bytes_partial(path)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 4 * MiB)
    if child != "ok":
        real = loader._fork_decode

        def fork(src, slices, base_ns, done, slot, bound_slot=None):
            if child == "fails":
                slices = [(slices[0][0], slices[0][0] + 10)]  # not a list of events: the child exits 1
            return real(src, slices, base_ns, done, slot, None)  # "late": the bound never read

        monkeypatch.setattr(loader, "_fork_decode", fork)
    parent = _spy(monkeypatch, "_decode_slices", lambda a, r: (len(a[1]), r.n_slices))
    trace = loader._load_chunked(path, buf, workers=2)
    assert_same(default, trace)
    n = len(loader._Plan(buf).slices)
    assert n == 9
    t = parent[0][0]  # the tail: half of what the child had not started when the parent looked
    assert 1 <= t <= n // 2 and parent[0] == (t, t)
    if child == "ok":  # the child stopped where the parent's part begins
        assert parent == [(t, t)]
    elif child == "late":  # the parent's slices dropped: the child had done all of them
        assert parent == [(t, t), (0, 0)]
    else:  # the child's slices decoded here after the parent's
        assert parent == [(t, t), (n - t, n - t)]


@pytest.mark.parametrize("case", ["small", "cut", "list", "one_worker"])
def test_start_decode_starts_nothing_where_the_load_would_not_fork(case, monkeypatch, fork_allowed):
    """A document under the chunked size, one cut short by its gzip stream, a legacy top-level
    list, or one worker: nothing is forked early (the load does all of it, as before)."""
    path = str(shared_trace("hta/trace_diff/control.json.gz"))
    buf, _ = read_bytes_partial(path)
    monkeypatch.setattr(loader, "CHUNK_BYTES", MiB)
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", MiB if case != "small" else len(buf) + 1)
    monkeypatch.setenv("DIAGNOSE_WORKERS", "1" if case == "one_worker" else "2")
    forks = _spy(monkeypatch, "_fork_decode")
    doc = b"[" + buf + b"]" if case == "list" else buf
    assert loader.start_decode(doc, "gzip stream cut" if case == "cut" else None) is None
    assert forks == []


# 2. synthetic documents -------------------------------------------------------------------
def test_odd_typed_ids_in_one_slice(kineto, monkeypatch, fork_allowed):
    b = _synthetic(kineto)
    ev = next(e for e in b.events if e["name"] == "kernel_20")
    ev["args"].update({"correlation": 3.0, "External id": "12", "stream": "9"})
    buf = json.dumps(b.doc()).encode()
    with pytest.raises(msgspec.ValidationError):  # the whole document is not strict-clean
        loader._strict_doc_dec.decode(buf)
    whole = loader.load_kineto("odd.json", buf=buf)

    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    strict_flags = _spy(monkeypatch, "_decode_slice", lambda a, r: r[1])
    for workers in (1, 3):
        chunked = loader._load_chunked("odd.json", buf, workers=workers)
        assert chunked is not None
        assert_same(whole, chunked)
    # workers=1 ran every slice here: exactly one (the odd one) needed the lenient schema
    assert len(strict_flags) >= 5 and strict_flags.count(False) == 1

    row = whole.gpu[whole.gpu["name"] == "kernel_20"].iloc[0]
    assert (row["correlation"], row["external_id"], row["stream"]) == (3, 12, 9)
    assert (row["start_ns"], row["end_ns"]) == (2_020_250, 2_050_250)
    other = whole.gpu[whole.gpu["name"] == "kernel_21"].iloc[0]
    assert (other["correlation"], other["external_id"], other["stream"]) == (1022, -1, 7)
    assert len(whole.gpu) == 40 and len(whole.runtime) == 40 and len(whole.cpu_ops) == 40


BASE_NS = 1_700_000_000_000_000_000


def _tail_keys_text(kineto) -> str:
    events = _synthetic(kineto, n=30).events
    return ('{"schemaVersion": 1, "traceEvents": ' + json.dumps(events)
            + f', "baseTimeNanoseconds": {BASE_NS}, "traceName": "run]1 [x]"' + "}")


def _expected_kernel_starts(n: int) -> list[int]:
    return [BASE_NS + (100 * i + 20) * 1000 + 250 for i in range(n)]


def test_locate_events_reads_keys_after_the_array(kineto, monkeypatch):
    text = _tail_keys_text(kineto)
    buf = text.encode()
    top, lb, rb = loader._locate_events(buf)
    assert set(top) == {"schemaVersion", "baseTimeNanoseconds", "traceName"}
    assert msgspec.json.decode(top["traceName"]) == "run]1 [x]"
    assert msgspec.json.decode(top["baseTimeNanoseconds"]) == BASE_NS
    assert lb == text.index("[", text.index('"traceEvents"'))
    assert rb == text.index('], "baseTimeNanoseconds"')
    assert len(msgspec.json.decode(buf[lb:rb + 1])) == 120

    whole = loader.load_kineto("tail.json", buf=buf)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1500)
    chunked = loader._load_chunked("tail.json", buf, workers=1)
    assert chunked is not None
    assert_same(whole, chunked)
    assert chunked.metadata["traceName"] == "run]1 [x]"
    assert chunked.gpu["start_ns"].tolist() == _expected_kernel_starts(30)
    assert chunked.gpu["end_ns"].tolist() == [s + 30_000 for s in _expected_kernel_starts(30)]
    assert chunked.cpu_ops["start_ns"].tolist()[:3] == [BASE_NS, BASE_NS + 100_000, BASE_NS + 200_000]


@pytest.mark.parametrize("head", [
    '{"note\\"traceEvents": [1, 2], ',          # the text "traceEvents": [ inside an earlier key string
    '{"metadata": {"traceEvents": [1, 2]}, ',   # ... as a key of an earlier nested object
    '{"schemaVersion": 1, "x": {"y": 2, "traceEvents": [3]}, ',
])
def test_locate_events_gives_up_on_an_earlier_match(kineto, monkeypatch, head):
    events = _synthetic(kineto, n=30).events
    text = head + '"traceEvents": ' + json.dumps(events) + f', "baseTimeNanoseconds": {BASE_NS}' + "}"
    buf = text.encode()
    json.loads(text)  # the fixture is valid JSON
    assert loader._locate_events(buf) is None
    whole = loader.load_kineto("head.json", buf=buf)
    assert whole.gpu["start_ns"].tolist() == _expected_kernel_starts(30)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1500)
    chunked = loader._load_chunked("head.json", buf, workers=1)  # via the dict[str, Raw] split
    assert chunked is not None
    assert_same(whole, chunked)
    assert chunked.gpu["start_ns"].tolist() == _expected_kernel_starts(30)
    assert chunked.metadata["baseTimeNanoseconds"] == BASE_NS


def test_array_after_the_events_still_loads(kineto, monkeypatch, fork_allowed):
    events = _synthetic(kineto, n=30).events
    text = '{"traceEvents": ' + json.dumps(events) + f', "baseTimeNanoseconds": {BASE_NS}, "INFO": ["a", "b"]' + "}"
    buf = text.encode()
    whole = loader.load_kineto("info.json", buf=buf)
    assert whole.gpu["start_ns"].tolist() == _expected_kernel_starts(30)
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1500)
    monkeypatch.setattr(loader, "workers_default", lambda: 2)
    assert_same(whole, loader.load_kineto("info.json", buf=buf))


def test_locate_events_end_of_array_before_a_trailing_list(kineto):
    events = _synthetic(kineto, n=30).events
    text = '{"traceEvents": ' + json.dumps(events) + ', "INFO": ["a", "b"]}'
    located = loader._locate_events(text.encode())
    assert located is not None
    assert located[2] == text.index('], "INFO"')


def test_metadata_keys_equal_on_every_path(kineto, monkeypatch):
    buf = json.dumps(_synthetic(kineto, n=30, record_shapes=1, traceName=None, my_run={"id": 7}).doc()).encode()
    whole = loader.load_kineto("meta.json", buf=buf)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 1500)
    chunked = loader._load_chunked("meta.json", buf, workers=1)
    assert chunked.metadata == whole.metadata


def test_cpu_ops_order_with_mixed_categories(kineto, monkeypatch):
    b = _synthetic(kineto, n=40)
    for e in b.events:
        if e["cat"] == "cpu_op" and int(e["name"][2:]) % 2:
            e["cat"] = "Operator"  # PyTorch 1.8/1.9 spelling, same bucket
    buf = json.dumps(b.doc()).encode()
    whole = loader.load_kineto("mixed.json", buf=buf)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    chunked = loader._load_chunked("mixed.json", buf, workers=1)
    assert chunked.cpu_ops["name"].tolist() == whole.cpu_ops["name"].tolist()


def _synthetic_buf(kineto) -> bytes:
    return json.dumps(_synthetic(kineto).doc()).encode()


def _check_synthetic(t) -> None:
    assert [len(getattr(t, f)) for f in FRAMES] == [40, 40, 40, 40, 0, 0]
    assert t.gpu["name"].tolist() == [f"kernel_{i}" for i in range(40)]
    assert t.gpu["correlation"].tolist() == list(range(1001, 1041))
    assert t.gpu["start_ns"].tolist() == [(100 * i + 20) * 1000 + 250 for i in range(40)]


def test_forked_workers_equal_one_worker(kineto, monkeypatch, fork_allowed):
    buf = _synthetic_buf(kineto)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    one = loader._load_chunked("s.json", buf, workers=1)
    _check_synthetic(one)
    parent_decodes = _spy(monkeypatch, "_decode_slices")
    forks = _spy(monkeypatch, "_fork_decode", lambda a, r: r[0])
    three = loader._load_chunked("s.json", buf, workers=3)
    assert len(forks) == 3 and os.getpid() not in forks
    assert parent_decodes == []  # every share came back from its child
    assert_same(one, three)


def test_no_fork_while_other_threads_run(kineto, monkeypatch):
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    buf = _synthetic_buf(kineto)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    one = loader._load_chunked("s.json", buf, workers=1)
    forks = _spy(monkeypatch, "_fork_decode")
    parent_decodes = _spy(monkeypatch, "_decode_slices")
    monkeypatch.setenv("DIAGNOSE_WORKERS", "3")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert threading.active_count() >= 2
        assert loader.workers_default() == 1
        three = loader._load_chunked("s.json", buf, workers=3)
    finally:
        stop.set()
        t.join()
    assert forks == [] and len(parent_decodes) == 1
    assert_same(one, three)
    _check_synthetic(three)


def test_fork_failure_decodes_in_parent(kineto, monkeypatch, fork_allowed):
    buf = _synthetic_buf(kineto)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    one = loader._load_chunked("s.json", buf, workers=1)
    attempts = []

    def no_fork():
        attempts.append(1)
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(loader.os, "fork", no_fork)
    parent_decodes = _spy(monkeypatch, "_decode_slices")
    three = loader._load_chunked("s.json", buf, workers=3)
    assert len(attempts) == 3 and len(parent_decodes) == 3
    assert_same(one, three)
    _check_synthetic(three)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_fork_failure_leaks_no_descriptors(kineto, monkeypatch, fork_allowed):
    buf = _synthetic_buf(kineto)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(loader.os, "fork", no_fork)
    before = len(os.listdir("/proc/self/fd"))
    loader._load_chunked("s.json", buf, workers=3)
    assert len(os.listdir("/proc/self/fd")) == before


def test_child_failure_is_redone_in_parent(kineto, monkeypatch, fork_allowed, tmp_path):
    buf = _synthetic_buf(kineto)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    one = loader._load_chunked("s.json", buf, workers=1)
    marker = tmp_path / "children"

    def failing_dumps(*_a, **_k):  # runs in the children (they inherit the patch)
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")
        raise pickle.PicklingError("boom")

    monkeypatch.setattr(pickle, "dumps", failing_dumps)  # the workers (forked) inherit the patch
    parent_decodes = _spy(monkeypatch, "_decode_slices")
    three = loader._load_chunked("s.json", buf, workers=3)
    pids = marker.read_text().split()
    assert len(pids) == 3 and str(os.getpid()) not in pids
    assert len(parent_decodes) == 3
    assert_same(one, three)
    _check_synthetic(three)


def test_worker_columns_travel_out_of_band_and_a_cut_stream_is_none(kineto):
    """A worker's columns state goes through the pipe as a pickle plus each array's bytes
    (``send_state``), and comes back equal (``receive_state``); a stream cut anywhere gives None
    (the parent then decodes that share itself)."""
    import io

    from diagnose.trace.workerpipe import receive_state, send_state

    buf = _synthetic_buf(kineto)
    plan = loader._Plan(buf)
    state = loader._decode_slices(plan.src, plan.slices, plan.base_ns).state()
    out = io.BytesIO()
    send_state(out, state)
    data = out.getvalue()
    assert len(data) < len(pickle.dumps(state, protocol=5)) + 8 * 64
    back = receive_state(io.BytesIO(data))
    assert pickle.dumps(back, protocol=5) == pickle.dumps(state, protocol=5)
    for cut in (0, 4, 8, 20, len(data) // 2, len(data) - 1):
        assert receive_state(io.BytesIO(data[:cut])) is None


def test_cut_inside_a_string_falls_back(kineto, monkeypatch, fork_allowed):
    b = _synthetic(kineto)
    next(e for e in b.events if e["name"] == "kernel_25")["name"] = "a},{b"
    buf = json.dumps(b.doc()).encode()
    whole = loader.load_kineto("cut.json", buf=buf)
    assert whole.gpu["name"].tolist()[25] == "a},{b"
    assert len(whole.gpu) == 40

    located = loader._locate_events(buf)
    lb = located[1]
    inside = buf.index(b"a},{b") + 1
    # the first cut is searched from lb + 1 + CHUNK_BYTES: put that on the "a" of the name
    monkeypatch.setattr(loader, "CHUNK_BYTES", inside - 1 - (lb + 1))
    slices = loader._slices(memoryview(buf), lb, located[2])
    assert slices[0][1] == inside + 1  # the cut is inside the string
    assert loader._load_chunked("cut.json", buf, workers=1) is None
    assert loader._load_chunked("cut.json", buf, workers=2) is None  # failed child, failed redo

    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 0)
    tried = _spy(monkeypatch, "_load_chunked", lambda a, r: r is not None)
    for workers in (1, 2):
        monkeypatch.setattr(loader, "workers_default", lambda w=workers: w)
        assert_same(whole, loader.load_kineto("cut.json", buf=buf))
    assert tried == [False, False]


def test_broken_event_same_error_on_every_path(kineto, monkeypatch, fork_allowed):
    text = _synthetic_buf(kineto).decode().replace('"name": "kernel_25"', '"name": "kernel_25" "x"', 1)
    pos = text.index('"x"')
    buf = text.encode()
    with pytest.raises(TraceFormatError) as whole:
        loader.load_kineto("broken.json", buf=buf)
    assert f"invalid JSON at byte {pos:,} (line 1, column {pos + 1})" in str(whole.value)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    assert loader._load_chunked("broken.json", buf, workers=1) is None
    monkeypatch.setattr(loader, "CHUNKED_MIN_BYTES", 0)
    for workers in (1, 3):
        monkeypatch.setattr(loader, "workers_default", lambda w=workers: w)
        with pytest.raises(TraceFormatError) as chunked:
            loader.load_kineto("broken.json", buf=buf)
        assert str(chunked.value) == str(whole.value)


def _begin_end_doc(kineto) -> dict:
    """The synthetic trace with its annotations written as B/E pairs: the begins in place,
    every end at the end of the document (so that pairs straddle slices and workers), plus
    one end without a begin; and a python_function event."""
    b = _synthetic(kineto, n=20)
    ends = []
    for e in b.events:
        if e["cat"] == "user_annotation":
            e["ph"] = "B"
            ends.append({"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e.pop("dur")})
    ends.append({"ph": "E", "pid": 100, "tid": 999, "ts": 3.0})
    b.events += ends
    b.events.append({"ph": "X", "cat": "python_function", "name": "f", "pid": 100, "tid": 100, "ts": 3, "dur": 1.5})
    return b.doc()


def _merged_doc(kineto) -> dict:
    """Two ranks in one file, SGLang ProfileMerger style (pids "[LABEL] pid", same ids)."""
    events = []
    for label in ("TP00-DP00-PP00-EP00", "TP01-DP00-PP00-EP00"):
        for e in _synthetic(kineto, n=20).events:
            events.append({**e, "pid": f"[{label}] {e['pid']}"})
        events.append({"ph": "X", "cat": "python_function", "name": "f", "pid": f"[{label}] 100", "tid": 100, "ts": 3, "dur": 1.5})
    return {"schemaVersion": 1, "traceEvents": events}


def _odd_inputs(kineto) -> dict[str, bytes]:
    b = _synthetic(kineto, n=20)
    doc = json.dumps(b.doc()).encode()
    xpu = b.doc()
    for e in xpu["traceEvents"]:
        if e["cat"] == "cuda_runtime":
            e["cat"] = "xpu_runtime"
    return {
        "legacy_list": json.dumps(b.events).encode(),
        "invalid_utf8": doc.replace(b"kernel_3", b"kern\xff_3"),
        "json_cut": doc[:len(doc) * 2 // 3],
        "decimal_comma": doc.replace(b'"stream": 7, "correlation": 1001', b'"stream": 7, "x": 0,5, "correlation": 1001', 1),
        "string_id": doc.replace(b'"correlation": 1005', b'"correlation": "1005"'),
        "out_of_range": doc.replace(b'"ts": 1220.25', b'"ts": 1e400', 1),
        "bad_value": doc.replace(b'"ts": 1320.25, "dur": 30', b'"ts": 1320.25, "dur": "abc"', 1),
        "missing_dur": doc.replace(b'"ts": 1420.25, "dur": 30, ', b'"ts": 1420.25, ', 1),
        "begin_end": json.dumps(_begin_end_doc(kineto)).encode(),
        "merged_ranks": json.dumps(_merged_doc(kineto)).encode(),
        "xpu_runtime": json.dumps(xpu).encode(),
    }


# (quality codes, gpu rows) of the whole-document path, lenient=False / lenient=True
ODD_EXPECTED = {
    "legacy_list": ((["legacy_event_list"], 20), (["legacy_event_list"], 20)),
    "invalid_utf8": ((["invalid_text_repaired", "invalid_utf8_names"], 20), (["invalid_text_repaired", "invalid_utf8_names"], 20)),
    "json_cut": ((["truncated"], 13), (["truncated"], 13)),
    "decimal_comma": ("decimal comma", (["decimal_comma_repaired"], 20)),
    "string_id": (([], 20), ([], 20)),
    "out_of_range": ((["out_of_range_value"], 19), (["out_of_range_value"], 19)),
    "bad_value": ((["bad_value"], 19), (["bad_value"], 19)),
    "missing_dur": ((["missing_duration"], 19), (["missing_duration"], 19)),
    "begin_end": ((["unmatched_begin_end"], 20), (["unmatched_begin_end"], 20)),
    "merged_ranks": ((["ranks_merged"], 40), (["ranks_merged"], 40)),
    "xpu_runtime": (([], 20), ([], 20)),
}


#: Odd inputs whose every-path check stays in the inner loop; the others are marked slow.
FAST_ODD_CASES = {"begin_end", "invalid_utf8", "json_cut"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c in FAST_ODD_CASES else pytest.mark.slow)
                                  for c in sorted(ODD_EXPECTED)])
def test_odd_inputs_same_on_every_path_and_buffer_type(kineto, monkeypatch, fork_allowed, case):
    """bytes or bytearray (load_kineto accepts both from callers), whole-document or
    forced chunking on 1 or 2 workers: one result, or one error."""
    buf = _odd_inputs(kineto)[case]

    def load(lenient):
        try:
            return loader.load_kineto("odd.json", buf=buf_kind(buf), lenient=lenient)
        except TraceFormatError as e:
            return str(e)

    for lenient, expected in zip((False, True), ODD_EXPECTED[case]):
        buf_kind = bytes
        ref = load(lenient)
        if isinstance(expected, str):
            assert isinstance(ref, str) and expected in ref
        else:
            assert ([q.code for q in ref.quality], len(ref.gpu)) == expected
        results = []
        buf_kind = bytearray
        results.append(load(lenient))
        with monkeypatch.context() as m:
            m.setattr(loader, "CHUNKED_MIN_BYTES", 0)
            m.setattr(loader, "CHUNK_BYTES", 1000)
            for workers in (1, 2):
                m.setattr(loader, "workers_default", lambda w=workers: w)
                for buf_kind in (bytes, bytearray):
                    results.append(load(lenient))
        for r in results:
            if isinstance(ref, str):
                assert r == ref
            else:
                assert_same(ref, r)
    if case == "string_id":
        assert ref.gpu.loc[ref.gpu["name"] == "kernel_4", "correlation"].tolist() == [1005]
    if case == "begin_end":  # ann{i}: 70 µs from 100 i µs, as the X events were
        assert ref.annotations["name"].tolist() == [f"ann{i}" for i in range(20)]
        assert (ref.annotations["end_ns"] - ref.annotations["start_ns"]).tolist() == [70_000] * 20
        assert ref.counts == {"python_function": 1, "python_function_ns": 1500}
    if case == "merged_ranks":  # rank r's ids are r << 40 | id
        assert ref.ranks == ["TP00-DP00-PP00-EP00", "TP01-DP00-PP00-EP00"]
        assert ref.gpu.groupby("rank")["correlation"].min().tolist() == [1001, (1 << 40) | 1001]
        assert ref._rank_counts == {lab: {"python_function": 1, "python_function_ns": 1500} for lab in ref.ranks}
    if case == "xpu_runtime":
        assert ref.runtime["api_kind"].tolist() == ["launch"] * 20


# 3. reading: sniff and Prefetch -----------------------------------------------------------
def test_sniff(tmp_path, kineto):
    js = kineto().write(tmp_path / "t.json")
    gz = kineto().write(tmp_path / "t.json", gz=True)
    db = tmp_path / "report.sqlite"
    db.write_bytes(reading.SQLITE_MAGIC + b"\x10\x00" * 50)
    noext = tmp_path / "exported"
    noext.write_bytes(reading.SQLITE_MAGIC)
    rep = tmp_path / "report1.nsys-rep"
    rep.write_bytes(b"not sqlite, not json")
    fake = tmp_path / "fake.sqlite"
    fake.write_text('{"traceEvents": []}')
    assert len(reading.SQLITE_MAGIC) == 16
    assert [sniff(str(p)) for p in (js, gz, db, noext, rep)] == ["kineto", "kineto", "nsys-sqlite", "nsys-sqlite", "nsys-rep"]
    with pytest.raises(TraceFormatError, match="not an SQLite database"):
        sniff(str(fake))
    with pytest.raises(TraceFormatError, match="no such file"):
        sniff(str(tmp_path / "missing.json"))
    with pytest.raises(TraceFormatError, match="is a directory"):
        sniff(str(tmp_path))


def _big_json() -> bytes:
    return json.dumps({"traceEvents": [{"ph": "X", "name": f"k{i}", "ts": i * 7.25, "dur": i % 13} for i in range(20000)]}).encode()


def test_prefetch_equals_read_bytes_partial(tmp_path):
    data = _big_json()
    compressed = gzip.compress(data, mtime=0)
    half = len(compressed) // 2
    plain, gz, cut = tmp_path / "t.json", tmp_path / "t.json.gz", tmp_path / "cut.json.gz"
    plain.write_bytes(data)
    gz.write_bytes(compressed)
    cut.write_bytes(compressed[:half])
    got = {}
    for p in (plain, gz, cut):
        got[p] = Prefetch(str(p)).result()
        assert got[p] == read_bytes_partial(str(p))
    assert got[plain] == (data, None)
    assert got[gz] == (data, None)
    part, why = got[cut]
    recovered = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(compressed[:half])
    assert part == recovered and 0 < len(part) < len(data) and data.startswith(part)
    assert why == f"gzip stream cut short after {half:,} compressed bytes ({len(part):,} bytes recovered)"


def test_cut_gzip_is_read_without_a_buffer_sized_from_garbage(tmp_path):
    compressed = gzip.compress(_big_json(), mtime=0)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(compressed[:len(compressed) // 2])
    assert int.from_bytes(cut.read_bytes()[-4:], "little") > 2**30  # "ISIZE" read from the middle of the stream
    tracemalloc.start()
    try:
        part, why = read_bytes_partial(str(cut))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert why is not None and len(part) > 100_000
    assert peak < 64 * MiB


def test_prefetch_errors_and_single_handover(tmp_path):
    missing = str(tmp_path / "missing.json.gz")
    with pytest.raises(TraceFormatError) as direct:
        read_bytes_partial(missing)
    pf = Prefetch(missing)
    with pytest.raises(TraceFormatError) as pre:
        pf.result()
    assert str(pre.value) == str(direct.value) == f"{missing}: no such file"

    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": []}')
    pf = Prefetch(str(p))
    assert pf.result() == (b'{"traceEvents": []}', None)
    with pytest.raises(RuntimeError, match="called twice"):
        pf.result()


def test_load_trace_with_prefetch_of_a_truncated_gzip(tmp_path, kineto):
    data = json.dumps(_synthetic(kineto, n=400).doc()).encode()
    compressed = gzip.compress(data)
    p = tmp_path / "cut.json.gz"
    p.write_bytes(compressed[:len(compressed) * 3 // 4])
    from diagnose.trace import load_trace

    a = load_trace(str(p))
    b = load_trace(str(p), prefetch=Prefetch(str(p)))
    assert a.partial and b.partial
    assert_same(a, b)
    assert "truncated" in {q.code for q in a.quality}
    assert 0 < len(a.gpu) < 400


# 4. command line --------------------------------------------------------------------------
def _cli_params():
    return ["synthetic", pytest.param("tracelens/vllm_decode_full/graph_execution.json.gz", id="vllm_decode_full")]


@pytest.mark.parametrize("which", _cli_params())
def test_cli_run_json_equals_run_analysis(which, tmp_path, kineto, monkeypatch):
    if which == "synthetic":
        path = str(_synthetic(kineto, n=50).write(tmp_path / "t.json", gz=True))
    else:
        path = str(shared_trace(which))
    with open(path, "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    analysis = run_analysis(path)
    attach_verdicts(analysis)
    expected = json.loads(to_json(analysis.to_dict()))

    handed = _spy_prefetch(monkeypatch)
    r = CliRunner().invoke(main, ["run", "--trace", path, "--format", "json"])
    assert r.exit_code == 0, r.output
    assert handed == [path]  # the CLI read the file on its prefetch thread
    got = json.loads(r.output)
    assert got == expected
    assert got["phases"] and got["source"]["path"] == path


def _spy_prefetch(monkeypatch) -> list:
    real = reading.Prefetch.result
    handed: list = []

    def result(self):
        handed.append(self.path)
        return real(self)

    monkeypatch.setattr(reading.Prefetch, "result", result)
    return handed


def test_cli_help_lists_every_command():
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0
    listed = [line.split()[0] for line in r.output.split("Commands:")[1].splitlines() if line.startswith("  ")]
    assert listed == ["bounds", "collect", "compare", "gate", "kv-budget", "rules", "run", "serve", "sweep", "whatif"]


@pytest.mark.parametrize("cmd, expect", [
    (["bounds", "--help"], "Analytic lower bounds"),
    (["rules", "--help"], "Symptom rules"),
])
def test_cli_subcommand_help(cmd, expect):
    r = CliRunner().invoke(main, cmd)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Usage: ") and f" {cmd[0]} " in r.output.splitlines()[0]
    assert expect in r.output


@pytest.mark.parametrize("sep", [None, b","])
def test_op_arguments_read_together_equal_field_by_field(sep, monkeypatch):
    """``_Raw.raw_args`` (an op's dims, types and concrete inputs joined into one key) gives
    each field's values as ``raw_arg`` does; a separator found inside a value (forced here with
    ",") takes the field-by-field path."""
    from diagnose.trace import kineto_columns as kc

    path = shared_trace("hta/trace_diff/control.json.gz")
    buf, _ = read_bytes_partial(str(path))
    top, lb, rb = loader._locate_events(buf)
    events, strict = loader._decode_slice(buf[lb:rb + 1])
    assert strict
    ops = kc._group(events, strict)[0]["op"]
    raw = kc._Raw(ops, strict)
    if sep is not None:
        monkeypatch.setattr(kc, "_RAW_SEP", sep)
    fields = ("input_dims", "input_types", "concrete_inputs")
    together = raw.raw_args(fields)
    for field, got in zip(fields, together):
        want = raw.raw_arg(field)
        assert got.uniques.tolist() == want.uniques.tolist()
        assert (got.codes == want.codes).all() and got.codes.dtype == want.codes.dtype
    dims = together[0]
    assert len(ops) == 40506 and len(dims.uniques) == 1217
    assert dims.uniques[dims.codes[5]] == b"[[], [], [], [], []]"


def test_coded_columns_merge_in_first_seen_order():
    """Parts of a coded column (one per slice) merge into one: distinct values in first-seen
    order over the parts, None a value like any other, each row's value kept."""
    import numpy as np

    from diagnose.trace.kineto_columns import _code, _concat_coded

    parts = [["b", None, "a", "b"], [], ["c", "a", None], ["a"]]
    got = _concat_coded([_code(p) for p in parts])
    assert got.uniques.tolist() == ["b", None, "a", "c"]
    assert got.codes.dtype == np.int32 and got.codes.tolist() == [0, 1, 2, 0, 3, 2, 1, 2]
    assert got.uniques[got.codes].tolist() == [v for p in parts for v in p]
    raw = [[b"[[1]]", b"[]"], [b"[]", b"[[2, 3]]"]]
    got = _concat_coded([_code(p) for p in raw])
    assert got.uniques.tolist() == [b"[[1]]", b"[]", b"[[2, 3]]"] and got.codes.tolist() == [0, 1, 1, 2]
