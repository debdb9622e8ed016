"""load -> analyze -> verdicts: the one path from a trace file to a report.

:func:`run_analysis` loads and analyses a trace (an :class:`~diagnose.analyzers.Analysis`);
:func:`attach_verdicts` evaluates the trace-scope rules on it: the only place verdicts are
attached to a report (the CLI, the web app, the fleet runner and the notebook API all call it).
"""
from __future__ import annotations

import os

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
    if size >= PROGRESS_MIN_BYTES and os.path.getsize(path) >= 5 * 10**6:
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


def attach_verdicts(analysis_or_report, ruleset=None, device: int | None = None):
    """Flatten the report into the rules' findings (:func:`diagnose.findings.flatten`),
    evaluate the trace-scope rules on them and put ``findings``, ``headline``, ``symptoms``
    and ``not_evaluated`` into the report. The only place verdicts are attached to a report.

    Args:
        analysis_or_report: an :class:`~diagnose.analyzers.Analysis` (its ``report`` is
            replaced), a :class:`~diagnose.model.Report` or a JSON report dict.
        ruleset: a :class:`diagnose.engine.RuleSet` (thresholds, disabled rules); None for the
            packaged rules with their default thresholds.
        device: the device whose numbers the rules read (default: the most GPU busy time).

    Returns:
        The report with its verdicts, of the kind given (an Analysis gives its new
        :class:`~diagnose.model.Report`; a dict is updated in place and returned).

    Raises:
        RuleError: invalid rules or overrides.
    """
    import msgspec

    from diagnose.engine import evaluate, load_ruleset
    from diagnose.findings import as_report, flatten, labels, unreliable_findings
    from diagnose.model import Headline, NotEvaluated, Symptom

    rs = ruleset if ruleset is not None else load_ruleset()
    is_analysis = isinstance(analysis_or_report, Analysis)
    report = as_report(analysis_or_report.report if is_analysis else analysis_or_report)
    findings = flatten(report, device)
    lab = labels(report, device)
    savings = None
    if is_analysis and analysis_or_report.paths is not None:
        from diagnose.analyzers.whatif import rule_saving_ms

        a = analysis_or_report

        def _saving(rule):  # the one ranking rule: predicted saving where the path exists
            return rule_saving_ms(a.paths, a.steps, rule.phase, rule.whatif, lab.get("trace.main_phase"))

        savings = _saving

    verdicts = evaluate(rs.rules, findings, scope="trace", overrides=rs.overrides,
                        unreliable=unreliable_findings(report, device), labels=lab, savings=savings)
    h = headline(verdicts, report)
    out = msgspec.structs.replace(
        report, findings=findings, headline=None if h is None else msgspec.convert(h, Headline, from_attributes=False),
        symptoms=msgspec.convert(verdicts.symptoms, list[Symptom]),
        not_evaluated=msgspec.convert(verdicts.not_evaluated, list[NotEvaluated]))
    if is_analysis:
        analysis_or_report.report = out
        return out
    if isinstance(analysis_or_report, dict):
        analysis_or_report.update({k: v for k, v in out.to_dict().items()
                                   if k in ("findings", "headline", "symptoms", "not_evaluated")})
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


def headline(verdicts, report) -> dict | None:
    """The one verdict the report leads with: the top fired rule's (text, rule_id, cause, ms,
    share), with a ``caveat`` when the trace type limits what it can mean; when no rule fired,
    what the trace type says (a capture pass, a fragment...), else None."""
    codes = [q.code for q in report.quality]
    kinds = [c for c in TRACE_TYPE_HEADLINES if c in codes]
    h = verdicts.headline
    if h is None:
        if not kinds:
            return None
        text = TRACE_TYPE_HEADLINES[kinds[0]]
        if kinds[0] == "no_gpu_activity" and report.partial:
            text = text.replace("in the trace", "in the readable part of this partial trace")
        return {"text": text, "rule_id": None, "cause": kinds[0], "ms": None, "share": None}
    if kinds:
        h = {**h, "caveat": TRACE_TYPE_HEADLINES[kinds[0]]}
    return h


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
