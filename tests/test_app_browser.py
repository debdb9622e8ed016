"""The app and the HTML report in headless Chromium (Debian's ``chromium`` + ``chromium-driver``).

Skipped when /usr/bin/chromium, /usr/bin/chromedriver or selenium are absent. The app runs
in a thread on 127.0.0.1 (free port). Symptoms come from the real rule engine (S7 fires on the vLLM trace), so the
overview shows a card whatever the state of the rule engine; the CPU-only sample, which
has none, checks the "no symptom" banner.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

from browser_support import WAIT_S, chrome, served  # noqa: E402  (skips the module without a browser)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from diagnose.app.html import write_html  # noqa: E402
from diagnose.app.server import create_app  # noqa: E402
from diagnose.pipeline import attach_verdicts
from diagnose.pipeline import run_analysis  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT.parent / "shared" / "traces" / "tracelens" / "vllm_decode_full" / "graph_execution.json.gz"
TINY = ROOT / "samples" / "tiny_cpu.json.gz"



@pytest.fixture(scope="module")
def analyses():
    if not VLLM.exists():
        pytest.skip(f"shared trace corpus not available: {VLLM}")
    vllm = run_analysis(str(VLLM))
    attach_verdicts(vllm)  # the real rule engine: MoE kernels (high) and small kernels (medium) on this trace
    return vllm, run_analysis(str(TINY))


@pytest.fixture(scope="module")
def base_url(analyses):
    with served(create_app([str(VLLM), str(TINY)], list(analyses))) as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    with chrome(browser_log=True) as d:
        yield d


def _plot(graph_id: str) -> str:
    """A rendered plot: dcc.Graph wraps the .js-plotly-plot div, the HTML report's div is one."""
    return f"#{graph_id}.js-plotly-plot .main-svg, #{graph_id} .js-plotly-plot .main-svg"


def _severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def _wait_css(driver, css: str):
    return WebDriverWait(driver, WAIT_S).until(EC.presence_of_element_located((By.CSS_SELECTOR, css)))


def _wait_text(driver, css: str, text: str):
    WebDriverWait(driver, WAIT_S).until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))


@pytest.mark.slow  # four pages, 8 s; the inner loop's one browser test is test_trace_select_shows_no_symptom_banner
def test_overview_timeline_roofline(driver, base_url, analyses):
    driver.get(base_url + "/")
    banner = _wait_css(driver, "#overview-banner")
    _wait_text(driver, "#overview-banner", "HIGH: 2 symptoms fired")
    assert "decode is MoE-kernel-bound: 71% of kernel time (7.53 ms) in MoE expert kernels" in banner.text
    card = _wait_css(driver, "#symptom-card-moe-kernel-bound")
    assert "fused-MoE" in card.text and "How to verify" in card.text
    gaps = _wait_css(driver, "#longest-gaps-2")
    assert "dependency" in gaps.text
    errors = _severe(driver)

    driver.find_element(By.ID, "nav-timeline").click()
    _wait_css(driver, _plot("timeline-graph"))
    _wait_text(driver, "#timeline-graph .gtitle", "434 activities")
    assert "active" in driver.find_element(By.ID, "nav-timeline").get_attribute("class")
    # Zoom: the relayout callback re-renders the range [8, 9] ms from the trace start in detail
    # (the first GPU activity is at 8.370878 ms: 40 activities overlap the range).
    want = 40
    _wait_css(driver, "#timeline-graph .js-plotly-plot:not(.dash-graph--pending)")  # dcc.Graph finished mounting
    driver.execute_script(
        "Plotly.relayout(document.querySelector('#timeline-graph .js-plotly-plot'), {'xaxis.range[0]': 8, 'xaxis.range[1]': 9});")
    _wait_text(driver, "#timeline-graph .gtitle", f"— {want} activities")
    errors += _severe(driver)

    driver.find_element(By.ID, "nav-roofline").click()
    _wait_css(driver, _plot("roofline-graph"))
    note = _wait_css(driver, "#roofline-note")
    assert "not available" in note.text.lower()  # the vLLM trace does not name its GPU
    errors += _severe(driver)

    driver.find_element(By.ID, "nav-kernels").click()
    _wait_css(driver, _plot("categories-graph"))
    _wait_css(driver, "#kernels-grid .ag-row")
    errors += _severe(driver)
    assert errors == []


