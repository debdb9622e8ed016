"""The cause table (diagnose/data/causes.yaml) is the only place the causes, their colours and
their levers are defined, and every view uses it: the terminal, the JSON report, the HTML
report, the web timeline (detail and aggregated) and the web overview."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import shared_trace
from diagnose.cause_table import CauseTableError, cause_table, check
from diagnose.engine import load_rules, load_ruleset
from diagnose.options import AnalysisOptions
from diagnose.pipeline import diagnose_trace
from diagnose.vocab import CAUSE_COLORS, CAUSE_LEVERS, EXTERNAL_CAUSES, GAP_CAUSES, HOST_CAUSES, LEVERS
from diagnose.yamlio import load_yaml

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "diagnose" / "data" / "causes.yaml"
DECODE0 = "nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json"


def _raw() -> dict:
    return load_yaml(TABLE.read_text(encoding="utf-8"))


def test_vocabulary_is_read_from_the_table():
    raw = _raw()
    assert GAP_CAUSES == tuple(c["name"] for c in raw["causes"])
    assert CAUSE_COLORS == {c["name"]: c["color"] for c in raw["causes"]}
    assert CAUSE_LEVERS == {c["name"]: tuple(c["levers"]) for c in raw["causes"]}
    assert EXTERNAL_CAUSES == {c["name"] for c in raw["causes"] if c["external"]}
    assert set(LEVERS) == {lv["name"] for lv in raw["levers"]}
    assert HOST_CAUSES == ("profiler_overhead", "first_call_setup", "host_blocked", "cold_start", "data_loading",
                           "compile_guard", "host_compute", "launch", "host_unknown")
    assert len(set(CAUSE_COLORS.values())) == len(CAUSE_COLORS)  # every cause tells apart in a view


def test_the_causes_of_the_issue_are_there_with_their_levers():
    t = cause_table()
    want = {"launch": ["cuda_graphs", "fewer_kernels"], "host_compute": ["move_host_work"], "first_call_setup": ["warm_up"],
            "compile_guard": ["reduce_guards"], "data_loading": ["dataloader_workers"], "collective_wait": ["slow_peer"],
            "host_blocked": ["remove_host_sync"]}
    for name, levers in want.items():
        assert t.cause(name).levers == levers
    assert {c.name for c in t.causes} >= {"dependency", "profiler_overhead", "cold_start", "outside_trace", "switch", "graph",
                                          "host_unknown"}
    assert not t.cause("compile_guard").external and t.cause("first_call_setup").external


def test_table_checks_refuse_a_bad_table():
    t = cause_table()
    import msgspec

    bad = msgspec.structs.replace(t, causes=[msgspec.structs.replace(t.causes[0], color="red")] + t.causes[1:])
    with pytest.raises(CauseTableError, match="color"):
        check(bad)
    bad = msgspec.structs.replace(t, causes=[msgspec.structs.replace(t.causes[0], levers=["no_such_lever"])] + t.causes[1:])
    with pytest.raises(CauseTableError, match="no_such_lever"):
        check(bad)


def _sources() -> list[Path]:
    files = [p for d in ("diagnose", "app", "collectors", "rules") for p in (ROOT / d).rglob("*")
             if p.suffix in (".py", ".yaml", ".j2", ".json", ".css", ".js") and p.is_file()]
    return [p for p in files if p != TABLE and "report.schema.json" not in p.name]


def test_no_other_file_defines_a_cause_colour_or_a_lever():
    colours = {c.lower() for c in CAUSE_COLORS.values()}
    texts = [lv.text for lv in cause_table().levers]
    for p in _sources():
        s = p.read_text(encoding="utf-8", errors="replace")
        found = {h.lower() for h in re.findall(r"#[0-9a-fA-F]{6}\b", s)} & colours
        assert not found, f"{p.relative_to(ROOT)} defines cause colour(s) {sorted(found)}: read CAUSE_COLORS"
        for t in texts:
            assert t[:40] not in s, f"{p.relative_to(ROOT)} repeats a lever text: read LEVERS"


def test_rules_take_a_causes_levers_from_the_table():
    rules = load_rules()
    host_rules = 0
    for r in rules:
        if r.cause.startswith("idle:") and "{" not in r.cause:
            c = r.cause[len("idle:"):]
            assert c in GAP_CAUSES, f"{r.id}: cause {c!r} is not in the cause table"
            assert not set(r.recommends) & set(CAUSE_LEVERS[c]), f"{r.id} repeats levers of {c} the table gives"
            host_rules += 1
    assert host_rules >= 8


@pytest.fixture(scope="module")
def decode0():
    path = shared_trace(DECODE0)
    return diagnose_trace(str(path), AnalysisOptions(), load_ruleset())


def test_terminal_colours_causes_from_the_table(decode0):
    from io import StringIO

    from rich.console import Console

    from diagnose.report.terminal import render_report

    con = Console(record=True, width=200, color_system="truecolor", file=StringIO())
    render_report(decode0.to_dict(), console=con)
    html = con.export_html(inline_styles=True)
    for c in ("launch", "host_compute", "host_blocked"):
        assert re.search(rf'color: {CAUSE_COLORS[c]}[^"]*">{c}\b', html), c


def test_json_report_causes_are_the_tables(decode0):
    from diagnose.model import report_schema

    schema = report_schema()
    assert sorted(schema["$defs"]["Gap"]["properties"]["cause"]["enum"]) == sorted(GAP_CAUSES)
    r = decode0.to_dict()
    used = {g["cause"] for p in r["phases"] for g in p["gaps"]["longest"]} | {c["cause"] for p in r["phases"] for c in p["causes"]}
    assert used and used <= set(GAP_CAUSES)


def test_html_report_colours_causes_from_the_table(decode0):
    from diagnose.app.html import render_html

    html = render_html(decode0.to_dict(), decode0.activities, host_index=decode0.host_index)
    for c in decode0.to_dict()["phases"][0]["idle_by_cause_ms"]:
        assert f'background:{CAUSE_COLORS[c]}">{c}' in html, c


def test_web_timeline_draws_each_gap_in_its_cause_colour(decode0):
    from diagnose.app.timeline import CAUSE_LEGEND, HOST_COLORS, prepare_timeline, timeline_figure

    td = prepare_timeline(decode0.activities, decode0.to_dict(), host_index=decode0.host_index)
    for max_points in (20000, 40):  # detail, then merged into pixel-sized blocks
        fig = timeline_figure(td, max_points=max_points)
        drawn = {t.name: t.line.color for t in fig.data if t.name in CAUSE_LEGEND.values()}
        assert drawn, max_points
        for c, label in CAUSE_LEGEND.items():
            if label in drawn:
                assert drawn[label] == CAUSE_COLORS[c]
    assert HOST_COLORS[2] == CAUSE_COLORS["host_blocked"]


def test_web_overview_colours_causes_from_the_table(decode0):
    pytest.importorskip("dash")
    from diagnose.app.server import waits_section

    out = waits_section(decode0.to_dict())
    spans = []

    def walk(x):
        if hasattr(x, "children"):
            if getattr(x, "className", None) == "dg-cause":
                spans.append((x.children, x.style["background"]))
            ch = x.children
            for y in ch if isinstance(ch, list) else [ch]:
                walk(y)

    for x in out:
        walk(x)
    assert spans
    for name, colour in spans:
        cause = name.split(" ")[0]
        assert colour == CAUSE_COLORS[cause]


def test_readme_cause_table_is_generated():
    from diagnose.cause_table import causes_markdown

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- causes:begin[^>]*-->\n(.*?)\n<!-- causes:end -->", readme, re.S)
    assert m, "README lacks the generated cause table markers"
    assert m.group(1) == causes_markdown(), "regenerate: python -m diagnose.cause_table"


def test_critical_path_and_whatif_use_the_tables_causes(decode0):
    """One definition of causes: the causes a critical path's host time can have and the ones
    ``diagnose whatif --remove`` takes are cause-table names, and the path names host events
    the way the gap classifier does (the same host_calls.yaml tests, the table's precedence)."""
    from click.testing import CliRunner

    from diagnose.analyzers import whatif as W
    from diagnose.analyzers.hostpath import host_cause, path_causes
    from diagnose.cli import main

    assert path_causes() == ("profiler_overhead", "first_call_setup", "host_blocked", "cold_start", "data_loading",
                             "compile_guard", "host_compute", "launch")
    assert set(path_causes()) <= set(HOST_CAUSES)
    assert W.REMOVABLE == ("launch", "graph", "host_blocked", "dependency", "switch", "cold_start", "profiler_overhead",
                           "host_compute", "first_call_setup", "compile_guard", "data_loading", "collective_wait", "idle")
    assert set(W.REMOVABLE) - {"idle"} <= set(GAP_CAUSES)
    assert set(W.INTERNAL) == set(W.REMOVABLE) - {"idle", "collective_wait"} - EXTERNAL_CAUSES
    helptext = " ".join(CliRunner().invoke(main, ["whatif", "--help"]).output.split())
    listed = re.search(r"cause of the cause table \(([^;]*);", helptext).group(1).replace(" ", "").split(",")
    assert set(listed) == set(W.REMOVABLE) - {"idle"}
    named = {("Lazy Function Loading", "overhead"): "first_call_setup",
             ("Activity Buffer Request", "overhead"): "profiler_overhead",
             ("cuModuleLoadData", "runtime"): "first_call_setup",
             ("cudaStreamSynchronize", "runtime"): "host_blocked",
             ("TorchDynamo Cache Lookup", "op"): "compile_guard",
             ("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", "range"): "data_loading",
             ("Inductor compile: fx_codegen_and_compile (dynamo_timed)", "range"): "cold_start",
             ("cudaLaunchKernel", "runtime"): None, ("aten::mm", "op"): None}
    assert {k: host_cause(*k) for k in named} == named
    # nano-vllm decode_gpu_0: the CPU attention (attention_cpu / load_kvcache_cpu, launching nothing) is
    # host_compute on the path as in the gaps (segment level 0.688 ms; gaps 0.692969 ms, whole gaps)
    cp = decode0.to_dict()["critical_path"]["phases"][0]["host_ms_by_cause"]
    assert set(cp) <= set(path_causes())
    assert (cp["host_compute"], cp["launch"]) == (0.688082, 1.552619)
