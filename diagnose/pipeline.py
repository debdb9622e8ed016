"""load -> analyze -> verdicts: the one path from a trace file to a report.

:func:`run_analysis` loads and analyses a trace (an :class:`~diagnose.analyzers.Analysis`);
:func:`attach_verdicts` evaluates the trace-scope rules on it: the only place verdicts are
attached to a report (the CLI, the web app, the fleet runner and the notebook API all call it).
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, Mapping

import msgspec

from diagnose.analyzers import Analysis, analyze
from diagnose.options import AnalysisOptions
from diagnose.trace import load_trace
from diagnose.trace.reading import Prefetch
from diagnose.trace.slice import parse_window, slice_trace


PROGRESS_MIN_BYTES = 100 * 10**6


def input_size(path: str) -> int:
    """Bytes to parse: the file size, or for gzip the uncompressed size from its trailer
    (ISIZE, modulo 2**32: a lower bound for files over 4 GiB). 0 when unreadable."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(f.read(4), "little"))
    except OSError:
        return 0


def run_analysis(path: str, options: AnalysisOptions | None = None, show_progress: bool = False,
                 prefetch: Prefetch | None = None, workers: int | None = None) -> Analysis:
    """Load ``path`` and run every analyzer.

    Args:
        path: trace file (Kineto JSON, optionally gzipped, or nsys SQLite).
        options: every analysis option (``window``, ``device`` and ``lenient`` apply to the load).
        show_progress: draw a progress bar on stderr (when it is a terminal) for inputs over
            100 MB (uncompressed).
        prefetch: a :class:`~diagnose.trace.reading.Prefetch` already reading ``path``.
        workers: processes for decoding a large Kineto file (None: one per CPU, up to 4).

    Raises:
        DiagnoseError: unusable input or options.
    """
    opts = options or AnalysisOptions()
    window, device, lenient = opts.window, opts.device, opts.lenient
    window_ms = parse_window(window)

    def load(progress=None):
        trace = load_trace(path, lenient=lenient, progress=progress, prefetch=prefetch, workers=workers)
        if window_ms is not None or device is not None:
            slice_trace(trace, window_ms, device)
        return trace

    size = input_size(path) if show_progress else 0
    console = None
    if size >= PROGRESS_MIN_BYTES and os.path.getsize(path) >= 5 * 10**6 and _may_be_terminal():
        from rich.console import Console

        console = Console(stderr=True)
    if console is None or not console.is_terminal:
        return analyze(load(), opts)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # auto_refresh off: no refresh thread, so the loader may fork decoding workers (it never
    # forks while other threads run); the bar is redrawn on each progress call instead
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=True, auto_refresh=False) as bar:
        task = bar.add_task(f"reading {os.path.basename(path)} ({size / 1e6:,.0f} MB)", total=1.0)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=0.9 * done / max(total, 1), refresh=True)

        trace = load(progress)
        bar.update(task, completed=0.9, description="analysing", refresh=True)
        result = analyze(trace, opts)
        bar.update(task, completed=1.0)
    return result


def _may_be_terminal() -> bool:
    """Whether rich's console could find stderr a terminal (``Console.is_terminal``: stderr a
    TTY, or ``TTY_COMPATIBLE`` / ``FORCE_COLOR`` set): when not, no progress bar and rich is not
    imported (~10 ms)."""
    env = os.environ
    return bool(env.get("TTY_COMPATIBLE")) or env.get("FORCE_COLOR") is not None or sys.stderr.isatty()


def report_devices(report) -> list[int | None]:
    """The devices the rules read, in id order: every device with an ``all`` phase row (GPU
    activity), or ``[None]`` for a report without one."""
    devs = sorted({p.device for p in report.phases if p.name == "all" and p.device is not None})
    return devs or [None]


class DeviceRun(msgspec.Struct):
    """The rules evaluated on one device: its findings, labels and verdicts."""

    device: int | None
    findings: dict
    verdicts: Any