def test_trace_select_shows_no_symptom_banner(driver, base_url):
    driver.get(base_url + "/")
    _wait_text(driver, "#overview-banner", "HIGH")
    driver.find_element(By.CSS_SELECTOR, "#trace-select").click()
    opt = WebDriverWait(driver, WAIT_S).until(
        EC.element_to_be_clickable((By.XPATH, "//*[@role='option'][contains(., 'tiny_cpu.json.gz')]")))
    opt.click()
    _wait_text(driver, "#overview-banner", "No symptom")
    assert "no_gpu_activity" in driver.find_element(By.ID, "quality-list").text
    assert _severe(driver) == []


@pytest.mark.slow  # browser: the inner loop's one browser test is test_trace_select_shows_no_symptom_banner
def test_kv_calculator_updates(driver, base_url):
    driver.get(base_url + "/kv")
    _wait_text(driver, "#kv-per-token", "131,072 B per token")
    box = _wait_css(driver, "#kv-contexts")
    box.clear()
    box.send_keys("4k" + Keys.ENTER)
    _wait_text(driver, "#kv-table", "4,096")
    assert "512 MiB" in driver.find_element(By.ID, "kv-table").text
    assert _severe(driver) == []


@pytest.mark.slow  # browser: the inner loop's one browser test is test_trace_select_shows_no_symptom_banner
def test_html_report_opens_offline(driver, analyses, tmp_path):
    vllm = analyses[0]
    out = write_html(vllm, tmp_path / "report.html")
    driver.get(out.resolve().as_uri())
    banner = _wait_css(driver, "#overview-banner")
    assert "HIGH: 2 symptoms fired" in banner.text and "MoE-kernel-bound" in banner.text
    _wait_css(driver, _plot("timeline-graph"))
    _wait_css(driver, _plot("roofline-graph"))
    assert driver.find_element(By.ID, "symptom-card-moe-kernel-bound")
    assert "host · markers, calls" in driver.find_element(By.ID, "timeline-graph").text
    assert "ms from trace start" in driver.find_element(By.CSS_SELECTOR, "#timeline-graph .xtitle").text  # as the web page
    colours = _yaml_colours()
    want = [(c, colours[c], text) for c, text in VLLM_LEGEND]
    assert _legend(driver, "cause-legend") == want and _legend(driver, "timeline-cause-legend") == want
    head = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#longest-gaps-2 thead th")]
    assert head[0] == "start (ms from trace start)"
    assert _severe(driver) == []


def _yaml_colours() -> dict[str, str]:
    """{cause: colour} as diagnose/data/causes.yaml writes them (read here, not through the package)."""
    import yaml

    raw = yaml.safe_load((ROOT / "diagnose" / "data" / "causes.yaml").read_text(encoding="utf-8"))
    return {c["name"]: c["color"].lower() for c in raw["causes"]}


def _rgb(css: str) -> str:
    """'rgb(176, 176, 176)' (a computed colour) as '#b0b0b0'."""
    return "#" + "".join(f"{int(v):02x}" for v in re.findall(r"\d+", css)[:3])


def _legend(driver, legend_id: str) -> list[tuple[str, str, str]]:
    """(cause, the swatch's colour as the browser paints it, text) of each entry of a cause legend."""
    items = _wait_css(driver, f"#{legend_id}").find_elements(By.CSS_SELECTOR, "[data-cause]")
    return [(i.get_attribute("data-cause"), _rgb(i.find_element(By.CSS_SELECTOR, "span").value_of_css_property("background-color")),
             i.text) for i in items]


#: The vLLM trace's causes (device 2): idle 0.022 ms queued behind a dependency, 0.003 ms kernel
#: switches; in the cause table's order, with the table's short words.
VLLM_LEGEND = [("dependency", "dependency: queued behind a dependency"), ("switch", "switch: kernel switch")]


