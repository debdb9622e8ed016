"""The layer x op-class table, the segmentation records and the coverage line
(:mod:`diagnose.analyzers.layers` finds the layers; this module sums and checks them).

**Rows.** Per device and phase: ``pre``, one row per layer index, ``post``; kernel time summed
over the phase's forwards, by op class (:data:`~diagnose.analyzers.layerseg.OP_CLASSES`), with
the FLOPs and bytes the kernel table apportioned to those kernels where their cost is known
(``costed_share``: the share of the row's kernel time that has one).

**Layer types** come from the model config when it gives them (``layer_types`` / sliding
windows: ``sliding_attention`` / ``full_attention``; MoE vs dense layers) and the forward has
``num_hidden_layers`` layers, else from the names of each layer's attention kernels (vLLM's
gpt-oss replay: ``kernel_unified_attention_2d`` layers and ``_3d`` + ``reduce_segments``
layers). Medians are per type: a full-attention layer is compared with full-attention layers.

**Confidence** of a segmentation: frames (modules, ranges, capture module paths) are ``high``
when their count matches ``num_hidden_layers`` (or there is no config), else ``medium``. The
structural algorithm is ``high`` when its layer count is confirmed by the config (or, without
one, by the name-count mode) and by the period or the mode, and nearly every layer repeats its
type's kernel sequence; ``medium`` when the count is confirmed one way; else ``low``.
"""
from __future__ import annotations


import numpy as np
import pandas as pd

from diagnose.analyzers import layerseg as LS
from diagnose.analyzers.categories import base_name
from diagnose.model import Coverage, LayerRow, LayerSegmentation
from diagnose.trace.model import NO_TIME

#: Layer types need this many layers before a median says what is usual for them.
MIN_TYPE_LAYERS = 3

_SOURCE_LABEL = {"modules": "nn.Module frames", "ranges": "record_function/NVTX ranges",
                 "capture": "the capture trace", "structural": "structural"}


def _round(x, nd: int = 6):
    return None if x is None or (isinstance(x, float) and not np.isfinite(x)) else round(float(x), nd)


# ---------------------------------------------------------------- layer types


def config_types(spec) -> list[str] | None:
    """Per layer, its type from the model config: attention kind (``sliding_attention`` /
    ``full_attention``) when the config has sliding layers, MLP kind (``moe`` / ``dense``) when
    only some layers are MoE; None when every layer is alike."""
    if spec is None:
        return None
    n = spec.num_hidden_layers
    parts: list[list[str]] = [[] for _ in range(n)]
    win = tuple(getattr(spec, "layer_windows", ()) or ())
    if win and len(set(w is None for w in win)) > 1:
        for i, w in enumerate(win):
            parts[i].append("full_attention" if w is None else "sliding_attention")
    moe = getattr(spec, "moe", None)
    layers = tuple(getattr(moe, "moe_layers", ()) or ()) if moe is not None else ()
    if layers and len(set(bool(x) for x in layers)) > 1:
        for i, x in enumerate(layers):
            parts[i].append("moe" if x else "dense")
    if not any(parts):
        return None
    return ["+".join(p) for p in parts]


