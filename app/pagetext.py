"""Words for the pages (web overview, HTML report, compare, KV page), from the project's own
tables: a finding by its catalog description or phase-table label, a threshold in words, a
device with the part whose peaks are used, where the KV page starts for a trace, and labels
that tell same-named trace files apart. No dash here: :mod:`diagnose.app.figures` and
:mod:`diagnose.app.server` render these."""
from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any, Mapping, Sequence

from diagnose.report import fmt
from diagnose.vocab import LEVERS, SEVERITY_COLORS, STEP_PHASES

NA = "not available"  # a missing value on the web (diagnose.app.figures.NA)


#: How a finding's phase prefix reads on a card (``main``: the main step phase, named when known).
_PHASE_WORDS = {"all": "whole trace", "prefill": "prefill steps", "decode": "decode steps", "mixed": "mixed steps",
                "unknown": "outside the steps"}


@lru_cache(maxsize=1)
def _finding_patterns() -> list[tuple[re.Pattern, Any]]:
    from diagnose.catalog import _pattern_to_regex, catalog

    out = []
    for f in catalog():
        rx = _pattern_to_regex(f.name)
        for ph in ("<category>", "<cause>", "<kind>"):  # the matched part names what the description calls it
            if ph in f.name:
                rx = _pattern_to_regex(f.name.replace(ph, "@@")).replace("@@", "(?P<part>[a-z_]+)")
        out.append((re.compile(rf"^{rx}$"), f))
    return out


def _short_description(desc: str, part: str | None) -> str:
    d = re.split(r" \(|, for |; | = ", desc, maxsplit=1)[0].strip()
    if part:
        d = re.sub(r"\b(category|cause|kind)\b", part.replace("_", " "), d, count=1)
    return d


@lru_cache(maxsize=512)
def finding_label(name: str, main_phase: str | None = None) -> str:
    """A finding as people read it, from the findings catalog's description: ``main.moe_share``
    -> ``moe kernel time / kernel time (decode steps)`` when the main phase is decode. A name
    the catalog lacks comes back with its dots and underscores as spaces."""
    for rx, f in _finding_patterns():
        m = rx.match(name)
        if m:
            head, _, rest = name.partition(".")
            metric = {k: label for k, label, *_ in _PHASE_ROWS}  # the phase table's words where it has the number
            desc = metric[rest] if f.name.startswith("<phase>.") and rest in metric else \
                _short_description(f.description, m.groupdict().get("part"))
            if f.name.startswith("<phase>."):
                where = (f"{main_phase} steps" if main_phase in STEP_PHASES else "main step phase") if head == "main" \
                    else _PHASE_WORDS.get(head, head)
                return f"{desc} ({where})"
            return desc
    return name.replace(".", " ").replace("_", " ")


def _threshold_words(name: str, value_text: str, unit: str) -> str:
    """``min_share`` 50.0 % "fraction of kernel time" -> ``at least 50.0 % of kernel time``."""
    bound = "at least" if name.startswith("min_") else "at most" if name.startswith("max_") else \
        name.replace("_", " ") + ":"
    u = re.sub(r"^(fraction|share)\b\s*", "", unit) if value_text.endswith("%") else unit
    return " ".join(x for x in (bound, value_text, u) if x)


def device_heading(report: Mapping, device: int | None) -> str:
    """A device as the pages name it, with the part whose peaks MFU/MBU use (also after
    ``--gpu`` for a device the trace leaves unnamed): "GPU 2: (unnamed in the trace; peaks of
    MI300X)"; "CPU only (no GPU activity)" for None."""
    from diagnose.hardware import describe_devices

    if device is None:
        return "CPU only (no GPU activity)"
    devs = [d for d in report.get("devices") or [] if d.get("id") == device] or [{"id": device, "name": ""}]
    return "GPU " + describe_devices(devs, report.get("gpu"))


def peak_column(report: Mapping) -> str:
    """The kernel table's "of peak" header, naming the part whose peaks it uses."""
    name = (report.get("gpu") or {}).get("name")
    return f"of {name} peak" if name and name != "custom" else "of peak"


