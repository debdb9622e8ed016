"""Sweeps: several traces of one setup at different context / batch / GPU count / prompt
length, reduced to ``sweep.*`` findings for the sweep-scope rules (S1, S4, prefill MFU).

A point per trace (:func:`sweep_points`): labels (``--label ctx=2048,bs=8``) win over the
values read from the step markers (median decode context and batch, devices with activity,
median prompt length).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from diagnose.analyzers.base import declared
from diagnose.errors import DiagnoseError
from diagnose.findings import Findings, as_report, report_findings
from diagnose.model import Report
from diagnose.numeric import div

FINDINGS = declared("sweep")


_LABEL_ALIASES = {
    "ctx": "ctx", "context": "ctx",
    "bs": "batch", "batch": "batch",
    "gpus": "gpus", "tp": "gpus", "n_gpus": "gpus", "world_size": "gpus",
    "prompt": "prompt", "toks": "prompt", "prompt_tokens": "prompt",
    "name": "name", "label": "name",
}


def parse_label(spec: str) -> dict[str, Any]:
    """``"ctx=2048,bs=8"`` -> ``{"ctx": 2048, "batch": 8}``.

    Keys: ctx|context, bs|batch, gpus|tp|n_gpus|world_size, prompt|toks|prompt_tokens
    (numbers) and name|label (free text).

    Raises:
        DiagnoseError: malformed pair, unknown key, or a non-numeric value.
    """
    out: dict[str, Any] = {}
    for part in (x.strip() for x in spec.replace(";", ",").split(",")):
        if not part:
            continue
        if "=" not in part:
            raise DiagnoseError(f"--label expects KEY=VALUE[,KEY=VALUE], got {spec!r}")
        k, v = (s.strip() for s in part.split("=", 1))
        key = _LABEL_ALIASES.get(k.lower())
        if key is None:
            raise DiagnoseError(f"--label: unknown key {k!r} (use ctx, bs, gpus, prompt or name)")
        if key == "name":
            out[key] = v
            continue
        try:
            num = float(v)
        except ValueError:
            raise DiagnoseError(f"--label {k}: {v!r} is not a number") from None
        if not math.isfinite(num) or num <= 0:
            raise DiagnoseError(f"--label {k}: must be a positive number, got {v!r}")
        out[key] = int(num) if num.is_integer() else num
    return out


def sweep_points(reports: Sequence[Report | Mapping[str, Any]], labels: Sequence[Mapping[str, Any] | str | None] | None = None,
                 device: int | None = None, devices: Sequence[int | None] | None = None) -> list[dict[str, Any]]:
    """One point per report: name, ctx, batch, gpus, prompt, tpot_ms, throughput_tok_s, prefill_mfu,
    decode_comm_share, device. Labels win over values read from step markers. ``devices``: the
    device read in each report (a pairing of :func:`diagnose.findings.pair_devices`; default
    ``device`` in every report)."""
    labels = list(labels) if labels else [None] * len(reports)
    if len(labels) != len(reports):
        raise DiagnoseError(f"{len(labels)} labels for {len(reports)} traces: give one --label per --trace, or none")
    devs = list(devices) if devices is not None else [device] * len(reports)
    pts = []
    for i, (rep, lab, dev) in enumerate(zip(reports, labels, devs)):
        lab = parse_label(lab) if isinstance(lab, str) else dict(lab or {})
        rep = as_report(rep)
        f = report_findings(rep, dev)
        tpot = f.get("latency.tpot_p50_ms")
        if tpot is None:
            tpot = f.get("latency.decode_step_p50_ms")
        batch = lab.get("batch", f.get("steps.decode_p50_batch"))
        pt = {
            "name": lab.get("name") or rep.source.path or f"trace{i + 1}",
            "ctx": lab.get("ctx", f.get("steps.decode_p50_context")),
            "batch": batch,
            "gpus": lab.get("gpus", f.get("trace.device_count") or None),
            "prompt": lab.get("prompt", f.get("steps.prefill_p50_prompt_tokens")),
            "tpot_ms": tpot,
            "throughput_tok_s": div(batch * 1000.0, tpot) if batch is not None else None,
            "prefill_mfu": f.get("prefill.mfu"),
            "decode_comm_share": f.get("decode.comm_share"),
            "device": f.get("trace.device"),
        }
        pts.append(pt)
    return pts


def _mode(values: list) -> Any:
    counts: dict[Any, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda k: (counts[k], -(k if isinstance(k, (int, float)) else 0))) if counts else None


def _series(points: list[dict], x: str, y: str, hold: str) -> list[tuple[float, float]]:
    """(x, mean y) per distinct x among points with x and y known, holding ``hold`` at the
    value shared by the most distinct x (points with ``hold`` unknown join every group)."""
    usable = [p for p in points if p.get(x) is not None and p.get(y) is not None]
    if not usable:
        return []
    holds = {p.get(hold) for p in usable if p.get(hold) is not None}
    if len(holds) > 1:
        best = max(sorted(holds), key=lambda h: len({p[x] for p in usable if p.get(hold) in (h, None)}))
        usable = [p for p in usable if p.get(hold) in (best, None)]
    groups: dict[float, list[float]] = {}
    for p in usable:
        groups.setdefault(p[x], []).append(p[y])
    return sorted((k, sum(v) / len(v)) for k, v in groups.items())


def sweep_findings(points: list[dict[str, Any]]) -> Findings:
    """``sweep.*`` findings from :func:`sweep_points` (see the catalog for definitions)."""
    out: Findings = {"sweep.points": len(points)}
    ctx = _series(points, "ctx", "tpot_ms", "batch")
    out["sweep.ctx_points"] = len(ctx)
    for k in ("ctx_min", "ctx_max", "tpot_ctx_slope_ms_per_1k", "tpot_ctx_slope_r2", "tpot_ctx_growth", "ctx_ratio"):
        out[f"sweep.{k}"] = None
    if len(ctx) >= 2:
        xs = [c for c, _ in ctx]
        ys = [t for _, t in ctx]
        fit = statistics.linear_regression(xs, ys)
        out["sweep.ctx_min"], out["sweep.ctx_max"] = xs[0], xs[-1]
        out["sweep.tpot_ctx_slope_ms_per_1k"] = fit.slope * 1000.0
        out["sweep.tpot_ctx_slope_r2"] = statistics.correlation(xs, ys) ** 2 if len(set(ys)) > 1 else 0.0
        out["sweep.tpot_ctx_growth"] = div(ys[-1], ys[0])
        out["sweep.ctx_ratio"] = div(xs[-1], xs[0])

    bat = _series(points, "batch", "throughput_tok_s", "ctx")
    tpb = dict(_series(points, "batch", "tpot_ms", "ctx"))
    out["sweep.batch_points"] = len(bat)
    for k in ("batch_max", "batch_prev", "throughput_last_tok_s", "throughput_prev_tok_s",
              "throughput_gain_last_batch_doubling", "throughput_gain_total", "tpot_batch_growth_last"):
        out[f"sweep.{k}"] = None
    if len(bat) >= 2:
        (_, t0), (bp, tprev), (bl, tl) = bat[0], bat[-2], bat[-1]
        out["sweep.batch_max"], out["sweep.batch_prev"] = bl, bp
        out["sweep.throughput_last_tok_s"], out["sweep.throughput_prev_tok_s"] = tl, tprev
        doublings = math.log2(bl / bp)
        gain = div(tl, tprev)
        out["sweep.throughput_gain_last_batch_doubling"] = gain ** (1.0 / doublings) if gain and doublings > 0 else None
        out["sweep.throughput_gain_total"] = div(tl, t0)
        out["sweep.tpot_batch_growth_last"] = div(tpb.get(bl), tpb.get(bp))

    gp = _series(points, "gpus", "tpot_ms", "batch")
    for k in ("gpus_min", "gpus_max", "tpot_fewest_gpus_ms", "tpot_most_gpus_ms", "tp_tpot_ratio", "decode_comm_share_most_gpus"):
        out[f"sweep.{k}"] = None
    if len(gp) >= 2:
        (g0, t0), (gn, tn) = gp[0], gp[-1]
        out["sweep.gpus_min"], out["sweep.gpus_max"] = g0, gn
        out["sweep.tpot_fewest_gpus_ms"], out["sweep.tpot_most_gpus_ms"] = t0, tn
        out["sweep.tp_tpot_ratio"] = div(tn, t0)
        comm = [p["decode_comm_share"] for p in points if p.get("gpus") == gn and p.get("decode_comm_share") is not None]
        out["sweep.decode_comm_share_most_gpus"] = max(comm) if comm else None

    pf = _series(points, "prompt", "prefill_mfu", "batch")
    for k in ("prefill_prompt_short", "prefill_prompt_long", "prefill_mfu_short", "prefill_mfu_long", "prefill_mfu_short_over_long"):
        out[f"sweep.{k}"] = None
    if len(pf) >= 2:
        (ps, ms), (pl, ml) = pf[0], pf[-1]
        out["sweep.prefill_prompt_short"], out["sweep.prefill_prompt_long"] = ps, pl
        out["sweep.prefill_mfu_short"], out["sweep.prefill_mfu_long"] = ms, ml
        out["sweep.prefill_mfu_short_over_long"] = div(ms, ml)
    return out