def evaluate_devices(report, ruleset, device: int | None = None, scopes=("trace",), extra: Mapping | None = None,
                     include_unreliable: bool = False, savings=None) -> tuple[list[DeviceRun], Any]:
    """Evaluate the rules of ``scopes`` on every device of ``report`` (only ``device`` when
    given), each on its own findings (:func:`diagnose.findings.flatten`) with ``extra``
    findings added (a metrics file's), and merge the verdicts. ``savings``: a fired rule's
    predicted step-time saving (:func:`diagnose.analyzers.whatif.rule_saving_ms`).

    Returns:
        (one :class:`DeviceRun` per device, the merged :class:`~diagnose.engine.Verdicts`):
        fired symptoms of every device, each with its ``device``, ranked together
        (:func:`diagnose.engine.evaluate.rank_symptoms`: the first is the finding of largest
        stake across devices); passed entries of every device; a rule in ``not_evaluated``
        only when no device evaluated it (with the first device's reason).

    Raises:
        DiagnoseError: ``device`` is not in the report.
        RuleError: invalid overrides.
    """
    from diagnose.engine import Verdicts, evaluate
    from diagnose.engine.evaluate import rank_symptoms
    from diagnose.findings import flatten, labels, select_device, unreliable_findings

    devices = [select_device(report, device)] if device is not None else report_devices(report)
    runs = []
    for dev in devices:
        f = flatten(report, dev, include_unreliable=include_unreliable)
        f.update(extra or {})
        v = evaluate(ruleset.rules, f, scope=list(scopes), overrides=ruleset.overrides,
                     unreliable=() if include_unreliable else unreliable_findings(report, dev), labels=labels(report, dev),
                     savings=savings)
        for e in v.symptoms + v.passed:
            e["device"] = dev
        runs.append(DeviceRun(dev, f, v))
    merged = Verdicts()
    merged.symptoms = [dict(sym) for r in runs for sym in r.verdicts.symptoms]
    merged.passed = [e for r in runs for e in r.verdicts.passed]
    done = {e["id"] for e in merged.symptoms + merged.passed}
    seen: set[str] = set()
    for r in runs:
        for n in r.verdicts.not_evaluated:
            if n["id"] not in done and n["id"] not in seen:
                seen.add(n["id"])
                merged.not_evaluated.append(n)
    rank_symptoms(merged.symptoms, {r.id: r.kind for r in ruleset.rules})
    return runs, merged


def attach_verdicts(analysis_or_report, ruleset=None, device: int | None = None):
    """Evaluate the trace-scope rules on every device of the report (only ``device`` when
    given; :func:`evaluate_devices`) and put ``findings`` (the lead device's), ``headline``
    (the fired symptom of largest stake across devices, naming its device when the trace has
    several), ``symptoms`` (every device's, ranked together), ``not_evaluated`` and
    ``device_verdicts`` (each device's own headline) into the report. The only place verdicts
    are attached to a report.

    Args:
        analysis_or_report: an :class:`~diagnose.analyzers.Analysis` (its ``report`` is
            replaced), a :class:`~diagnose.model.Report` or a JSON report dict.
        ruleset: a :class:`diagnose.engine.RuleSet` (thresholds, disabled rules); None for the
            packaged rules with their default thresholds.
        device: the only device whose numbers the rules read (default: every device).

    Returns:
        The report with its verdicts, of the kind given (an Analysis gives its new
        :class:`~diagnose.model.Report`; a dict is updated in place and returned).

    Raises:
        RuleError: invalid rules or overrides.
        DiagnoseError: ``device`` is not in the report.
    """
    import msgspec

    from diagnose.engine import load_ruleset
    from diagnose.engine.evaluate import headline_of
    from diagnose.findings import as_report, labels
    from diagnose.model import DeviceVerdict, Headline, NotEvaluated, Symptom

    rs = ruleset if ruleset is not None else load_ruleset()
    is_analysis = isinstance(analysis_or_report, Analysis)
    report = as_report(analysis_or_report.report if is_analysis else analysis_or_report)
    savings = None
    # the critical path is the steps', across devices: it predicts a rule's saving only when
    # the trace has one device (else each device's rules are ranked by their own stake)
    if is_analysis and analysis_or_report.paths is not None and len(report_devices(report)) <= 1:
        from diagnose.analyzers.whatif import rule_saving_ms

        a = analysis_or_report
        main_phase = labels(report, device).get("trace.main_phase")

        from diagnose.findings import device_rows, main_row, roofline_speedup

        def _saving(rule):  # the one ranking rule: predicted saving where the path exists
            spec = rule.whatif
            if spec.get("roofline"):  # kernel-table findings: the main phase's kernels at their roofline
                row = main_row(device_rows(report, device))
                speedup = {} if row is None else roofline_speedup(row, spec["roofline"])
                if not speedup:
                    return None
                spec = {"speedup": {k: ("inf" if math.isinf(v) else v) for k, v in speedup.items()}, "phase": "main"}
            return rule_saving_ms(a.paths, a.steps, rule.phase, spec, main_phase)

        savings = _saving
    runs, merged = evaluate_devices(report, rs, device, savings=savings)
    several = len(runs) > 1
    h = headline(headline_of(merged.symptoms), report, several)
    lead = h["device"] if h is not None and h.get("device") is not None else runs[0].device
    findings = next(r.findings for r in runs if r.device == lead)
    per_device = []
    for r in runs:
        dh = headline(headline_of([dict(s, device=r.device) for s in r.verdicts.symptoms]), report, several)
        per_device.append(DeviceVerdict(device=r.device, headline=None if dh is None else msgspec.convert(dh, Headline),
                                        fired=[s["id"] for s in r.verdicts.symptoms],
                                        worst=r.verdicts.symptoms[0]["severity"] if r.verdicts.symptoms else None))
    out = msgspec.structs.replace(
        report, findings=findings, headline=None if h is None else msgspec.convert(h, Headline, from_attributes=False),
        symptoms=msgspec.convert(merged.symptoms, list[Symptom]),
        not_evaluated=msgspec.convert(merged.not_evaluated, list[NotEvaluated]),
        device_verdicts=per_device)
    if is_analysis:
        analysis_or_report.report = out
        return out
    if isinstance(analysis_or_report, dict):
        analysis_or_report.update({k: v for k, v in out.to_dict().items()
                                   if k in ("findings", "headline", "symptoms", "not_evaluated", "device_verdicts")})
        return analysis_or_report
    return out


