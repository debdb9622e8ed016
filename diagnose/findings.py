"""The findings layer between the analyzers and the rules.

A JSON report (``Analysis.to_dict()``) is flattened by :func:`findings_from_report` into a
numbers-only namespace with stable dotted names (``decode.launch_gap_share``,
``latency.tpot_p99_ms``...): each analyzer of :data:`diagnose.analyzers.ANALYZERS` flattens
its own part of the report (``findings_of_phase`` per phase row, ``findings`` for the rest)
and declares the names it produces (``FINDINGS``). The catalog is built from those
declarations plus the trace-level findings below, the sweep (:mod:`diagnose.sweep`), compare
(:mod:`diagnose.compare`) and metrics ones (:mod:`diagnose.catalog`), so a metric's name, unit and computation are
one grep apart. ``docs/rules.md`` documents the catalog.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from diagnose.analyzers import ANALYZERS
from diagnose.analyzers.base import declared, quality_counts, sanitize_code
from diagnose.errors import DiagnoseError
from diagnose.inputs import parsing, read_text_file
from diagnose.numeric import Number, num
from diagnose.vocab import PHASES, QUALITY_CODES, STEP_PHASES, UNRELIABLE_CODES

Findings = dict[str, Number | None]

TRACE_FINDINGS = declared("trace", unreliable_codes=", ".join(UNRELIABLE_CODES))

#: Text values rules may print (``labels:`` in a rule); never compared, only shown.
LABELS = declared("labels")

METRICS_FINDINGS = declared("metrics")


def select_device(report: Mapping[str, Any], device: int | None = None) -> int | None:
    """Device whose phases the findings describe: ``device`` if given, else most GPU busy.

    Raises:
        DiagnoseError: ``device`` is not one of the report's devices.
    """
    phases = list(report.get("phases") or [])
    alls = [p for p in phases if p.get("name") == "all"]
    if not alls:  # reports without an "all" row: any phase stands for its device
        by_dev: dict[Any, dict] = {}
        for p in phases:
            by_dev.setdefault(p.get("device"), p)
        alls = list(by_dev.values())
    devs = [p.get("device") for p in alls]
    if device is not None:
        if device not in devs:
            known = ", ".join(str(d) for d in devs if d is not None) or "none"
            raise DiagnoseError(f"device {device} is not in the trace (devices with GPU activity: {known})")
        return device
    if not alls:
        return None
    best = max(alls, key=lambda p: (num(p.get("gpu_busy_ms")) or 0.0, -(p.get("device") or 0)))
    return best.get("device")


def _main_row(rows: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The step phase row with the most own time (``trace.main_phase``), else the ``all`` row."""

    steps = [p for p in rows if p.get("name") in STEP_PHASES]
    if steps:
        return max(steps, key=lambda p: num(p.get("own_ms")) or 0.0)
    return next((p for p in rows if p.get("name") == "all"), None)


def unreliable_findings(report: Mapping[str, Any], device: int | None = None) -> set[str]:
    """Dotted names of the selected device's phase numbers the report marks unreliable
    (each phase's ``unreliable`` list, e.g. idle and launch-gap shares when graph coverage is low)."""
    dev = select_device(report, device)
    out: set[str] = set()
    rows = [p for p in report.get("phases") or [] if p.get("device") == dev and p.get("name") in PHASES]
    for p in rows:
        out |= {f"{p['name']}.{k}" for k in p.get("unreliable") or []}
    main = _main_row(rows)
    if main is not None:
        out |= {f"main.{k}" for k in main.get("unreliable") or []}
    return out


def findings_from_report(report: Mapping[str, Any], device: int | None = None, include_unreliable: bool = False) -> Findings:
    """Flatten one JSON report into ``{dotted name: number or None}``.

    Args:
        report: ``Analysis.to_dict()`` (schema_version 1).
        device: GPU device id for the ``<phase>.*`` findings; default the device with the
            most GPU busy time (ties: lowest id).
        include_unreliable: keep numbers a phase lists under ``unreliable`` (default: they
            become None, so rules that need them are not evaluated).

    Returns:
        Numbers only (ints, floats; flags as 0/1); None where a value is unknown. Names are
        listed in :func:`catalog`.

    Raises:
        DiagnoseError: ``device`` is not in the report.
    """
    out: Findings = {}
    dev = select_device(report, device)
    rows = [p for p in report.get("phases") or [] if p.get("device") == dev and p.get("name") in PHASES]
    main = _main_row(rows)
    for p in rows + ([{**main, "name": "main"}] if main is not None else []):
        for module in ANALYZERS:
            f = getattr(module, "findings_of_phase", None)
            if f is not None:
                f(p, out)
    for module in ANALYZERS:
        f = getattr(module, "findings", None)
        if f is not None:
            f(report, dev, out)
    _trace_findings(report, out)
    if not include_unreliable:
        for name in unreliable_findings(report, dev):
            if name in out:
                out[name] = None
    return out


