"""One denominator per share, printed with the number (issue 23): on every shared trace and
shipped sample, the headline's JSON ``share`` is the percentage its text prints (to the printed
digit) with the words of its ``share_of`` denominator, every fired symptom's ``share`` is of
the finding it names, and the terminal prints the same headline as the JSON.
"""
from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from test_golden import CASES

#: What each denominator reads as in a headline (diagnose.engine.rule.share_text), the printed
#: percentage first, then the denominator's own number when it has one.
SHARE_WORDS = {
    "kernel_time": r"(\d+(?:\.\d)?)% of kernel time",
    "phase_window": r"(\d+(?:\.\d)?)% of the (\d+\.\d+) ms GPU window",
    "busy_union": r"(\d+(?:\.\d)?)% of the (\d+\.\d+) ms of GPU busy time",
    "step_span": r"(\d+(?:\.\d)?)% of the steps' (\d+\.\d+) ms",
}
#: The finding each denominator is (its last segment), in the rule's phase.
#: A share of the phase window is of its own window, or of the whole window for time with an
#: external cause (which the own window leaves out).
SHARE_FINDINGS = {"kernel_time": ("kernel_busy_ms",), "phase_window": ("own_window_ms", "window_ms"),
                  "busy_union": ("gpu_busy_ms",), "step_span": ("own_ms",)}


def _printed(share: float, text: str, share_of: str, base_ms: float | None) -> None:
    m = re.search(SHARE_WORDS[share_of], text)
    assert m, f"{text!r} does not print its share as {share_of}"
    pct = m.group(1)
    decimals = len(pct.split(".")[1]) if "." in pct else 0
    assert float(pct) == round(share * 100, decimals), (pct, share, text)
    if m.lastindex == 2 and base_ms is not None:
        assert m.group(2) == (f"{base_ms:.1f}" if base_ms >= 1 else f"{base_ms:.3f}"), (m.group(2), base_ms)


@pytest.mark.slow  # every corpus file; test_golden already pins each report in the inner loop
@pytest.mark.parametrize("name,path,extra", CASES, ids=[c[0] for c in CASES])
def test_headline_share_is_the_printed_percentage_of_its_named_window(name, path, extra):
    from click.testing import CliRunner

    from diagnose.cli import main
    from diagnose.report.terminal import render_report

    r = CliRunner().invoke(main, ["run", "--trace", str(path), "--format", "json", *extra])
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.output)
    h = d.get("headline")
    for s in d.get("symptoms") or []:
        if "stake_ms" not in s:
            continue
        # each fired symptom with a stake: its share of the finding it names
        assert s["share_of"] in SHARE_WORDS, s["id"]
        base = s["share_base_ms"]
        assert s["share"] == pytest.approx(min(s["stake_ms"] / base, 1.0), abs=2e-6), s["id"]
        names = {k: v for k, v in s["evidence"]["findings"].items() if k.rpartition(".")[2] in SHARE_FINDINGS[s["share_of"]]}
        assert base in [pytest.approx(v, abs=1e-6) for v in names.values()], (s["id"], base, names)
        if s.get("headline"):
            _printed(s["share"], s["headline"], s["share_of"], base)
    if h and h.get("rule_id"):
        assert h["share_of"] in SHARE_WORDS and h["share"] is not None, h
        lead = next(s for s in d["symptoms"] if s["id"] == h["rule_id"] and s.get("device") == h["device"])
        _printed(h["share"], h["text"], h["share_of"], lead.get("share_base_ms"))
    elif h:  # what the trace type says: no share
        assert h["share"] is None and h["share_of"] is None
    # the terminal prints the JSON's headline
    buf = io.StringIO()
    render_report(d, Console(file=buf, width=400, force_terminal=False, color_system=None))
    lead_line = next((line for line in buf.getvalue().splitlines() if line.startswith("► ")), None)
    if h:
        assert lead_line == "► " + h["text"] + (f" [caveat: {h['caveat']}]" if h.get("caveat") else "")
