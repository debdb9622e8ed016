"""Terminal lines for per-layer time: the coverage line (always, one per device with kernels),
a one-line layer summary per segmented phase, and the whole layer x op-class table with
``diagnose run --layers``."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnose.textsafe import safe

#: Op-class columns of the table, in order (empty columns are left out).
COLUMNS = ("qkv", "attention", "o_proj", "mlp", "norm", "communication", "embedding", "lm_head", "sampler", "other")


def summary_lines(d: dict[str, Any]) -> list[str]:
    """The coverage line of each device, then one line per segmentation: layers, median time
    per type, the layer furthest from its type's median."""
    out = [f"Coverage: {c['text']}" for c in d.get("coverage") or []]
    for s in d.get("layer_segmentation") or []:
        meds = ", ".join(f"{t} {v:.3f} ms" for t, v in (s.get("type_medians_ms") or {}).items())
        line = (f"Layers ({s['phase']}, GPU {s['device']}): {s['layers']} layers from {s['source']} "
                f"(confidence {s['confidence']})" + (f"; median layer {meds}" if meds else ""))
        agree = (s.get("agreement") or {}).get("structural")
        if agree is not None:
            line += f"; structural agreement {100 * agree:.1f} %"
        if s.get("max_ratio") is not None:
            line += (f"; furthest from its type: layer {s['max_ratio_layer']} ({s['max_ratio_class']}) "
                     f"{s['max_ratio']:.2f}x")
        out.append(line)
    return out


def render_summary(c: Console, d: dict[str, Any], table_hint: bool = True) -> None:
    """The coverage and layer summary lines (the layer lines point at ``--layers``)."""
    n_cov = len(d.get("coverage") or [])
    for i, line in enumerate(summary_lines(d)):
        if i >= n_cov and table_hint:
            line += " (table: --layers)"
        c.print(Text(safe(line), style="bold" if i < n_cov else ""))


def render_table(c: Console, d: dict[str, Any]) -> None:
    """The whole layer x op-class table, one per (device, phase)."""
    rows = d.get("layers") or []
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["device"], r["phase"]), []).append(r)
    for (dev, phase), rs in groups.items():
        cols = [k for k in COLUMNS if any(k in (r.get("op_class_ms") or {}) for r in rs)]
        t = Table(title=f"Layers × op class, {phase} (GPU {dev}), kernel ms summed over {max(r['forwards'] for r in rs)} forward(s)",
                  header_style="bold")
        for col in ("row", "type", "ms", *cols, "× type median", "TB/s", "TFLOP/s"):
            t.add_column(col, justify="left" if col in ("row", "type") else "right")
        for r in rs:
            name = r["part"] if r["part"] != "layer" else str(r["layer"])
            ratio = r.get("ratio_to_type_median")
            t.add_row(name, safe(r.get("layer_type") or ""), f"{r['kernel_ms']:.3f}",
                      *[f"{(r.get('op_class_ms') or {}).get(k, 0.0):.3f}" for k in cols],
                      "—" if ratio is None else f"{ratio:.2f}",
                      "—" if r.get("achieved_tbps") is None else f"{r['achieved_tbps']:.2f}",
                      "—" if r.get("achieved_tflops") is None else f"{r['achieved_tflops']:.1f}")
        c.print(t)