@pytest.mark.slow  # browser: the inner loop's one browser test is test_trace_select_shows_no_symptom_banner
def test_one_time_origin_on_the_overview_and_the_timeline(driver, base_url, analyses):
    """The overview's longest-gaps table and the timeline count from the same origin (the trace
    start, as the JSON's start_ms and --window), labelled on both: the table's longest gap
    (18.8175 ms from the trace start, 11.681 µs, before a copy kernel) is drawn on the
    timeline's idle row at exactly that time. Both pages carry the cause legend: one entry per
    cause shown (dependency, switch), painted in causes.yaml's colour, which is also the colour
    the timeline draws each cause's gaps in."""
    colours = _yaml_colours()
    want = [(c, colours[c], text) for c, text in VLLM_LEGEND]
    assert [w[1] for w in want] == ["#b0b0b0", "#d9d9d9"]
    gap = next(p for p in analyses[0].to_dict()["phases"] if p["name"] == "all")["gaps"]["longest"][0]
    assert (gap["start_ms"], gap["ms"], gap["cause"]) == (18.8175, 0.011681, "dependency")
    driver.get(base_url + "/")
    table = _wait_css(driver, "#longest-gaps-2")
    head = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    first = [td.text for td in table.find_elements(By.CSS_SELECTOR, "tbody tr")[0].find_elements(By.TAG_NAME, "td")]
    assert head[0] == "start (ms from trace start)" and first[:2] == ["18.82 ms", "0.0117 ms"]
    assert _legend(driver, "cause-legend") == want
    cell = table.find_elements(By.CSS_SELECTOR, "tbody tr")[0].find_elements(By.TAG_NAME, "td")[2]
    assert _rgb(cell.find_element(By.CSS_SELECTOR, ".dg-cause").value_of_css_property("background-color")) == colours["dependency"]

    driver.get(base_url + "/timeline")
    _wait_css(driver, _plot("timeline-graph"))
    _wait_css(driver, "#timeline-graph .js-plotly-plot:not(.dash-graph--pending)")
    assert "ms from trace start" in driver.find_element(By.CSS_SELECTOR, "#timeline-graph .xtitle").text
    segs = WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(  # once the figure is drawn
        "const gd = document.querySelector('#timeline-graph .js-plotly-plot');"
        "if (!gd || !gd._fullData) return null;"
        "return gd._fullData.filter(d => (d.legendgroup || '').startsWith('gap:')).map(d => {"
        "  const x = Array.from(d.x); const out = [];"
        "  for (let i = 0; i + 1 < x.length; i += 3) out.push([x[i], x[i + 1]]);"
        "  return [d.legendgroup, out]; });"))
    hits = [(g, a, b) for g, xs in segs for a, b in xs if abs(a - gap["start_ms"]) < 1e-6]
    assert len(hits) == 1 and abs(hits[0][2] - hits[0][1] - gap["ms"]) < 1e-6, hits
    assert hits[0][0] == "gap:dependency"  # the table's cause, on the timeline too
    assert _legend(driver, "timeline-cause-legend") == want
    drawn = driver.execute_script(  # each cause's gaps as drawn: their line colour
        "const gd = document.querySelector('#timeline-graph .js-plotly-plot');"
        "return Object.fromEntries(gd._fullData.filter(d => (d.legendgroup || '').startsWith('gap:'))"
        "  .map(d => [d.legendgroup.slice(4), d.line.color]));")
    assert {k: v.lower() for k, v in drawn.items()} == {c: col for c, col, _ in want}
    assert _severe(driver) == []


@pytest.mark.slow  # browser: the inner loop's one browser test is test_trace_select_shows_no_symptom_banner
def test_timeline_highlights_the_critical_path(driver, base_url, analyses):
    """The timeline's critical-path lane highlights exactly the segments the JSON report lists
    for the step (``steps[].critical_path.segments``), at the same times."""
    from diagnose.app.pathlane import TOP_TRACE

    vllm = analyses[0]
    report = vllm.to_dict()
    segs = report["steps"][0]["critical_path"]["segments"]
    want = [[s["start_ms"], s["ms"]] for s in segs]  # the timeline counts from the trace start, as the JSON
    driver.get(base_url + "/timeline")
    _wait_css(driver, _plot("timeline-graph"))
    _wait_css(driver, "#timeline-graph .js-plotly-plot:not(.dash-graph--pending)")
    assert "critical path" in driver.find_element(By.ID, "timeline-graph").text
    got = WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(  # once the figure is drawn
        "const gd = document.querySelector('#timeline-graph .js-plotly-plot');"
        f"const t = gd && gd._fullData && gd._fullData.find(d => d.name === {TOP_TRACE!r});"  # the drawn (decoded) trace
        "return t ? [t.meta.critical_path_top, Array.from(t.x).filter(v => v !== null && !isNaN(v))] : null;"))
    assert got is not None
    top, xs = got
    assert len(segs) == 10 and top == want
    drawn = [[round(a, 6), round(b - a, 6)] for a, b in zip(xs[0::2], xs[1::2])]  # what the browser draws
    assert all(abs(d[0] - w[0]) < 1e-6 and abs(d[1] - w[1]) < 1e-6 for d, w in zip(drawn, want)) and len(drawn) == len(want)
    assert _severe(driver) == []