def layer_types(k, a, spec) -> np.ndarray:
    """Per kernel, the type label of its layer (None outside layers, or when the forward's
    layers are all of one type): the config's types for forwards of ``num_hidden_layers``
    layers, else the base names of the layer's attention kernels."""
    out = np.full(len(k), None, dtype=object)
    lay = np.flatnonzero(a.part == 2)
    if not len(lay):
        return out
    fw, layer = a.forward[lay], a.layer[lay]
    fcode, fids = pd.factorize(fw)
    n_per = np.zeros(len(fids), dtype=np.int64)
    np.maximum.at(n_per, fcode, layer + 1)
    cfg = config_types(spec)
    by_cfg = np.zeros(len(fids), dtype=bool)
    if cfg is not None:
        by_cfg = n_per == len(cfg)
        sel = by_cfg[fcode]
        out[lay[sel]] = np.asarray(cfg, dtype=object)[layer[sel]]
    # by names: an order-free hash of each (forward, layer)'s attention kernel names
    cell = fcode.astype(np.int64) * (int(layer.max()) + 1) + layer
    att = (k.category[lay] == "attention") & ~by_cfg[fcode]
    if not att.any():
        return out
    ccode, cells = pd.factorize(cell)
    rng = np.random.default_rng(26)
    w = rng.integers(1, 2**61, size=int(k.name_id.max()) + 2, dtype=np.int64).astype(np.uint64)
    pairs = np.unique(np.stack([ccode[att], k.name_id[lay][att]], axis=1), axis=0)
    h = np.zeros(len(cells), dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.add.at(h, pairs[:, 0], w[pairs[:, 1]])
    hk = h[ccode]
    labels: dict[int, str] = {}
    for hv in np.unique(hk[att]):
        ex = pairs[h[pairs[:, 0]] == hv]
        ex = ex[ex[:, 0] == ex[0, 0], 1]
        nm = {int(i): base_name(str(k.names[lay][att][k.name_id[lay][att] == i][0]))[:60] for i in ex}
        labels[int(hv)] = " + ".join(nm[i] for i in sorted(nm, key=lambda i: nm[i]))
    # one type in a forward: no label
    fh_min = np.full(len(fids), np.iinfo(np.uint64).max, dtype=np.uint64)
    fh_max = np.zeros(len(fids), dtype=np.uint64)
    np.minimum.at(fh_min, fcode, hk)
    np.maximum.at(fh_max, fcode, hk)
    multi = (fh_min != fh_max)[fcode] & ~by_cfg[fcode]
    lab = np.array([labels.get(int(x), "no attention kernel") for x in hk], dtype=object)
    out[lay[multi]] = lab[multi]
    return out


# ---------------------------------------------------------------- rows


def _forward_meta(k, a) -> dict:
    """Per forward: ids (sorted), device, phase (of its first kernel), source and kernel ns."""
    m = np.flatnonzero(a.forward >= 0)
    fw, first = np.unique(a.forward[m], return_index=True)
    inv = np.searchsorted(fw, a.forward[m])
    ns = np.bincount(inv, weights=k.dur_ns[m].astype(np.float64), minlength=len(fw))
    return {"ids": fw, "device": k.device[m][first], "phase": k.phase[m][first], "ns": ns,
            "source": np.array([a.info.get(int(f), {}).get("source", "structural") for f in fw], dtype=object)}


def tables(k, a, structural, types, n_layers) -> tuple[list[LayerRow], list[LayerSegmentation]]:
    """The report's layer rows and segmentation records (see the module doc)."""
    m = np.flatnonzero(a.forward >= 0)
    if not len(m):
        return [], []
    meta = _forward_meta(k, a)
    fw = a.forward[m]
    ltype = types[m]
    at = np.searchsorted(meta["ids"], fw)
    dev = meta["device"][at]
    phase = meta["phase"][at]
    pcode, puniq = pd.factorize(phase, sort=True)
    dcode, duniq = pd.factorize(dev, sort=True)
    gcode = dcode * len(puniq) + pcode
    rows: list[LayerRow] = []
    segs: list[LayerSegmentation] = []
    for gi in np.unique(gcode):
        d, ph = duniq[gi // len(puniq)], puniq[gi % len(puniq)]
        sel = m[gcode == gi]
        fws = np.unique(a.forward[sel])
        prow = _phase_rows(int(d), str(ph), sel, k, a, ltype[gcode == gi])
        rows.extend(prow)
        segs.append(_segmentation(int(d), str(ph), prow, fws, k, a, structural, meta, n_layers))
    return rows, segs


def _phase_rows(dev: int, phase: str, sel: np.ndarray, k, a, ltype: np.ndarray) -> list[LayerRow]:
    """The rows of one (device, phase): kernels ``sel`` (positions) of its forwards."""
    part, layer = a.part[sel], a.layer[sel]
    n_lay = int(layer.max()) + 1 if (part == 2).any() else 0
    key = np.where(part == 2, layer + 1, np.where(part == 1, 0, n_lay + 1)).astype(np.int64)
    nk, nop = n_lay + 2, len(LS.OP_CLASSES)
    ns = k.dur_ns[sel].astype(np.float64)
    by_op = np.bincount(key * nop + a.op[sel], weights=ns, minlength=nk * nop).reshape(nk, nop)
    tot = by_op.sum(axis=1)
    cnt = np.bincount(key, minlength=nk)
    fcode = pd.factorize(a.forward[sel])[0]
    pairs = np.unique(key * (int(fcode.max()) + 1) + fcode)
    n_fw = np.bincount(pairs // (int(fcode.max()) + 1), minlength=nk)
    fl, by = k.flops[sel], k.bytes[sel]
    kf, kb = ~np.isnan(fl), ~np.isnan(by)
    flops = np.bincount(key, weights=np.where(kf, fl, 0.0), minlength=nk)
    fns = np.bincount(key, weights=ns * kf, minlength=nk)
    byt = np.bincount(key, weights=np.where(kb, by, 0.0), minlength=nk)
    bns = np.bincount(key, weights=ns * kb, minlength=nk)
    costed = np.bincount(key, weights=ns * (kf | kb), minlength=nk)
    first = np.full(nk, -1, dtype=np.int64)
    rev = np.arange(len(key))[::-1]
    first[key[rev]] = rev
    types = [None if first[i] < 0 else ltype[first[i]] for i in range(nk)]
    ratio, cls_ratio, medians = _ratios(tot[1:n_lay + 1], by_op[1:n_lay + 1], types[1:n_lay + 1])
    out = []
    for i in range(nk):
        if cnt[i] == 0:
            continue
        pt = "pre" if i == 0 else "post" if i == n_lay + 1 else "layer"
        li = i - 1
        t = tot[i]
        out.append(LayerRow(
            device=dev, phase=phase, part=pt, layer=li if pt == "layer" else None,
            layer_type=None if types[i] is None else str(types[i]), forwards=int(n_fw[i]), kernel_ms=_round(t / 1e6),
            kernel_count=int(cnt[i]), op_class_ms={c: _round(by_op[i, j] / 1e6) for j, c in enumerate(LS.OP_CLASSES) if by_op[i, j] > 0},
            flops=_round(flops[i], 1) if fns[i] > 0 else None, bytes=_round(byt[i], 1) if bns[i] > 0 else None,
            achieved_tflops=_round(flops[i] / fns[i] / 1e3, 4) if fns[i] > 0 else None,
            achieved_tbps=_round(byt[i] / bns[i] / 1e3, 4) if bns[i] > 0 else None,
            costed_share=_round(costed[i] / t) if t > 0 else None,
            type_median_ms=_round(medians.get(li)) if pt == "layer" else None,
            ratio_to_type_median=_round(ratio.get(li), 4) if pt == "layer" else None,
            class_ratio={c: _round(v, 4) for c, v in cls_ratio.get(li, {}).items()} if pt == "layer" else {}))
    return out


def _ratios(tot: np.ndarray, by_op: np.ndarray, types: list) -> tuple[dict, dict, dict]:
    """Per layer index: total / its type's median; per op class, class time / the class's
    median among the type's layers (median > 0); the type median (ms). Types with fewer than
    :data:`MIN_TYPE_LAYERS` layers get none."""
    ratios: dict = {}
    cls_ratio: dict = {}
    medians: dict = {}
    labels = np.array(["" if t is None else str(t) for t in types], dtype=object)
    for t in pd.unique(labels):
        idx = np.flatnonzero(labels == t)
        if len(idx) < MIN_TYPE_LAYERS:
            continue
        med = float(np.median(tot[idx]))
        cmed = np.median(by_op[idx], axis=0)
        for i in idx:
            medians[int(i)] = med / 1e6
            if med > 0:
                ratios[int(i)] = float(tot[i]) / med
            cls_ratio[int(i)] = {c: float(by_op[i, j]) / float(cmed[j]) for j, c in enumerate(LS.OP_CLASSES) if cmed[j] > 0}
    return ratios, cls_ratio, medians


# ---------------------------------------------------------------- segmentation records


def _segmentation(dev, phase, prow, fws, k, a, structural, meta, n_layers) -> LayerSegmentation:
    at = np.searchsorted(meta["ids"], fws)
    by: dict[str, float] = {}
    for src, ns in zip(meta["source"][at], meta["ns"][at]):
        by[src] = by.get(src, 0.0) + float(ns)
    source = max(by, key=lambda x: by[x])
    notes = []
    if len(by) > 1:
        notes.append("forwards segmented from several sources: " + ", ".join(sorted(by)))
    lay_rows = [r for r in prow if r.part == "layer"]
    n = len(lay_rows)
    info = [a.info.get(int(f), {}) for f in fws]
    confidence, basis = _confidence(source, info, n, n_layers, notes)
    agreement = _agreement(k, a, structural, fws) if source != "structural" else {}
    types = sorted({r.layer_type for r in lay_rows if r.layer_type is not None})
    medians: dict[str, float] = {}
    for r in lay_rows:
        if r.type_median_ms is not None:
            medians.setdefault(r.layer_type or "decoder", r.type_median_ms)
    best = _largest(lay_rows)
    seg = next((i.get("seg") for i in info if i.get("seg") is not None), None)
    ms = {p: sum(r.kernel_ms for r in prow if r.part == p) for p in ("pre", "layer", "post")}
    return LayerSegmentation(
        device=dev, phase=phase, source=source, confidence=confidence, basis=basis, layers=n,
        expected_layers=n_layers, forwards=len(fws), layer_class=next((i.get("layer_class") for i in info if i.get("layer_class")), None),
        layer_types=types, period_kernels=None if seg is None else seg.period, agreement=agreement,
        forward_ms=_round(sum(ms.values())), layers_ms=_round(ms["layer"]), pre_ms=_round(ms["pre"]), post_ms=_round(ms["post"]),
        type_medians_ms=medians, max_ratio=best[0], max_ratio_layer=best[1], max_ratio_class=best[2],
        max_ratio_excess_ms=best[3], notes=notes)


def _largest(rows: list[LayerRow]) -> tuple:
    """(ratio, layer, class or "total", excess ms) of the layer furthest above its type's
    median, in total or in one op class."""
    best = (None, None, None, None)
    for r in rows:
        cands = []
        if r.ratio_to_type_median is not None and r.type_median_ms is not None:
            cands.append((r.ratio_to_type_median, "total", r.kernel_ms - r.type_median_ms))
        for c, v in r.class_ratio.items():
            ms = r.op_class_ms.get(c, 0.0)
            cands.append((v, c, ms - ms / v if v > 0 else 0.0))
        for ratio, c, excess in cands:
            if best[0] is None or ratio > best[0]:
                best = (_round(ratio, 4), r.layer, c, _round(excess))
    return best


def _confidence(source: str, info: list[dict], n: int, n_layers: int | None, notes: list[str]) -> tuple[str, str]:
    if source != "structural" and not any(i.get("seg") for i in info):
        what = _SOURCE_LABEL[source]
        if n_layers and n != n_layers:
            notes.append(f"{n} layers from {what}, config num_hidden_layers {n_layers}")
            return "medium", f"{n} layers named by {what}; the config says {n_layers}"
        return "high", f"{n} layers named by {what}" + (f" = num_hidden_layers {n_layers}" if n_layers else "")
    seg = next(i["seg"] for i in info if i.get("seg") is not None)
    chk = seg.checks()
    period_ok, mode_ok, tmpl_ok = chk["period"], chk["mode"], chk["template"]
    config_ok = bool(n_layers) and seg.n_layers == n_layers
    checks = [f"{seg.n_blocks} attention blocks"]
    checks.append(f"config num_hidden_layers {n_layers}" if n_layers else "no model config")
    checks.append(f"name-count mode {seg.name_mode}")
    if seg.period is not None:
        checks.append(f"period {seg.period} kernels" + (" = 2 layers" if chk["two_layer_period"] else
                                                         " = 1 layer" if period_ok else " (no layer multiple)"))
    checks.append(f"{seg.template_match} of {seg.n_layers} layers repeat their type's kernels")
    confirmed = config_ok or (not n_layers and (mode_ok or period_ok))
    if confirmed and (period_ok or mode_ok) and tmpl_ok:
        level = "high"
    elif (confirmed or not n_layers) and (period_ok or mode_ok or tmpl_ok):
        level = "medium"
    else:
        level = "low"
    notes.extend(seg.notes)
    return level, "; ".join(checks)


def _agreement(k, a, structural, fws) -> dict[str, float]:
    """Share of the forwards' kernel time the structural algorithm puts in the same row."""
    m = np.isin(a.forward, fws) & (a.part > 0)
    both = m & (structural.forward >= 0)
    if not both.any():
        return {}
    same = both & (structural.part == a.part) & ((a.part != 2) | (structural.layer == a.layer))
    tot = float(k.dur_ns[m].sum())
    return {"structural": round(float(k.dur_ns[same].sum()) / tot, 6)} if tot > 0 else {}


# ---------------------------------------------------------------- coverage


def coverage(k, a, segs: list[LayerSegmentation], reasons: dict[int, str] | None = None) -> list[Coverage]:
    """One :class:`~diagnose.model.Coverage` per device with kernels (``reasons``: per device,
    why no layers were found, for the line)."""
    out = []
    for dev in np.unique(k.device):
        m = k.device == dev
        ns = k.dur_ns[m].astype(np.float64)
        tot = float(ns.sum())
        fw = a.forward[m] >= 0
        lay = a.part[m] == 2
        graph = k.graph[m]
        has_op = pd.notna(k.op[m])
        prev = (~fw) & (k.step[m] < 0) & (k.launch_ns[m] == NO_TIME)  # no launch call in the trace
        ds = [s for s in segs if s.device == dev]
        source = max(ds, key=lambda s: s.forward_ms).source if ds else None
        n_layers = max((s.layers for s in ds), default=0)
        c = dict(device=int(dev), kernel_ms=_round(tot / 1e6), forward_ms=_round(ns[fw].sum() / 1e6),
                 layers_ms=_round(ns[lay].sum() / 1e6), forward_share=_round(ns[fw].sum() / tot) if tot else None,
                 unattributed_ms=_round(ns[~fw].sum() / 1e6), previous_step_ms=_round(ns[prev].sum() / 1e6),
                 graph_kernel_ms=_round(ns[graph].sum() / 1e6), graph_kernel_share=_round(ns[graph].sum() / tot) if tot else None,
                 graph_forward_share=_round(ns[graph & fw].sum() / ns[graph].sum()) if graph.any() and ns[graph].sum() > 0 else None,
                 graph_op_share=_round(ns[graph & has_op].sum() / ns[graph].sum()) if graph.any() and ns[graph].sum() > 0 else None,
                 op_share=_round(ns[has_op].sum() / tot) if tot else None, source=source, layers=n_layers)
        out.append(Coverage(**c, text=coverage_text(c, ds, (reasons or {}).get(int(dev)))))
    return out


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def coverage_text(c: dict, segs: list[LayerSegmentation], reason: str | None = None) -> str:
    """The coverage line (see :class:`~diagnose.model.Coverage`)."""
    dev = c["device"]
    if c["source"] is None:
        head = (f"GPU {dev}: no decoder layers found ({reason or 'no attention kernel between two projections'}); "
                f"100.0 % of kernel time ({c['kernel_ms']:.3f} ms) unattributed to layers")
    else:
        conf = ", ".join(sorted({s.confidence for s in segs if s.source == c["source"]}))
        head = (f"GPU {dev}: {_pct(c['forward_share'])} of kernel time ({c['forward_ms']:.3f} of {c['kernel_ms']:.3f} ms) "
                f"attributed to {c['layers']} layers + pre/post ({_SOURCE_LABEL[c['source']]}, confidence {conf}); "
                f"{_pct(1 - c['forward_share'] if c['forward_share'] is not None else None)} unattributed")
        if c["previous_step_ms"] > 0:
            head += f" ({c['previous_step_ms']:.3f} ms the previous step's tail)"
    if c["graph_kernel_share"]:
        head += (f"; graph-replayed kernels {_pct(c['graph_kernel_share'])} of kernel time: "
                 f"{_pct(c['graph_forward_share'])} in layers, {_pct(c['graph_op_share'])} mapped to ops"
                 + ("" if c["graph_op_share"] else " (give --capture-trace)"))
    return head
