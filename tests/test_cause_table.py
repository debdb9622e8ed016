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
from diagnose.vocab import CAUSE_COLORS, CAUSE_LEVERS, EXTERNAL_CAUSES, GAP_CAUSE_LABELS, GAP_CAUSES, HOST_CAUSES, LEVERS
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


# -- the cause legend: one entry per cause a view shows, in the table's colour ------------------


NVFUSER = "nvfuser/64ee035/report1.sqlite"


def _dash_legend(component, legend_id: str) -> list[tuple[str, str, str]]:
    """(data-cause, swatch colour, text) of each item of the Dash legend ``legend_id``."""
    found = []

    def walk(x, inside=False):
        inside = inside or getattr(x, "id", None) == legend_id
        if inside and getattr(x, "className", None) == "dg-legend-item":
            swatch, text = x.children
            found.append((getattr(x, "data-cause"), swatch.style["background"], text))
        ch = getattr(x, "children", None)
        for y in ch if isinstance(ch, list) else [ch] if ch is not None else []:
            walk(y, inside)

    walk(component)
    return found


def _html_legend(html: str, legend_id: str) -> list[tuple[str, str, str]]:
    m = re.search(rf'<div class="legend" id="{legend_id}">(.*?)</div>', html, re.S)
    assert m, legend_id
    return re.findall(r'<span class="legend-item" data-cause="([a-z_]+)" title="[^"]*"><span class="swatch" '
                      r'style="background:(#[0-9a-f]{6})"></span>([^<]*)</span>', m.group(1))


def _want(causes) -> list[tuple[str, str, str]]:
    t = cause_table()
    return [(c.name, c.color, f"{c.name}: {c.short}") for c in t.causes if c.name in causes]


def _views(a):
    """(the overview's legend, the timeline page's, the HTML report's waits and timeline legends,
    the timeline figure's gap traces {cause: colour}) of one analysis."""
    pytest.importorskip("dash")
    from diagnose.app.html import render_html
    from diagnose.app.server import build_state, timeline_page, waits_section
    from diagnose.app.timeline import timeline_figure

    r = a.to_dict()
    entry = build_state(["t"], [a]).entries[0]
    from dash import html as H

    overview = _dash_legend(H.Div(waits_section(r)), "cause-legend")
    timeline = _dash_legend(timeline_page(entry), "timeline-cause-legend")
    page = render_html(r, a.activities, host=entry.host, host_index=a.host_index, t0_ns=a.t0_ns)
    fig = timeline_figure(entry.timeline, max_points=10**6)
    drawn = {t.legendgroup[len("gap:"):]: t.line.color for t in fig.data if (t.legendgroup or "").startswith("gap:")}
    return overview, timeline, _html_legend(page, "cause-legend"), _html_legend(page, "timeline-cause-legend"), drawn


def test_each_view_has_a_legend_of_the_causes_it_shows_in_the_tables_colours(decode0):
    """nano-vllm decode_gpu_0: idle by cause launch 0.927, host_compute 0.693, host_blocked 0.403,
    switch 0.001 ms; the overview and the HTML report list those four, in the table's order and
    colours; the timeline draws the same gaps (and a blocking call on the host lane) in those
    colours, and its legend names exactly what it draws."""
    overview, timeline, html_waits, html_timeline, drawn = _views(decode0)
    four = _want({"launch", "host_blocked", "switch", "host_compute"})
    assert [c for c, _, _ in four] == ["launch", "host_blocked", "switch", "host_compute"]
    assert overview == four and html_waits == four
    assert timeline == html_timeline == four
    assert drawn == {c: col for c, col, _ in four}  # the figure's gap traces, as its legend says


def test_cold_start_is_drawn_as_itself():
    """nvFuser's nsys trace (64ee035): the host compiled fusions (nvFuser compileFusion) for
    396.815915 ms while the GPU idled: cold_start on the overview, the HTML report and the timeline,
    drawn in cold_start's colour for exactly that long (one gap), never as a generic idle."""
    from diagnose.app.timeline import host_lane, prepare_timeline
    from diagnose.pipeline import run_analysis

    a = run_analysis(str(shared_trace(NVFUSER)))
    r = a.to_dict()
    assert next(p for p in r["phases"] if p["name"] == "all")["idle_by_cause_ms"]["cold_start"] == 396.815915
    td = prepare_timeline(a.activities, r, host_lane(a.trace, r), a.host_index, t0_ns=a.t0_ns)
    m = td.gap_cause == GAP_CAUSES.index("cold_start")
    assert (int(m.sum()), int((td.gap_end[m] - td.gap_start[m]).sum())) == (1, 396_815_915)
    overview, timeline, html_waits, html_timeline, drawn = _views(a)
    entry = ("cold_start", CAUSE_COLORS["cold_start"], "cold_start: compilation")
    for legend in (overview, timeline, html_waits, html_timeline):
        assert entry in legend
    assert drawn["cold_start"] == CAUSE_COLORS["cold_start"]


