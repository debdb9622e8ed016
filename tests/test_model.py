"""The report model (diagnose/model.py): the shipped JSON Schema is the one generated from it,
the constraints of the hand-written schema it replaced survive in it, and every golden report
decodes back into it and encodes to the same JSON."""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from diagnose import model

GOLDEN = Path(__file__).parent / "golden"

# The enums, ranges, constants and required keys of the hand-written report.schema.json
# (schema_version 2) that the generated schema replaced: (property path, keyword, value).
# "[]" is an array's items, "{}" a map's values, "{keys}" its keys.
OLD_CONSTRAINTS = [
    ('', 'required', ["schema_version", "source", "partial", "devices", "phases", "latency", "steps", "quality", "launches", "gpu", "model", "kernel_table"]),
    ('schema_version', 'const', 2),
    ('source', 'required', ["path", "format"]),
    ('source/format', 'enum', ["kineto-json", "nsys-sqlite"]),
    ('devices/[]', 'required', ["id", "name"]),
    ('phases/[]', 'required', ["name", "device", "steps", "wall_ms", "own_ms", "window_ms", "gpu_busy_ms", "gpu_idle_share", "launch_gap_share", "attention_share", "kernel_ms", "kernel_count", "activity_count", "categories_ms", "gaps", "idle_by_cause_ms", "top_kernels", "unreliable", "mfu", "mbu", "bound_ratio", "attainment_missing"]),
    ('phases/[]/name', 'enum', ["all", "prefill", "decode", "mixed", "unknown"]),
    ('phases/[]/gpu_idle_share', 'minimum', 0),
    ('phases/[]/gpu_idle_share', 'maximum', 1),
    ('phases/[]/launch_gap_share', 'minimum', 0),
    ('phases/[]/launch_gap_share', 'maximum', 1),
    ('phases/[]/attention_share', 'minimum', 0),
    ('phases/[]/attention_share', 'maximum', 1),
    ('phases/[]/gaps', 'required', ["launch", "all", "ms_by_kind", "count_by_kind", "longest"]),
    ('phases/[]/gaps/launch', 'required', ["count", "total_us", "p50_us", "p90_us", "p99_us", "max_us"]),
    ('phases/[]/gaps/all', 'required', ["count", "total_us", "p50_us", "p90_us", "p99_us", "max_us"]),
    ('phases/[]/gaps/longest/[]', 'required', ["start_ms", "ms", "kind", "cause", "host_call", "waited_on", "next"]),
    ('phases/[]/gaps/longest/[]/ms', 'minimum', 0),
    ('phases/[]/gaps/longest/[]/kind', 'enum', ["launch", "graph", "other", "unattributed"]),
    ('phases/[]/gaps/longest/[]/cause', 'enum', ["launch", "graph", "host_blocked", "dependency", "switch", "cold_start", "profiler_overhead", "not_in_trace", "unknown", "outside_trace", "pipelined"]),
    ('phases/[]/idle_by_cause_ms/{}', 'minimum', 0),
    ('phases/[]/idle_by_cause_ms/{keys}', 'enum', ["launch", "graph", "host_blocked", "dependency", "switch", "cold_start", "profiler_overhead", "not_in_trace", "unknown", "outside_trace", "pipelined"]),
    ('phases/[]/top_kernels/[]', 'required', ["name", "category", "count", "total_ms", "share"]),
    ('phases/[]/mfu', 'minimum', 0),
    ('phases/[]/mbu', 'minimum', 0),
    ('phases/[]/bound', 'enum', ["compute", "memory", None]),
    ('latency', 'required', ["ttft_ms", "ttft_samples", "tpot_ms", "tpot_samples", "tpot_definition", "itl_ms", "itl_samples", "itl_definition", "prefill_step_ms", "decode_step_ms", "mixed_step_ms"]),
    ('latency/tpot_ms', 'required', ["p50", "p90", "p99", "mean"]),
    ('latency/itl_ms', 'required', ["p50", "p90", "p99", "mean"]),
    ('latency/prefill_step_ms', 'required', ["p50", "p90", "p99", "mean"]),
    ('latency/decode_step_ms', 'required', ["p50", "p90", "p99", "mean"]),
    ('latency/mixed_step_ms', 'required', ["p50", "p90", "p99", "mean"]),
    ('steps/[]', 'required', ["name", "phase", "grammar", "start_ns", "end_ns", "scope", "gpu_span_ms", "gpu_busy_ms", "own_ms", "waits", "idle_by_cause_ms", "gpu_start_ns", "gpu_end_ns", "activity_count", "wall_ns"]),
    ('steps/[]/phase', 'enum', ["prefill", "decode", "mixed", "unknown"]),  # unknown: a step whose phase nothing tells (issue 21)
    ('steps/[]/scope', 'enum', ["cpu", "gpu"]),
    ('steps/[]/waits/[]', 'required', ["where", "start_ms", "ms", "cause", "host_call", "waited_on"]),
    ('steps/[]/waits/[]/where', 'enum', ["before", "inside"]),
    ('steps/[]/waits/[]/ms', 'minimum', 0),
    ('steps/[]/waits/[]/cause', 'enum', ["launch", "graph", "host_blocked", "dependency", "switch", "cold_start", "profiler_overhead", "not_in_trace", "unknown", "outside_trace", "pipelined"]),
    ('steps/[]/idle_by_cause_ms/{}', 'minimum', 0),
    ('steps/[]/idle_by_cause_ms/{keys}', 'enum', ["launch", "graph", "host_blocked", "dependency", "switch", "cold_start", "profiler_overhead", "not_in_trace", "unknown", "outside_trace", "pipelined"]),
    ('quality/[]', 'required', ["code", "message"]),
    ('launches', 'required', ["host_launch_calls", "graph_launches", "graph_coverage", "kernels_per_graph_launch_max"]),
    ('gpu', 'required', ["name", "peak_tflops", "peak_tbps", "ridge_flop_per_byte", "source", "overrides"]),
    ('model', 'required', ["name", "source", "params_total", "params_active_per_token", "weight_dtype", "weight_format", "weight_bytes", "kv_dtype", "kv_bytes_per_token", "tp"]),
    ('kernel_table/[]', 'required', ["device", "phase", "op", "input_dims", "kernel", "category", "calls", "total_ms", "kernel_time_share", "flops", "bytes", "achieved_tflops", "achieved_tbps", "peak_tflops_share", "peak_tbps_share", "bound", "shapes_unknown"]),
    ('headline', 'required', ["text", "rule_id", "cause", "ms", "share"]),
    ('headline/share', 'minimum', 0),
    ('headline/share', 'maximum', 1),
    ('symptoms/[]', 'required', ["id", "symptom", "title", "severity", "phase", "scope", "summary", "evidence", "likely_cause", "how_to_verify", "fix", "references", "recommends"]),
    ('symptoms/[]/severity', 'enum', ["info", "low", "medium", "high", "critical"]),
    ('symptoms/[]/stake_share', 'minimum', 0),
    ('symptoms/[]/stake_share', 'maximum', 1),
    ('not_evaluated/[]', 'required', ["id", "symptom", "title", "severity", "missing", "reason"]),
]