#: Trace types that change what the report can say (vocab.QUALITY_CODES), most decisive first:
#: the headline's caveat, or the headline itself when no rule fired.
TRACE_TYPE_HEADLINES = {
    "graph_capture": "this is a CUDA/HIP graph capture pass: nothing executed, so no timing conclusion; profile a replay "
                     "(and give this file as --capture-trace to map the replay's kernels to ops)",
    "training_trace": "a training step (backward pass, optimizer): no prefill/decode reading applies",
    "vision_forward": "a convolutional (vision) forward, not LLM serving: no prefill/decode reading applies",
    "diffusion_loop": "a loop of identical GEMM + attention steps without KV cache or sampler (a diffusion denoising loop), "
                      "not LLM serving: no prefill/decode reading applies",
    "encoder_forward": "a bidirectional (encoder) transformer forward, not LLM serving: no prefill/decode reading applies",
    "fragment": "the window holds part of a forward: TPOT, MBU and the bound ratio cannot be read from it",
    "no_gpu_activity": "no GPU activity in the trace: nothing to say about GPU time",
    "cold_start": "first-iteration costs (lazy loading, compilation) are in the window: profile a warmed-up iteration",
}


def headline(h: dict | None, report, name_device: bool = False) -> dict | None:
    """The one verdict the report leads with: the top fired rule's (text, rule_id, cause,
    device, ms, share, share_of; :func:`diagnose.engine.evaluate.headline_of`), its text
    prefixed with the device when ``name_device`` (a trace of several devices), with a
    ``caveat`` when the trace type limits what it can mean; when no rule fired, what the
    trace type says (a capture pass, a fragment...), else None."""
    codes = [q.code for q in report.quality]
    kinds = [c for c in TRACE_TYPE_HEADLINES if c in codes]
    if h is not None and name_device and h.get("device") is not None:
        h = {**h, "text": f"device {h['device']}: {h['text']}"}
    if h is None:
        if not kinds:
            return None
        text = TRACE_TYPE_HEADLINES[kinds[0]]
        if kinds[0] == "no_gpu_activity" and report.partial:
            text = text.replace("in the trace", "in the readable part of this partial trace")
        return {"text": text, "rule_id": None, "cause": kinds[0], "device": None, "ms": None, "share": None, "share_of": None}
    if kinds:
        h = {**h, "caveat": TRACE_TYPE_HEADLINES[kinds[0]]}
    return h


# ---------------------------------------------------------------- each device's headline, for the views


def device_headlines(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per device the rules read, when they read more than one: ``{"device", "text",
    "rule_id", "severity"}``; "text" is that device's headline ("no symptom rule fired" when
    none did). Empty for a report of one device or without verdicts."""
    dv = report.get("device_verdicts") or []
    if len(dv) < 2:
        return []
    out = []
    for v in dv:
        h = v.get("headline") or {}
        text = h.get("text") or "no symptom rule fired"
        prefix = f"device {v.get('device')}: "
        out.append({"device": v.get("device"), "text": text[len(prefix):] if text.startswith(prefix) else text,
                    "rule_id": h.get("rule_id"), "severity": v.get("worst")})
    return out


def device_headline_lines(report: Mapping[str, Any]) -> list[str]:
    """:func:`device_headlines` as lines: "device 0: GPU idle 20% of ..."."""
    return [f"device {h['device']}: {h['text']}" for h in device_headlines(report)]


def top_symptoms_text(report: Mapping[str, Any]) -> str | None:
    """The fleet table's "top symptom" of a rank: the lead rule id, or each device's
    ("0: S3-gpu-idle; 1: —") when the rank's trace holds several devices."""
    heads = device_headlines(report)
    if heads:
        return "; ".join(f"{h['device']}: {h['rule_id'] or '—'}" for h in heads)
    syms = report.get("symptoms") or []
    return syms[0]["id"] if syms else None


def ensure_verdicts(report: dict, ruleset=None) -> dict:
    """:func:`attach_verdicts` on a report dict that has no ``symptoms`` yet (a report that has
    them is left as it is). When the rules fail, the report gets no verdicts and
    ``report["verdicts_error"]`` says why (the web and HTML reports show it)."""
    if report.get("symptoms") is not None:
        return report
    try:
        attach_verdicts(report, ruleset)
    except Exception as e:  # noqa: BLE001 - a broken rule must not take the report down
        report.pop("symptoms", None)
        report["verdicts_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return report


def diagnose_trace(path: str, options: AnalysisOptions | None = None, ruleset=None, **load_kw) -> Analysis:
    """:func:`run_analysis` + :func:`attach_verdicts`: the analysis with its verdicts."""
    analysis = run_analysis(path, options, **load_kw)
    attach_verdicts(analysis, ruleset, options.device if options else None)
    return analysis
