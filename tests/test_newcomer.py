"""Issue 27's smaller items, each checked on real traces and variants: PyTorch <= 1.9 traces
say why they have no phase, `rules list` has a header row, `bounds` defaults the KV cache to
the model's dtype."""
from __future__ import annotations

import gzip
import io
import json
import os
import tarfile

import pytest
from click.testing import CliRunner

from conftest import ROOT, shared_trace
from diagnose.cli import main
from diagnose.pipeline import run_analysis


def _notes(a, code):
    return [q.message for q in a.quality if q.code == code]


# ------------------------------------------------------------------ PyTorch <= 1.9 traces


@pytest.mark.parametrize("rel", [
    "kineto-tb-plugin/resnet50_num_workers_0_pt1.9/worker0.1623143089861.pt.trace.json.gz",
    pytest.param("kineto-tb-plugin/resnet50_num_workers_0_pt1.8/worker0.pt.trace.json.gz", marks=pytest.mark.slow)])
def test_pt19_training_traces_say_training_by_their_legacy_backward_names(rel):
    """PyTorch 1.8/1.9 name backward work by its autograd node (`CudnnConvolutionBackward`) and
    aten op (`aten::nll_loss_backward`), with no `autograd::engine::evaluate_function` range:
    the two ResNet-50 training traces are training traces; their six ProfilerStep ranges are
    timed, with no phase."""
    a = run_analysis(str(shared_trace(rel)))
    (msg,) = _notes(a, "training_trace")
    assert "autograd backward ops" in msg and "e.g. 'aten::nll_loss_backward'" in msg
    assert not _notes(a, "phase_unknown") and len(a.steps) == 6 and set(a.steps["phase"]) == {"unknown"}


def _legacy_without_backward(tmp_path):
    """The PyTorch 1.8 ResNet-50 trace with every backward op, backward kernel and optimizer
    range removed: a legacy trace (operators in category "Operator", ProfilerStep#N among
    them) with no marker and no telling shape."""
    doc = json.loads(gzip.decompress(shared_trace(
        "kineto-tb-plugin/resnet50_num_workers_0_pt1.8/worker0.pt.trace.json.gz").read_bytes()))
    import re

    bw = re.compile(r"(_backward|Backward\d*$|^Optimizer\.)")
    bwk = re.compile(r"wgrad|dgrad|bn_bw|backward|updateGradInput", re.I)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (e.get("cat") == "Operator" and bw.search(str(e.get("name"))))
                          and not (e.get("cat") == "Kernel" and bwk.search(str(e.get("name"))))]
    p = tmp_path / "pt18_no_backward.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.slow  # rewrites and analyses a 33k-operator trace
def test_legacy_trace_without_markers_says_why(tmp_path):
    """Its ProfilerStep#N operators are the steps; without the backward pass it is a ResNet
    forward: convolutions outweigh the GEMMs, a vision forward, which is why no phase is read."""
    a = run_analysis(str(_legacy_without_backward(tmp_path)))
    assert a.steps["name"].tolist() == [f"ProfilerStep#{i}" for i in range(5, 11)]
    assert set(a.steps["phase"]) == {"unknown"} and not _notes(a, "training_trace")
    (msg,) = _notes(a, "vision_forward")
    assert msg.startswith("a convolutional (vision) forward: convolution kernels take")
    # (PyTorch 1.8 writes its shapes as "Input dims", which the loader does not read: no shapes here)