def kv_start(report: Mapping) -> dict:
    """Where the KV page starts for a trace: the served model (its ``--model-config``: a shipped
    name or a readable ``config.json``; else the reference 7B-like config), its KV dtype (the
    report's, else the config's as ``diagnose bounds`` reads it, else fp16) and the memory of
    the device whose peaks the report used (``gpus.yaml`` ``memory_gb``; else 80 GB).

    Returns:
        {preset, model_config, kv_dtype, memory_gb, text}: ``text`` says where each came from.
    """
    from diagnose.accounting import shipped_model_configs
    from diagnose.errors import DiagnoseError

    model = report.get("model") or {}
    src = str(model.get("source") or "")
    preset, cfg_arg = "7b", ""
    if src in shipped_model_configs():
        preset = src
    elif src and os.path.isfile(src):
        preset, cfg_arg = "file", src
    said = []
    kv = model.get("kv_dtype") if model.get("kv_dtype") in _KV_DTYPES else None
    if kv:
        said.append(f"KV dtype {kv}: the trace's model")
    elif preset != "7b":
        from diagnose.accounting import ModelSpec
        from diagnose.accounting.bounds import default_kv_dtype
        from diagnose.accounting.spec import read_model_config

        try:
            cfg, name = read_model_config(cfg_arg or preset)
            kv, how = default_kv_dtype(cfg, ModelSpec.from_hf_config(cfg, name=name))
            said.append(f"KV dtype {kv}: {how}")
        except (DiagnoseError, TypeError, ValueError):
            kv = None
    if not kv:
        kv = "fp16"
        said.append("KV dtype fp16: the trace names none")
    if preset != "7b":
        said.insert(0, f"model {model.get('name') or preset} (the trace's --model-config)")
    elif model:
        said.insert(0, f"the reference 7B-like config (the trace's model {model.get('name')} came from "
                       f"{src or 'the trace'}, not a config file this page can read)")
    else:
        said.insert(0, "the reference 7B-like config (no model config with the trace: diagnose run --model-config)")
    gpu = report.get("gpu") or {}
    mem = None
    if gpu.get("name") and gpu.get("name") != "custom":
        from diagnose.hardware import gpu_by_name

        try:
            mem = gpu_by_name(str(gpu["name"])).memory_gb
        except DiagnoseError:
            mem = None
    if mem:
        said.append(f"device memory {mem:g} GB: {gpu['name']}, the device whose peaks the report used")
    else:
        mem = 80
        said.append("device memory 80 GB: no device named (diagnose run --gpu NAME)")
    return {"preset": preset, "model_config": cfg_arg, "kv_dtype": kv, "memory_gb": mem,
            "text": "Starts from " + "; ".join(said) + "."}


_KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


def distinct_labels(paths: Sequence[str]) -> list[str]:
    """A label per path that tells the files apart: the file name, with as many of its folders
    as it takes to differ from every other path (``vllm_decode_full/graph_execution.json.gz``
    vs ``vllm_eager/graph_execution.json.gz``); the same file given twice gets ``(2nd)``..."""
    parts = [[x for x in os.path.normpath(os.path.abspath(p)).split(os.sep) if x] or [p] for p in paths]
    out = []
    for i, pi in enumerate(parts):
        n = 1
        while n < len(pi) and any(j != i and pj[-n:] == pi[-n:] and pj != pi for j, pj in enumerate(parts)):
            n += 1
        label = "/".join(pi[-n:])
        same = [j for j, pj in enumerate(parts) if pj == pi]
        if len(same) > 1:
            k = same.index(i) + 1
            label += f" ({k}{'st' if k == 1 else 'nd' if k == 2 else 'rd' if k == 3 else 'th'})"
        out.append(label)
    return out

#: A finite float, or None (None, bools, NaN, inf, non-numbers): the report formatter's own test.
_num = fmt._finite


def fmt_value(v: Any, unit: str = "") -> str:
    """Human text for a value in ``unit`` (:func:`diagnose.report.fmt.value`); a missing
    value reads :data:`NA` on the web."""
    text = fmt.value(v, unit)
    return NA if text == fmt.NA else text


SEVERITY_ORDER = ("critical", "high", "medium", "low", "info")


def _severity_rank(s: str | None) -> int:
    s = (s or "").lower()
    return SEVERITY_ORDER.index(s) if s in SEVERITY_ORDER else len(SEVERITY_ORDER)


def sorted_symptoms(report: Mapping) -> list[dict]:
    """Fired symptoms, worst severity first (stable for equal severity)."""
    return sorted(report.get("symptoms") or [], key=lambda s: _severity_rank(s.get("severity")))