def _shipped() -> dict:
    return json.loads(resources.files("diagnose.data").joinpath("report.schema.json").read_text(encoding="utf-8"))


def test_shipped_schema_is_the_generated_one():
    text = resources.files("diagnose.data").joinpath("report.schema.json").read_text(encoding="utf-8")
    assert text == model.schema_text(), "regenerate: python -m diagnose.model > diagnose/data/report.schema.json"


def _resolve(schema: dict, node: dict) -> list[dict]:
    """The alternatives a node allows ($ref followed, anyOf flattened)."""
    if "$ref" in node:
        return _resolve(schema, schema["$defs"][node["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in node:
        return [x for alt in node["anyOf"] for x in _resolve(schema, alt)]
    return [node]


def _nodes(schema: dict, path: str) -> list[dict]:
    nodes = _resolve(schema, schema)
    for part in [p for p in path.split("/") if p]:
        nxt = []
        for n in nodes:
            if part == "[]" and "items" in n:
                nxt += _resolve(schema, n["items"])
            elif part == "{}" and isinstance(n.get("additionalProperties"), dict):
                nxt += _resolve(schema, n["additionalProperties"])
            elif part == "{keys}" and "propertyNames" in n:
                nxt += _resolve(schema, n["propertyNames"])
            elif part in (n.get("properties") or {}):
                nxt += _resolve(schema, n["properties"][part])
        assert nxt, f"{path}: no node for {part!r} in the generated schema"
        nodes = nxt
    return nodes


@pytest.mark.parametrize("path,keyword,value", OLD_CONSTRAINTS, ids=[f"{p or '/'}:{k}" for p, k, _ in OLD_CONSTRAINTS])
def test_constraints_of_the_hand_written_schema_survive(path, keyword, value):
    nodes = _nodes(_shipped(), path)
    if keyword == "required":
        req = set().union(*(set(n.get("required") or ()) for n in nodes))
        assert set(value) <= req, sorted(set(value) - req)
    elif keyword == "enum":
        allowed = set()
        for n in nodes:
            allowed |= set(n.get("enum") or ([n["const"]] if "const" in n else []))
            if n.get("type") == "null":
                allowed.add(None)
        assert set(value) <= allowed  # every old value survives (issue 22 added causes)
        if "cause" in path:
            from diagnose.vocab import GAP_CAUSES

            assert allowed == set(GAP_CAUSES)  # the cause table's, no more
        else:
            assert set(value) == allowed
    elif keyword == "const":
        assert any(n.get("const") == value or n.get("enum") == [value] for n in nodes)
    else:  # minimum / maximum on the numeric alternative
        nums = [n for n in nodes if n.get("type") in ("number", "integer")]
        assert nums and all(n.get(keyword) == value for n in nums), nums


GOLDENS = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", GOLDENS, ids=[p.name for p in GOLDENS])
def test_golden_report_decodes_into_the_model_and_back(path):
    doc = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(_shipped()).validate(doc)
    report = model.decode_report(path.read_text(encoding="utf-8"))
    assert isinstance(report, model.Report) and report.schema_version == 2
    assert json.loads(model.encode(report)) == doc
    assert model.decode_report(doc) == report


def test_decode_rejects_a_document_that_is_not_a_report():
    import msgspec

    with pytest.raises(msgspec.ValidationError, match="phases"):
        model.decode_report(b'{"schema_version": 2, "source": {"path": "x", "format": "kineto-json"}, "partial": false, '
                            b'"devices": [], "phases": [{"name": "bogus"}]}')


def test_phase_row_gives_its_roofline_numbers_as_one_record():
    rep = model.decode_report((GOLDEN / "expert__h100_qwen1.5-0.5b.json").read_text(encoding="utf-8"))
    row = rep.phase("all")
    att = row.attainment
    assert isinstance(att, model.Attainment) and att.mfu == row.mfu and att.attainment_missing == row.attainment_missing
    assert model.PhaseRow.of(model.PhaseTimes(**{f: getattr(row, f) for f in model.PhaseTimes.__struct_fields__}), att) == row