def test_no_operators_and_no_shapes_say_so(kineto, tmp_path):
    # a step marker without a phase (ProfilerStep) over kernels and launches only
    b = kineto()
    b.annotation("ProfilerStep#1", 0, 40)
    b.launch("gemm", 10, 10, launch_ts=0)
    msg = _notes(run_analysis(str(b.write(tmp_path / "no_ops.json"))), "phase_unknown")
    assert msg and "the trace holds no CPU operators, so no shapes to read a phase from" in msg[0]
    # operators recorded without shapes (record_shapes=False)
    b = kineto()
    b.annotation("ProfilerStep#1", 0, 40)
    b.cpu_op("aten::linear", 0, 30)
    b.launch("gemm", 10, 10, launch_ts=5)
    msg = _notes(run_analysis(str(b.write(tmp_path / "no_shapes.json"))), "phase_unknown")
    assert msg and "its operators carry no 'Input Dims' shapes (torch.profiler records them with record_shapes=True)" in msg[0]
    # no step at all: one line on what to capture
    b = kineto()
    b.launch("gemm", 10, 10, launch_ts=0)
    msg = _notes(run_analysis(str(b.write(tmp_path / "no_step.json"))), "no_steps")
    assert msg and "with_stack=True" in msg[0]


def _legacy_op(b, name, ts, dur, input_dims=None):
    args = {"Device": 100, "External id": len(b.events)}
    if input_dims is not None:
        args["Input dims"] = input_dims  # PyTorch 1.8 spelling
    b.events.append({"ph": "X", "cat": "Operator", "name": name, "pid": 100, "tid": 100, "ts": ts, "dur": dur, "args": args})


def test_legacy_step_markers_written_as_operators_are_steps(kineto, tmp_path):
    """PyTorch <= 1.9 records record_function ranges (a serving engine's step markers) as
    operators: they are read as steps when no annotation is one."""
    b = kineto()
    _legacy_op(b, "ProfilerStep#3", 0, 1000)
    _legacy_op(b, "execute_context_1(128)_generation_0(0)", 10, 300)
    b.launch("gemm_prefill", 400, 200, launch_ts=20)
    _legacy_op(b, "execute_context_0(0)_generation_1(1)", 500, 100)
    b.launch("gemm_decode", 700, 50, launch_ts=510)
    a = run_analysis(str(b.write(tmp_path / "legacy_markers.json")))
    assert a.steps[["name", "phase", "grammar"]].values.tolist() == [
        ["execute_context_1(128)_generation_0(0)", "prefill", "vllm-v1-context"],
        ["execute_context_0(0)_generation_1(1)", "decode", "vllm-v1-context"]]
    assert not _notes(a, "phase_unknown")


def test_legacy_profiler_steps_are_shape_windows(kineto, tmp_path):
    """Without markers, ProfilerStep#N operators (PyTorch <= 1.9) are the windows whose shapes
    give the phase, one step each, as ProfilerStep annotations are in later versions."""
    b = kineto()
    for i, (s, phase_dims) in enumerate(((0, [[2, 64, 512], [512, 512]]), (2000, [[2, 1, 512], [512, 512]]))):
        _legacy_op(b, f"ProfilerStep#{i + 1}", s, 1000)
        b.cpu_op("aten::linear", s + 10, 100, input_dims=phase_dims)
        b.launch("gemm", s + 200, 100, launch_ts=s + 20)
    a = run_analysis(str(b.write(tmp_path / "legacy_steps.json")))
    assert a.steps[["name", "phase", "evidence"]].values.tolist() == [
        ["ProfilerStep#1", "prefill", "profiler_step"], ["ProfilerStep#2", "decode", "profiler_step"]]
    assert _notes(a, "phases_from_shapes") and "profiler step evidence" in _notes(a, "phases_from_shapes")[0]


# ------------------------------------------------------------------ rules list


def test_rules_list_has_a_header_row():
    out = CliRunner().invoke(main, ["rules", "list"]).output.splitlines()
    assert out[0].split() == ["rule", "symptom", "severity", "scope", "title", "[thresholds]"]
    first = out[1]
    assert first.startswith("S1-throughput-flat-with-batch") and first.index("S1 ") == out[0].index("symptom")
    assert out[0].index("severity") == first.index("high")
    # --scope filters rows, not the header
    metrics = CliRunner().invoke(main, ["rules", "list", "--scope", "metrics"]).output.splitlines()
    assert metrics[0].startswith("rule ") and [line.split()[0] for line in metrics[1:]] == [
        "S6-perplexity-up", "speculative-acceptance-low"]