_PHASE_ROWS: list[tuple[str, str, str, tuple[str, ...] | None, dict[str, str]]] = [
    ("ttft_ms", "TTFT (first prefill step)", "ms", ("prefill",), {"prefill": "business metric of prefill"}),
    ("tpot_p50_ms", "TPOT p50", "ms", ("decode",), {"decode": "business metric of decode"}),
    ("tpot_p90_ms", "TPOT p90", "ms", ("decode",), {}),
    ("tpot_p99_ms", "TPOT p99", "ms", ("decode",), {"decode": "decide on p99, not the mean"}),
    ("step_p50_ms", "step time p50", "ms", ("prefill", "decode"), {}),
    ("step_p99_ms", "step time p99", "ms", ("prefill", "decode"), {}),
    ("mfu", "MFU (model FLOPs utilization)", "share", None, {"prefill": "typical 40-70 %", "decode": "typical 3-15 %"}),
    ("mbu", "MBU (model bandwidth utilization)", "share", None,
     {"decode": "~40 % = under-fed, > 80 % = at the limit"}),
    ("achieved_tflops", "achieved TFLOP/s", "TFLOP/s", None, {}),
    ("achieved_tbps", "achieved TB/s", "TB/s", None, {}),
    ("arithmetic_intensity", "arithmetic intensity", "FLOP/B", None,
     {"prefill": "≫ ridge (GEMM)", "decode": "≈ 1 FLOP/B at batch 1 (GEMV)"}),
    ("bound", "bound (vs ridge point)", "", None, {"prefill": "compute", "decode": "memory bandwidth"}),
    ("bound_ratio", "time / analytic lower bound", "x", None,
     {"prefill": "≤ 1.5× good, 3-4× a problem", "decode": "≤ 1.5× good, 3-4× a problem"}),
    ("launch_gap_share", "launch-gap share of GPU window", "share", None,
     {"prefill": "> 15 % = launch overhead (S3)", "decode": "> 15 % = launch overhead (S3)"}),
    ("gpu_idle_own_share", "GPU idle share of the steps' own time", "share", None, {}),
    ("gpu_idle_share", "GPU idle share of the whole window", "share", None, {}),
    ("attention_share", "attention share of kernel time", "share", None,
     {"prefill": "≫ FLOP share (~15 %) on long prompts = poor tiling"}),
    ("gpu_busy_ms", "GPU busy", "ms", None, {}),
    ("steps", "steps", "steps", None, {}),
    ("kernel_count", "kernels", "count", None, {}),
]


def _finding_text(name: str, v: Any) -> str:
    """A finding value with the unit its name implies (``*_share`` %, ``*_ms``, ``*_us``...)."""
    n = name.rsplit(".", 1)[-1]
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return NA if v is None else str(v)
    if n.endswith(("_share", "_fraction", "mfu", "mbu")) or n in ("mfu", "mbu"):
        return fmt_value(v, "share")
    if n.endswith("_ms"):
        return fmt_value(v, "ms")
    if n.endswith("_us"):
        return fmt_value(v, "µs")
    if n.endswith(("_ratio", "_over_cpu")) or n.startswith("max_gpu_over"):
        return fmt_value(v, "x")
    if n.endswith("_count") or n in ("steps", "samples"):
        return fmt_value(v, "count")
    return _short(v)


def _threshold_text(t: Any) -> tuple[str, str, str]:
    """(value text, unit, rationale) of a rule threshold ``{value, unit, rationale}`` or a bare number."""
    if isinstance(t, Mapping):
        v, unit, why = t.get("value"), str(t.get("unit") or ""), str(t.get("rationale") or "")
    else:
        v, unit, why = t, "", ""
    if _num(v) is not None and unit.lower().startswith(("fraction", "share")):
        return fmt_value(v, "share"), unit, why
    return _short(v), unit, why


def _evidence_pairs(evidence: Any) -> tuple[list[dict], list[tuple[str, str]]]:
    """Legacy/flat evidence: measured-vs-threshold pairs and other key/value items.

    Understands ``{"measured"|"value": x, "threshold": y, "unit": u}`` and
    ``{name: {"value": x, "threshold": y}}``; everything else is listed as is.
    """
    pairs: list[dict] = []
    other: list[tuple[str, str]] = []
    if not isinstance(evidence, Mapping):
        return pairs, ([("evidence", _short(evidence))] if evidence else [])
    ev = dict(evidence)
    if "threshold" in ev and any(k in ev for k in ("measured", "value")):
        m = ev.pop("measured") if "measured" in ev else ev.pop("value")
        pairs.append({"name": str(ev.pop("metric", ev.pop("finding", "measured"))), "measured": m,
                      "threshold": ev.pop("threshold"), "unit": str(ev.pop("unit", "") or "")})
    for k, v in list(ev.items()):
        if isinstance(v, Mapping) and ("threshold" in v) and any(x in v for x in ("value", "measured")):
            pairs.append({"name": k, "measured": v.get("measured", v.get("value")), "threshold": v["threshold"],
                          "unit": str(v.get("unit", "") or "")})
            ev.pop(k)
    for k, v in ev.items():
        other.append((str(k), _short(v)))
    return pairs, other