def test_profiler_overhead_is_drawn_as_itself(kineto, tmp_path):
    """A planted trace: the profiler's 'Activity Buffer Request' (11..511 µs) sits in the GPU's
    gap 10..520 µs; the trace starts at the first launch call (-5 µs), so the gap is 0.51 ms from
    0.015 ms on the timeline, in profiler_overhead's colour, and every legend names it."""
    from diagnose.pipeline import run_analysis

    b = kineto()
    b.launch("k0", 0, 10, launch_ts=-5, launch_dur=3)
    b.overhead("Activity Buffer Request", 11, 500)
    b.launch("k1", 520, 10, launch_ts=512, launch_dur=5)
    a = run_analysis(str(b.write(tmp_path / "overhead.json")))
    overview, timeline, html_waits, html_timeline, drawn = _views(a)
    want = _want({"profiler_overhead"})
    assert overview == timeline == html_waits == html_timeline == want
    assert drawn == {"profiler_overhead": CAUSE_COLORS["profiler_overhead"]}
    from diagnose.app.server import build_state
    from diagnose.app.timeline import timeline_figure

    fig = timeline_figure(build_state(["t"], [a]).entries[0].timeline)
    assert [list(t.x) for t in fig.data if t.legendgroup == "gap:profiler_overhead"][0][:2] == [0.015, 0.525]


def test_no_other_thing_on_the_timeline_wears_a_cause_colour(decode0):
    """A cause's colour means that cause on every row of the timeline: gaps of the cause, the host
    lane's blocking calls (host_blocked), and critical-path waits of the cause (GPU gaps: graph,
    launch latency: launch, cross-stream waits: dependency, a blocking call's return: host_blocked);
    nothing else (kernel categories, phases, host markers and calls, other path kinds) is drawn in one."""
    from diagnose.app.pathlane import path_lane
    from diagnose.app.timeline import HOST_COLORS, HOST_KINDS, host_lane, prepare_timeline, timeline_figure
    from diagnose.vocab import PATH_KIND_COLORS

    r = decode0.to_dict()
    td = prepare_timeline(decode0.activities, r, host_lane(decode0.trace, r), decode0.host_index,
                          path_lane(decode0.paths), t0_ns=decode0.t0_ns)
    wears = {"path:gpu_gap": "graph", "path:launch_latency": "launch", "path:dependency": "dependency",
             "path:sync_return": "host_blocked", "host:blocking call": "host_blocked"}
    given = {**{"path:" + k: v for k, v in PATH_KIND_COLORS.items()}, **{"host:" + k: v for k, v in zip(HOST_KINDS, HOST_COLORS)}}
    assert {g: given[g] for g in wears} == {g: CAUSE_COLORS[c] for g, c in wears.items()}  # a sync's return is not red
    by_colour = {v: k for k, v in CAUSE_COLORS.items()}
    seen = set()
    for t in timeline_figure(td, max_points=10**6).data:
        colour = (t.line.color if t.mode == "lines" else t.marker.color) or ""
        group = t.legendgroup or ""
        if colour in by_colour:
            want = group[len("gap:"):] if group.startswith("gap:") else wears.get(group)
            assert want == by_colour[colour], (group, colour)
            seen.add(group)
    assert {"gap:launch", "gap:host_compute", "gap:host_blocked", "path:launch_latency", "path:sync_return"} <= seen


def test_terminal_gap_table_names_its_origin_in_100_columns(decode0):
    """The terminal's longest-gaps table says where its start counts from (the trace start, as the
    JSON's start_ms and the pages) and still fits a 100-column terminal; the line under it is the
    cause legend: each cause shown, in the table's colour, with its meaning."""
    from io import StringIO

    from rich.console import Console

    from diagnose.report.terminal import render_report

    con = Console(record=True, width=100, color_system="truecolor", file=StringIO())
    render_report(decode0.to_dict(), console=con)  # the 50-line report: within 100 columns
    assert max(len(x) for x in con.export_text().splitlines()) <= 100
    # --full prints the gap table whole: its title says where "start ms" counts from
    con = Console(record=True, width=100, color_system="truecolor", file=StringIO())
    render_report(decode0.to_dict(), console=con, full=True)
    text = con.export_text(clear=False)
    lines = text.splitlines()
    assert max(len(x) for x in lines) <= 100
    i = next(n for n, x in enumerate(lines) if x.startswith("Longest gaps"))
    assert lines[i].strip() == "Longest gaps (start: ms from the trace start)"
    assert lines[i + 2].split()[:2] == ["start", "ms"]
    html = con.export_html(inline_styles=True)
    for c in ("launch", "host_blocked", "switch", "host_compute"):  # the legend, in the table's order
        assert re.search(rf'color: {CAUSE_COLORS[c]}[^"]*">{c}</span><span[^>]*>: ', html), c
        assert f"{c}: {GAP_CAUSE_LABELS[c]}" in " ".join(text.split()), c
    flat = " ".join(text.split())
    at = [flat.index(f"{c}: {GAP_CAUSE_LABELS[c]}") for c in ("launch", "host_blocked", "switch", "host_compute")]
    assert at == sorted(at)