# ------------------------------------------------------------------ bounds: KV dtype


def _bounds_json(*args):
    r = CliRunner().invoke(main, ["bounds", "--gpu", "H100-SXM", "--batch", "1", "--prompt-len", "512", "--format", "json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_bounds_kv_cache_defaults_to_the_models_dtype(tmp_path):
    """`bounds` takes the KV-cache dtype from the config's torch_dtype / dtype (what serving
    engines do with kv_cache_dtype "auto"), not a fixed fp16."""
    m = _bounds_json("--model-config", "llama-3.1-8b")["model"]  # torch_dtype bfloat16
    assert (m["kv_dtype"], m["kv_dtype_source"], m["kv_bytes_per_token"]) == ("bf16", "config torch_dtype", 131_072)
    from diagnose.accounting import read_model_config

    base, _ = read_model_config("llama-3.1-8b")
    fp32 = dict(base, torch_dtype="float32")
    p = tmp_path / "fp32.json"
    p.write_text(json.dumps(fp32))
    m = _bounds_json("--model-config", str(p))["model"]
    assert (m["kv_dtype"], m["kv_bytes_per_token"]) == ("fp32", 262_144)  # 2 * 32 layers * 8 heads * 128 * 4 B
    newer = {k: v for k, v in base.items() if k != "torch_dtype"} | {"dtype": "float16"}  # transformers >= 4.56 writes "dtype"
    p.write_text(json.dumps(newer))
    m = _bounds_json("--model-config", str(p))["model"]
    assert (m["kv_dtype"], m["kv_dtype_source"]) == ("fp16", "config dtype")
    none = {k: v for k, v in base.items() if k != "torch_dtype"}
    p.write_text(json.dumps(none))
    m = _bounds_json("--model-config", str(p))["model"]
    assert (m["kv_dtype"], m["kv_dtype_source"]) == ("fp16", "default (the config names no dtype)")
    # the flag wins
    m = _bounds_json("--model-config", "llama-3.1-8b", "--kv-dtype", "int8")["model"]
    assert (m["kv_dtype"], m["kv_dtype_source"], m["kv_bytes_per_token"]) == ("int8", "--kv-dtype", 65_536)


# ------------------------------------------------------------------ tar archives of traces


DLRM = "param/et_replay_tests_inputs/dlrm_kineto.tar.gz"
SAMPLE_DIR = ROOT / "samples" / "tracelens"


def _run_json(*args):
    r = CliRunner().invoke(main, ["run", *args, "--format", "json"])
    return r, (json.loads(r.output[r.output.index("{"):]) if "{" in r.output else None)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Temporary directories of the run go under tmp_path/t, to see what is left behind."""
    import tempfile

    t = tmp_path / "t"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


@pytest.mark.slow  # analyses the 8 ranks
def test_dlrm_archive_is_read_as_a_fleet_in_rank_order(private_tmp):
    """The real 8-rank DLRM archive (param's et_replay inputs): one row per rank, ranks 0-7 from
    each trace's distributedInfo, shown as archive:member, nothing left on disk."""
    path = str(shared_trace(DLRM))
    r, d = _run_json("--trace", path, "--executor", "serial")
    assert r.exit_code == 0, r.output
    assert [row["rank"] for row in d["ranks"]] == list(range(8))
    names = [row["path"] for row in d["ranks"]]
    assert names[0] == f"{path}:dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json"
    assert all(n.startswith(path + ":dlrm_kineto/worker") for n in names)
    assert [rep["source"]["path"] for rep in d["reports"]] == names
    assert d["skipped"] == [] and d["errors"] == []
    assert list(private_tmp.iterdir()) == []  # the copies are gone


def _tar(path, members, mode="w:gz"):
    """Write a tar archive: members are (name, bytes) files, or TarInfo objects for links/dirs."""
    with tarfile.open(path, mode) as tf:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tf.addfile(m)
            else:
                name, data = m
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def _sample_bytes():
    return ((SAMPLE_DIR / "vllm_decode_mi300x.json.gz").read_bytes(),
            (SAMPLE_DIR / "torch_compile_prefill_mi300x.json.gz").read_bytes())


def test_archive_members_cannot_escape_and_what_is_left_out_is_listed(tmp_path, private_tmp):
    vllm, compile_ = _sample_bytes()
    link = tarfile.TarInfo("traces/link.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    folder = tarfile.TarInfo("traces")
    folder.type = tarfile.DIRTYPE
    arch = _tar(tmp_path / "odd.tgz", [
        folder,
        ("traces/../../escaped.json.gz", vllm),     # a name that climbs out
        ("/abs/rank1.json.gz", compile_),           # an absolute name
        ("traces/README.txt", b"notes"),
        ("traces/.hidden.json", b"{}"),
        link,
    ])
    r, d = _run_json("--trace", str(arch), "--executor", "serial")
    assert r.exit_code == 0, r.output
    assert sorted(row["path"] for row in d["ranks"]) == [f"{arch}:/abs/rank1.json.gz", f"{arch}:traces/../../escaped.json.gz"]
    assert d["skipped"] == [
        {"path": f"{arch}:traces/README.txt", "why": "not a trace file name (*.json, *.json.gz, *.sqlite)"},
        {"path": f"{arch}:traces/.hidden.json", "why": "a hidden file"},
        {"path": f"{arch}:traces/link.json", "why": "a link (not followed)"},
    ]
    assert f"skipped {arch}:traces/link.json: a link (not followed)" in d["notes"]
    assert not (tmp_path.parent / "escaped.json.gz").exists() and not (tmp_path / "escaped.json.gz").exists()
    assert not os.path.exists("/abs/rank1.json.gz")
    assert list(private_tmp.iterdir()) == []
    # rank order as in --trace-dir: the vLLM sample's distributedInfo says rank 0, the other's name rank 1
    assert [(row["rank"], row["rank_source"]) for row in d["ranks"]] == [(0, "trace"), (1, "filename")]


def test_archive_bombs_and_floods_are_refused_before_copying(tmp_path, monkeypatch, private_tmp):
    import diagnose.archive as archive
    import diagnose.trace.reading as reading

    # declared sizes over the inflate limit (floor lowered to 1 MiB; 4 MiB of zeros, ~4 KB compressed)
    monkeypatch.setattr(reading, "INFLATE_FLOOR_BYTES", 2**20)
    bomb = _tar(tmp_path / "bomb.tar.gz", [("zeros.json", bytes(4 * 2**20))])
    assert bomb.stat().st_size < 20_000
    r = CliRunner().invoke(main, ["run", "--trace", str(bomb)])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "entries add up to more than 1 MB" in r.output and "decompression bomb" in r.output
    assert list(private_tmp.iterdir()) == []
    monkeypatch.setattr(reading, "INFLATE_FLOOR_BYTES", 64 * 2**20)
    # too many entries
    monkeypatch.setattr(archive, "MAX_MEMBERS", 3)
    many = _tar(tmp_path / "many.tar", [(f"r{i}.txt", b"x") for i in range(5)], mode="w")
    r = CliRunner().invoke(main, ["run", "--trace", str(many)])
    assert r.exit_code == 2 and "more than 3 entries" in r.output and r.output.count("\n") == 1


def test_not_an_archive_and_no_trace_inside_say_so(tmp_path):
    fake = tmp_path / "fake.tar.gz"
    fake.write_bytes((SAMPLE_DIR / "vllm_decode_mi300x.json.gz").read_bytes())  # gzip, but not tar
    r = CliRunner().invoke(main, ["run", "--trace", str(fake)])
    assert r.exit_code == 2 and r.output == (f"error: {fake}: not a readable tar archive (plain, gzip, bzip2 or xz); if it "
                                             "holds traces, unpack it and give them with --trace-dir\n")
    empty = _tar(tmp_path / "notes.tar.gz", [("notes.txt", b"hello")])
    r = CliRunner().invoke(main, ["run", "--trace", str(empty)])
    assert r.exit_code == 2
    assert r.output == f"error: {empty}: no trace in the archive (notes.txt (not a trace file name (*.json, *.json.gz, *.sqlite)))\n"


def test_truncated_archive_is_one_line(tmp_path, private_tmp):
    data = shared_trace(DLRM).read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    r = CliRunner().invoke(main, ["run", "--trace", str(cut)])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert r.output.startswith(f"error: {cut}: corrupt or truncated tar archive (")
    assert list(private_tmp.iterdir()) == []


def test_commands_that_take_one_trace_say_unpack_it(tmp_path):
    arch = _tar(tmp_path / "two.tar.gz", [("a.json.gz", _sample_bytes()[0]), ("b.json.gz", _sample_bytes()[1])])
    for cmd in (["gate", "--trace", str(arch)], ["compare", "--baseline", str(arch), "--candidate", str(arch)]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 2 and r.output.count("\n") == 1, (cmd, r.output)
        assert "a tar archive of traces, not one trace" in r.output and "unpack it (tar xf)" in r.output
    r = CliRunner().invoke(main, ["run", "--trace", str(arch), "--html", str(tmp_path / "x.html")])
    assert r.exit_code == 2 and "a tar archive holds one trace per rank" in r.output


# ------------------------------------------------------------------ --trace-dir: what is left out


def test_trace_dir_lists_what_it_leaves_out(tmp_path):
    vllm, compile_ = _sample_bytes()
    (tmp_path / "rank-0.json.gz").write_bytes(vllm)
    (tmp_path / "rank-1.json.gz").write_bytes(compile_)
    (tmp_path / "execution_details.json").write_bytes(
        shared_trace("tracelens/vllm_decode_full/execution_details.json").read_bytes())  # vLLM's sidecar
    (tmp_path / "notes.txt").write_text("run notes")
    (tmp_path / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "old").mkdir()
    _tar(tmp_path / "more.tar.gz", [("rank-2.json.gz", vllm)])
    r = CliRunner().invoke(main, ["run", "--trace-dir", str(tmp_path), "--executor", "serial", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [row["rank"] for row in d["ranks"]] == [0, 1]
    assert d["skipped"] == [
        {"path": str(tmp_path / "execution_details.json"), "why": "JSON without traceEvents: not a trace (a sidecar)"},
        {"path": str(tmp_path / "more.tar.gz"), "why": "a tar archive: give it with --trace to read its traces"},
        {"path": str(tmp_path / "notes.txt"), "why": "not a trace file name (*.json, *.json.gz, *.sqlite, *.nsys-rep)"},
        {"path": str(tmp_path / "old"), "why": "a directory (only files directly in --trace-dir are read)"},
    ]
    text = CliRunner().invoke(main, ["run", "--trace-dir", str(tmp_path), "--executor", "serial"]).output
    assert f"note: skipped {tmp_path / 'execution_details.json'}: JSON without traceEvents: not a trace (a sidecar)" in \
        " ".join(text.split())
    # nothing but left-out files: the error says what was there
    only = tmp_path / "only"
    only.mkdir()
    (only / "notes.txt").write_text("x")
    r = CliRunner().invoke(main, ["run", "--trace-dir", str(only)])
    assert r.exit_code == 2 and r.output == (f"error: {only}: no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep); "
                                             "left out: notes.txt (not a trace file name (*.json, *.json.gz, *.sqlite, "
                                             "*.nsys-rep))\n")
