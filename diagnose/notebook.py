"""The notebook API: one call from a trace file to pandas DataFrames and the verdicts.

    >>> import diagnose
    >>> r = diagnose.analyze_trace("decode.json.gz", model_config="gpt-oss-20b", gpu="MI300X")
    >>> r.headline["text"]
    'decode is MoE-kernel-bound: 71% of kernel time (7.53 ms) in MoE expert kernels'
    >>> r.phases[["name", "own_ms", "mbu", "bound_ratio"]]
    >>> r.gaps.sort_values("ms", ascending=False).head()     # every idle gap, with its cause
    >>> r.kernels.head()                                      # which kernel to tune
    >>> r.findings["decode.launch_gap_share"]                 # the numbers the rules read
    >>> r.layers[["phase", "layer", "kernel_ms", "attention", "mlp"]]   # per-layer time

:func:`analyze_trace` takes the same options as the command line (``--model-config`` is
``model_config=...``, see :class:`~diagnose.options.AnalysisOptions`) plus the rule options
(``thresholds=["S3-launch-gaps.max_launch_gap_share=0.2"]``, ``rules_config=...``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analyzers.result import Analysis
from diagnose.options import AnalysisOptions, RuleOptions

#: Gaps beyond this count get no ``host_call`` in :attr:`Report.gaps` (the longest ones do).
MAX_NAMED_GAPS = 10_000


@dataclass
class Report:
    """One analysed trace with its verdicts. DataFrame properties are built on first access.

    Attributes:
        analysis: the :class:`~diagnose.analyzers.Analysis` (``analysis.trace`` is the
            normalized trace: gpu, runtime, cpu_ops, annotations frames).
        report: the JSON report (``diagnose run --format json``).
    """

    analysis: Analysis
    report: dict[str, Any] = field(repr=False)

    @property
    def headline(self) -> dict[str, Any] | None:
        """{text, rule_id, cause, ms, share[, caveat]}: what the report leads with."""
        return self.report.get("headline")

    @property
    def findings(self) -> dict[str, float | int | None]:
        """The rules' flat namespace (``decode.launch_gap_share``, ``latency.tpot_p99_ms``...):
        the numbers the verdicts read, as the report ships them."""
        return dict(self.report.get("findings") or {})

    @property
    def model(self):
        """The report as its typed record (:class:`diagnose.model.Report`)."""
        return self.analysis.report

    @property
    def symptoms(self) -> list[dict[str, Any]]:
        """Fired rules, ranked (time at stake first); ``grouped_under`` marks shared causes."""
        return list(self.report.get("symptoms") or [])

    @property
    def quality(self) -> pd.DataFrame:
        """code, message, count per data-quality issue."""
        return pd.DataFrame(self.report.get("quality") or [], columns=["code", "message", "count"])

    @cached_property
    def phases(self) -> pd.DataFrame:
        """One row per (phase, device): times in ms, shares in [0, 1], roofline numbers.
        Nested report fields (gaps, categories, top kernels) stay in ``report["phases"]``."""
        rows = []
        for p in self.report.get("phases") or []:
            rows.append({k: v for k, v in p.items() if not isinstance(v, (dict, list))})
        return pd.DataFrame(rows)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """The step table: one row per engine step (times in ns and ms as named; ``waits``
        and ``idle_by_cause_ms`` hold each step's waits)."""
        return self.analysis.steps.copy()

    @cached_property
    def activities(self) -> pd.DataFrame:
        """Every GPU activity with category, launch, step and phase columns."""
        a = self.analysis.activities
        return a.copy() if a is not None else pd.DataFrame()

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """The whole kernel table (one row per phase, op, input dims and kernel: achieved
        TFLOP/s and TB/s against the device peak); the report keeps its top rows."""
        kt = self.analysis.kernel_frame
        return kt.copy() if kt is not None else pd.DataFrame()

    @cached_property
    def layers(self) -> pd.DataFrame:
        """The layer x op-class table (README "Layers"): one row per (device, phase, part,
        layer) with ``kernel_ms``, one column per op class (ms; ``qkv``, ``attention``,
        ``o_proj``, ``mlp``, ``norm``, ``communication``, ``embedding``, ``lm_head``,
        ``sampler``, ``other``), the attainment columns, ``ratio_to_type_median`` and, per
        op class, ``<class>_ratio`` (over the class's median among the layers of the type)."""
        from diagnose.analyzers.layerseg import OP_CLASSES

        recs = []
        for r in self.report.get("layers") or []:
            rec = {k: v for k, v in r.items() if k not in ("op_class_ms", "class_ratio")}
            for c in OP_CLASSES:
                rec[c] = (r.get("op_class_ms") or {}).get(c, 0.0)
            for c, v in (r.get("class_ratio") or {}).items():
                rec[f"{c}_ratio"] = v
            recs.append(rec)
        return pd.DataFrame(recs)

    @cached_property
    def coverage(self) -> pd.DataFrame:
        """One row per device: kernel time attributed to the forward's layers and to
        operators, graph-replayed time, and the coverage line (``text``)."""
        return pd.DataFrame(self.report.get("coverage") or [])

    @cached_property
    def gaps(self) -> pd.DataFrame:
        """Every idle gap on every device, one row per idle interval: device, start_ms (from
        the trace start), ms, kind, cause, host_call (the host event that named its cause; for
        a queued gap among the :data:`MAX_NAMED_GAPS` longest, the call the host sat in),
        host_stack and waited_on (the :data:`MAX_NAMED_GAPS` longest), next (the activity after
        it), then ``<cause>_ms`` per cause with time: every piece's attribution."""
        from diagnose.analyzers.hostcause import HostCauses
        from diagnose.analyzers.waits import caused_gaps, describe, outside_waits_ns
        from diagnose.vocab import GAP_CAUSES, GAP_KINDS

        g = self.analysis.activities
        cols = ["device", "start_ms", "ms", "kind", "cause", "host_call", "host_stack", "waited_on", "next"]
        if g is None or len(g) == 0:
            return pd.DataFrame(columns=cols)
        host = self.analysis.host_index or HostCauses.build(self.analysis.trace, g, self.analysis.steps, {})
        t0 = int(self.analysis.t0_ns or 0)
        outside = outside_waits_ns(self.analysis.steps, t0)
        parts = []
        for dev in sorted(g["device"].unique()):
            sub = g[(g["device"] == dev).to_numpy()]
            st, cg, d = caused_gaps(sub, host, outside)
            if len(cg.start) == 0:
                continue
            dur = cg.end - cg.start
            calls = np.full(len(dur), None, dtype=object)
            nm = cg.named
            own = nm[nm["c"].to_numpy() == cg.cause[nm["q"].to_numpy()].astype(np.int64)]
            calls[own["q"].to_numpy(dtype=np.int64)] = own["name"].to_numpy(dtype=object)
            stacks = np.full(len(dur), None, dtype=object)
            waited = np.full(len(dur), None, dtype=object)
            top = np.argsort(-dur, kind="stable")[:MAX_NAMED_GAPS]
            for j, info in zip(top.tolist(), describe(cg, d, host, self.analysis.trace, top)):
                calls[j], stacks[j], waited[j] = info["host_call"], info["host_stack"], info["waited_on"]
            frame = pd.DataFrame({
                "device": int(dev), "start_ms": (cg.start - t0) / 1e6, "ms": dur / 1e6,
                "kind": np.asarray(GAP_KINDS, dtype=object)[st.gap_kind.astype(np.int64)],
                "cause": np.asarray(GAP_CAUSES, dtype=object)[cg.cause.astype(np.int64)],
                "host_call": calls, "host_stack": stacks, "waited_on": waited, "next": d.names[cg.next_idx]})
            for i, c in enumerate(GAP_CAUSES):
                if cg.parts[:, i].any():
                    frame[f"{c}_ms"] = cg.parts[:, i] / 1e6
            parts.append(frame)
        return pd.concat(parts, ignore_index=True).fillna({f"{c}_ms": 0.0 for c in GAP_CAUSES}) if parts else pd.DataFrame(columns=cols)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report."""
        return self.report


def analyze_trace(path: str, **options: Any) -> Report:
    """Analyse one trace file (Kineto JSON, optionally gzipped, or nsys SQLite) with its
    verdicts, for a notebook.

    Args:
        path: the trace file.
        **options: any field of :class:`~diagnose.options.AnalysisOptions` (model_config,
            gpu, peak_tflops, bandwidth_tbps, batch, context, prompt_len, weight_dtype,
            kv_dtype, tp, capture_trace, phase_regex, window, device, lenient) and of
            :class:`~diagnose.options.RuleOptions` (rules_dir, rules_config, thresholds).

    Returns:
        A :class:`Report`.

    Raises:
        DiagnoseError: unusable input or options (the message says which).
        TypeError: an unknown option name.
    """
    from diagnose.engine import load_ruleset
    from diagnose.pipeline import diagnose_trace

    a_names = {f.name for f in fields(AnalysisOptions)}
    r_names = {f.name for f in fields(RuleOptions)}
    unknown = sorted(set(options) - a_names - r_names)
    if unknown:
        raise TypeError(f"analyze_trace: unknown option(s) {', '.join(unknown)} (options: {', '.join(sorted(a_names | r_names))})")
    if isinstance(options.get("phase_regex"), str):
        options["phase_regex"] = (options["phase_regex"],)
    if isinstance(options.get("thresholds"), str):
        options["thresholds"] = (options["thresholds"],)
    opts = AnalysisOptions.from_kwargs(**{k: v for k, v in options.items() if k in a_names})
    ro = RuleOptions(**{k: (tuple(v) if k == "thresholds" else v) for k, v in options.items() if k in r_names})
    ruleset = load_ruleset(ro.rules_dir, ro.rules_config, ro.thresholds)
    analysis = diagnose_trace(path, opts, ruleset)
    return Report(analysis, analysis.to_dict())
