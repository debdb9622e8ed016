"""The layer heat strip in headless Chromium: a real mouse click on a cell highlights that
cell's kernels on the timeline, in the HTML report (plotly.js in the page) and in the web
report (a Dash callback re-renders the timeline zoomed to them).

Skipped when Chromium, chromedriver, selenium or dash are absent, or without the shared corpus.
"""
from __future__ import annotations


import pytest

pytestmark = pytest.mark.browser

from browser_support import WAIT_S, chrome, served  # noqa: E402  (skips the module without a browser)

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from conftest import shared_trace  # noqa: E402
from diagnose.app.html import write_html  # noqa: E402
from diagnose.app.server import create_app  # noqa: E402
from diagnose.pipeline import run_analysis  # noqa: E402

VLLM_FULL = "tracelens/vllm_decode_full/graph_execution.json.gz"

#: A heat-strip cell's centre relative to the centre of the plot's drag layer (where plotly
#: reads the mouse), from plotly's own axes (category index -> pixel).
_CELL_XY = """
var gd = arguments[0], drag = gd.querySelector('.nsewdrag'), r = drag.getBoundingClientRect(), t = gd.data[0];
var xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
return [xa.c2p(t.x.indexOf(arguments[1])) - r.width / 2, ya.c2p(t.y.indexOf(arguments[2])) - r.height / 2];
"""
#: The timeline's last trace (the highlight): its name and how many segments it draws.
_HIGHLIGHT = """
var gd = arguments[0].classList.contains('js-plotly-plot') ? arguments[0] : arguments[0].querySelector('.js-plotly-plot');
if (!gd || !gd.data || !gd.data.length) { return null; }
var t = gd.data[gd.data.length - 1], n = 0;
Array.from(t.x || []).forEach(function (v) { if (v !== null && v === v) { n += 1; } });
return [t.name, n / 2, gd.layout.xaxis.range ? gd.layout.xaxis.range.slice() : null];
"""


@pytest.fixture(scope="module")
def analysis():
    return run_analysis(str(shared_trace(VLLM_FULL)))


@pytest.fixture(scope="module")
def driver():
    with chrome(browser_log=False) as d:
        yield d


def _click_cell(driver, strip, layer: str, op_class: str) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", strip)
    dx, dy = driver.execute_script(_CELL_XY, strip, layer, op_class)
    drag = strip.find_element(By.CSS_SELECTOR, ".nsewdrag")
    ActionChains(driver).move_to_element_with_offset(drag, int(dx), int(dy)).click().perform()


@pytest.mark.slow  # browser (test_app_browser::test_trace_select_shows_no_symptom_banner is the inner loop's); test_layers checks the strip's HTML
def test_html_strip_click_highlights_the_cells_kernels(driver, analysis, tmp_path):
    out = write_html(analysis, tmp_path / "report.html")
    driver.get(out.as_uri())
    wait = WebDriverWait(driver, WAIT_S)
    strip = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#layer-strip.js-plotly-plot")))
    tl = driver.find_element(By.ID, "timeline-graph")
    assert driver.execute_script(_HIGHLIGHT, tl)[:2] == ["selected layer cell", 0]
    _click_cell(driver, strip, "7", "attention")
    wait.until(lambda d: tl.get_attribute("data-highlighted") == "5")
    name, segments, rng = driver.execute_script(_HIGHLIGHT, tl)
    assert (name, segments, tl.get_attribute("data-cell")) == ("selected layer cell", 5, "7|attention")
    assert rng is not None and rng[1] - rng[0] < 1.0  # zoomed to the cell's kernels (well under a ms)
    assert "attributed to 24 layers" in driver.find_element(By.ID, "coverage").text


@pytest.fixture(scope="module")
def base_url(analysis):
    with served(create_app([str(shared_trace(VLLM_FULL))], [analysis])) as url:
        yield url


@pytest.mark.slow  # browser (test_app_browser::test_trace_select_shows_no_symptom_banner is the inner loop's); test_layers checks the strip's HTML
def test_web_strip_click_zooms_the_timeline_to_the_cells_kernels(driver, base_url):
    driver.get(base_url + "/timeline")
    wait = WebDriverWait(driver, WAIT_S)
    strip = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#layer-strip .js-plotly-plot")))
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline-graph .js-plotly-plot")))
    assert "attributed to 24 layers" in driver.find_element(By.ID, "coverage").text
    tl = driver.find_element(By.ID, "timeline-graph")
    # A click that lands while Dash is still drawing the page (the strip re-rendered by the
    # first callbacks) can be lost, on a loaded machine: the user clicks again, so does the test
    # (3 clicks at most, found anew each time); the highlight must then follow from the click.
    for attempt in range(3):
        strip = driver.find_element(By.CSS_SELECTOR, "#layer-strip .js-plotly-plot")
        _click_cell(driver, strip, "7", "attention")
        try:
            WebDriverWait(driver, WAIT_S / 3).until(
                lambda d: (d.execute_script(_HIGHLIGHT, tl) or [None])[0] == "selected layer cell")
            break
        except TimeoutException:
            if attempt == 2:
                raise
    name, segments, rng = driver.execute_script(_HIGHLIGHT, tl)
    assert segments == 5 and rng is not None and rng[1] - rng[0] < 1.0
