"""Headless Chromium for the browser tests (Debian's ``chromium`` + ``chromium-driver``):
the skip when it is absent, one driver, and the Dash app served on a free local port.

Import it at the top of a browser test module: it skips the module (``pytest.skip`` at
module level) when /usr/bin/chromium, a chromedriver, Dash or selenium is missing.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not CHROMIUM.exists() or not (CHROMEDRIVER.exists() or shutil.which("chromedriver")):
    pytest.skip("headless Chromium not installed (apt-get install chromium chromium-driver)", allow_module_level=True)
pytest.importorskip("dash")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

#: Seconds a test waits for the page to reach a state.
WAIT_S = 30


@contextlib.contextmanager
def chrome(browser_log: bool = False):
    """A headless Chromium driver at 1400x1000, quit on exit; ``browser_log`` keeps the
    console log (``driver.get_log("browser")``)."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--no-first-run", "--window-size=1400,1000"):
        opts.add_argument(a)
    if browser_log:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    path = str(CHROMEDRIVER) if CHROMEDRIVER.exists() else shutil.which("chromedriver")
    d = webdriver.Chrome(service=Service(path), options=opts)
    try:
        yield d
    finally:
        d.quit()


@contextlib.contextmanager
def served(app):
    """The Dash ``app`` served on 127.0.0.1 at a free port in a thread; yields its base URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = make_server("127.0.0.1", 0, app.server, threaded=True)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}"
    finally:
        srv.shutdown()
        th.join(timeout=10)