def _short(v: Any) -> str:
    """A value as people read it: floats formatted, whole floats as integers, a mapping as
    ``key: value`` pairs and a list comma-separated (never a Python repr)."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else fmt_value(v)
    if isinstance(v, Mapping):
        s = "; ".join(f"{finding_label(str(k))}: {_short(x)}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        s = ", ".join(_short(x) for x in v)
    else:
        s = str(v)
    return s if len(s) <= 200 else s[:197] + "..."


def symptom_cards_data(report: Mapping) -> list[dict]:
    """One dict per fired symptom, worst first.

    Keys: id, symptom, title, severity, color, summary, phase, findings [(name, text)] and
    thresholds [(name, value text, unit, rationale)] (the rule engine's ``evidence``
    {findings, thresholds}), pairs (flat measured-vs-threshold evidence), evidence (other
    items), likely_cause, how_to_verify, fix, references; for people: ``measured`` [{text,
    key, why}] (findings by their catalog label, thresholds in words) and ``change`` (the one
    "what to change" list: the rule's fix, or the levers kept when one is already in place).
    """
    cards = []
    for s in sorted_symptoms(report):
        sev = (s.get("severity") or "info").lower()
        ev = s.get("evidence") or {}
        findings: list[tuple[str, str]] = []
        thresholds: list[tuple[str, str, str, str]] = []
        if isinstance(ev, Mapping) and ("findings" in ev or "thresholds" in ev):
            findings = [(str(k), _finding_text(str(k), v)) for k, v in (ev.get("findings") or {}).items()]
            thresholds = [(str(k), *_threshold_text(t)) for k, t in (ev.get("thresholds") or {}).items()]
            rest = {k: v for k, v in ev.items() if k not in ("findings", "thresholds", "labels")}
            pairs, other = _evidence_pairs(rest) if rest else ([], [])
            lab = ev.get("labels")
            other = ([(finding_label(str(k)), _short(v)) for k, v in lab.items()] if isinstance(lab, Mapping) else []) + other
        else:
            pairs, other = _evidence_pairs(ev)
        main_phase = (ev.get("labels") or {}).get("trace.main_phase") if isinstance(ev, Mapping) else None
        measured = [{"text": f"{finding_label(k, main_phase)}: {v}", "key": k, "why": ""} for k, v in findings]
        measured += [{"text": "threshold: " + _threshold_words(k, v, u), "key": k, "why": why} for k, v, u, why in thresholds]
        in_place = [str(x) for x in s.get("already_in_place") or []]
        levers = [LEVERS[r].text for r in s.get("recommends") or [] if r in LEVERS]
        # One "what to change" section: the rule's own advice, or (when the engine rewrote it
        # because a lever is already in place) the levers it kept.
        change = levers if in_place or not s.get("fix") else [str(s.get("fix"))]
        cards.append({
            "measured": measured, "change": change,
            "id": str(s.get("id") or s.get("symptom") or f"symptom{len(cards)}"),
            "symptom": s.get("symptom") or "", "title": s.get("title") or "", "severity": sev,
            "color": SEVERITY_COLORS.get(sev, SEVERITY_COLORS["unknown"]),
            "summary": s.get("summary") or "", "phase": s.get("phase") or "",
            "findings": findings, "thresholds": thresholds,
            "pairs": [{**p, "label": finding_label(str(p["name"]), main_phase), "measured_text": fmt_value(p["measured"], p["unit"] if p["unit"] in ("share", "x") else ""),
                       "threshold_text": fmt_value(p["threshold"], p["unit"] if p["unit"] in ("share", "x") else "")}
                      for p in pairs],
            "evidence": other,
            "likely_cause": s.get("likely_cause") or "", "how_to_verify": s.get("how_to_verify") or "",
            "fix": s.get("fix") or "", "references": [str(x) for x in s.get("references") or []],
            "levers": levers, "in_place": in_place,
        })
    return cards