def _trace_findings(report: Mapping[str, Any], out: Findings) -> None:
    codes = quality_counts(report)
    for c in QUALITY_CODES:
        out[f"quality.{c}"] = codes.get(c, 0)
    for c, v in codes.items():
        out[f"quality.{c}"] = v
    partial = 1 if report.get("partial") else 0
    out["trace.partial"] = partial
    out["trace.unreliable"] = 1 if partial or any(codes.get(c) for c in UNRELIABLE_CODES) else 0
    ratios = [out[k] for k in out if k.endswith(".bandwidth_over_peak") and out[k] is not None]
    out["trace.max_bandwidth_over_peak"] = max(ratios) if ratios else None
    if codes.get("bandwidth_above_peak"):
        out["trace.bandwidth_above_peak"] = 1
    elif ratios:
        out["trace.bandwidth_above_peak"] = 1 if max(ratios) > 1.0 else 0
    else:
        out["trace.bandwidth_above_peak"] = None


def labels_from_report(report: Mapping[str, Any], device: int | None = None) -> dict[str, str]:
    """Text labels (:data:`LABELS`) of the selected device's report rows."""
    from diagnose.analyzers.categories import base_name

    dev = select_device(report, device)
    rows = {p["name"]: p for p in report.get("phases") or [] if p.get("device") == dev and p.get("name") in PHASES}
    out: dict[str, str] = {}
    own = {n: num(rows[n].get("own_ms")) or 0.0 for n in STEP_PHASES if n in rows}
    out["trace.main_phase"] = max(own, key=lambda n: own[n]) if own else "the trace"
    main = _main_row(list(rows.values()))
    if main is not None:
        rows = {**rows, "main": main}
    for n, p in rows.items():
        top = p.get("top_kernels") or []
        if top:
            out[f"{n}.top_kernel"] = base_name(str(top[0].get("name") or ""))[:80]
        cats = {c: v for c, v in (p.get("categories_ms") or {}).items() if c not in ("memcpy", "memset")}
        if cats:
            out[f"{n}.top_category"] = max(cats, key=lambda c: cats[c])
    a = rows.get("all") or {}
    by = a.get("idle_by_cause_ms") or {}
    if by:
        out["all.top_idle_cause"] = max(by, key=lambda c: by[c])
    longest = (a.get("gaps") or {}).get("longest") or []
    if longest:
        g0 = longest[0]
        out["all.longest_gap_host_call"] = (g0.get("host_call") or (f"queued after {g0['waited_on']}" if g0.get("waited_on") else None)
                                            or "nothing in the trace")
    hb = [g for g in longest if g.get("cause") == "host_blocked"]
    if hb:
        out["all.longest_host_blocked_call"] = max(hb, key=lambda g: g["ms"]).get("host_call") or "an unnamed call"
    return out


def findings_from_metrics(metrics: Mapping[str, Any]) -> Findings:
    """``metrics.*`` from a metrics JSON object (e.g. ``{"perplexity_baseline": 5.1,
    "perplexity_candidate": 5.3}``): every numeric top-level key, plus
    ``metrics.perplexity_change`` and ``metrics.spec_acceptance_rate``.

    Raises:
        DiagnoseError: ``metrics`` is not a JSON object.
    """
    if not isinstance(metrics, Mapping):
        raise DiagnoseError("metrics file must hold a JSON object of numbers, e.g. {\"perplexity_baseline\": 5.1, \"perplexity_candidate\": 5.3}")
    out: Findings = {}
    for k, v in metrics.items():
        n = num(v)
        if n is not None and not isinstance(v, str):
            out[f"metrics.{sanitize_code(k)}"] = n
    pb, pc = out.get("metrics.perplexity_baseline"), out.get("metrics.perplexity_candidate")
    out["metrics.perplexity_change"] = (pc / pb - 1.0) if pb and pc is not None else None
    acc = out.get("metrics.spec_acceptance_rate", out.get("metrics.acceptance_rate"))
    out["metrics.spec_acceptance_rate"] = acc
    return out


def load_metrics(path: str) -> Findings:
    """Read a metrics JSON file and return :func:`findings_from_metrics`.

    Raises:
        DiagnoseError: missing, unreadable or not a JSON object.
    """
    text = read_text_file(path, "metrics file")  # size bound, byte-order marks
    try:
        with parsing(f"metrics file {path}"):
            data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiagnoseError(f"metrics file {path} is not JSON: {e.msg} at line {e.lineno}") from None
    return findings_from_metrics(data)
