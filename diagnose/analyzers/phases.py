"""Prefill / decode / mixed phase split, per engine step.

Steps come from explicit annotations matched by the grammars in
``diagnose/data/step_markers.yaml`` (this project's collector, SGLang ``step[...]``, vLLM v1
``execute_...``) plus user regexes (``--phase prefill=REGEX``). Nested step markers (SGLang
wraps ``step[EXTEND ...]`` inside a vLLM-style ``execute_...`` range) collapse into the
outermost one. Without markers, the phase is read from operator shapes (see
:func:`shape_votes`); shapes that cannot tell, or that disagree, leave the phase ``unknown``:
we never guess.

A GPU activity belongs to the step whose CPU range contains the start of its host launch
call (correlation id); activities without a launch call stay outside every step.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from diagnose.analyzers.base import Notes
from diagnose.errors import DiagnoseError
from diagnose.patterns import check_pattern, clip
from diagnose.trace.kineto import parse_input_dims
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, factorize

from diagnose.vocab import STEP_PHASES as PHASES  # noqa: E402


@dataclass(frozen=True)
class Grammar:
    name: str
    pattern: re.Pattern
    phase_map: dict | None = None
    fixed_phase: str | None = None


@lru_cache(maxsize=1)
def builtin_grammars() -> tuple[Grammar, ...]:
    from diagnose.tables import marker_table

    return tuple(Grammar(g.name, re.compile(g.pattern), g.phase_map) for g in marker_table().grammars)


def user_grammars(specs: tuple[str, ...] | list[str]) -> list[Grammar]:
    """Parse ``--phase PHASE=REGEX`` options.

    Raises:
        DiagnoseError: malformed option, unknown phase, or invalid regex.
    """
    out = []
    for spec in specs or ():
        if "=" not in spec:
            raise DiagnoseError(f"--phase expects PHASE=REGEX (PHASE one of {', '.join(PHASES)}), got {spec!r}")
        phase, rx = spec.split("=", 1)
        phase = phase.strip().lower()
        if not rx.strip():
            raise DiagnoseError(f"--phase {phase}: empty regex (it would match every range)")
        if phase not in PHASES:
            raise DiagnoseError(f"--phase: unknown phase {phase!r}; use one of {', '.join(PHASES)}")
        pat = check_pattern(rx, f"--phase-regex {phase}")  # matched on a bounded prefix of each name (match_marker)
        out.append(Grammar(f"user:{phase}:{len(out)}", pat, fixed_phase=phase))
    return out


def _int(gd: dict, key: str) -> int | None:
    v = gd.get(key)
    return int(v) if v is not None else None


def match_marker(name: str, grammars) -> dict | None:
    """Return {phase, grammar, batch, tokens, context} for a step-marker name, else None.
    The first :data:`~diagnose.patterns.MATCH_PREFIX_CHARS` characters of the name are read
    (user regexes may backtrack: the work per name stays bounded)."""
    name = clip(name)
    for g in grammars:
        m = g.pattern.search(name)
        if not m:
            continue
        gd = m.groupdict()
        batch = _int(gd, "batch")
        if g.fixed_phase:
            phase = g.fixed_phase
        elif gd.get("phase"):
            phase = gd["phase"]
        elif gd.get("mode"):
            phase = (g.phase_map or {}).get(gd["mode"])
            if phase is None:
                return None  # e.g. SGLang IDLE steps
        elif gd.get("n_prefill") is not None:
            npf, ndc = int(gd["n_prefill"]), int(gd["n_decode"])
            if npf > 0 and ndc > 0:
                phase = "mixed"
            elif npf > 0:
                phase = "prefill"
            elif ndc > 0:
                phase = "decode"
            else:
                return None
            batch = npf + ndc
        else:
            continue
        context = _int(gd, "context")
        kv_tokens = _int(gd, "kv_tokens")
        if kv_tokens is None and phase == "decode" and batch and context:
            kv_tokens = batch * context
        tokens = _int(gd, "tokens")
        ptok, dtok = _int(gd, "prefill_tokens"), _int(gd, "decode_tokens")
        if tokens is None and ptok is not None and dtok is not None:
            tokens = ptok + dtok
        npf = _int(gd, "n_prefill")
        ndc = _int(gd, "n_decode")
        if npf is None:  # markers without request counts: the whole batch is of the step's phase
            npf = batch if phase == "prefill" else 0 if phase == "decode" else None
            ndc = batch if phase == "decode" else 0 if phase == "prefill" else None
        return {
            "phase": phase,
            "grammar": g.name,
            "batch": batch,
            "tokens": tokens,
            "context": context,
            "kv_tokens": kv_tokens,
            "prefill_requests": npf,
            "decode_requests": ndc,
        }
    return None


STEP_COLUMNS = ["name", "phase", "grammar", "start_ns", "end_ns", "batch", "tokens", "context", "kv_tokens",
                "prefill_requests", "decode_requests", "scope", "anchor_ns"]
_FILL = ("batch", "tokens", "context", "kv_tokens", "prefill_requests", "decode_requests")
CONTAINER_COLUMNS = ["name", "phase", "start_ns", "end_ns"]


def find_steps(trace: Trace, extra: list[Grammar] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Step table from annotations: one row per innermost step marker, sorted by start.

    A step is the innermost marker: SGLang's ``step[...]`` inside vLLM's ``execute_...``, a
    user marker inside another. An outer marker that contains steps is a *container*: its
    numbers (batch, tokens...) fill what the inner marker lacks, GPU work launched in it but
    in no inner step keeps the container's phase, and the first step of a container waits
    from the container's start (``anchor_ns``: where the step's waits before its GPU span
    begin).

    Returns:
        (steps, containers). steps columns: :data:`STEP_COLUMNS` (name, phase, grammar,
        start_ns, end_ns: the CPU range, or the GPU range when only GPU-side annotations carry
        the markers; batch, tokens, context, kv_tokens, prefill_requests, decode_requests:
        nullable ints; scope; anchor_ns). containers: name, phase, start_ns, end_ns.
    """
    grammars = list(extra or []) + list(builtin_grammars())
    ann = trace.annotations
    rows = []
    # PyTorch <= 1.9 writes record_function ranges (ProfilerStep#N, engine step markers) as
    # operators ("cat": "Operator"): they are searched last, when no annotation is a marker.
    sources = [("cpu", lambda: ann[ann["scope"] == "cpu"]), ("gpu", lambda: ann[ann["scope"] == "gpu"]),
               ("cpu", lambda: trace.cpu_ops)]
    for scope, frame in sources:
        sub = frame()
        if len(sub) == 0:
            continue
        # match each distinct name once (nsys exports carry millions of repeated NVTX names)
        codes, uniques = factorize(sub["name"])
        matched = [match_marker(str(u), grammars) for u in uniques]
        hit = np.array([m is not None for m in matched], dtype=bool)
        if not hit.any():
            continue
        sel = np.nonzero(hit[codes])[0]
        starts = sub["start_ns"].to_numpy()[sel]
        ends = sub["end_ns"].to_numpy()[sel]
        for c, st_, en_ in zip(codes[sel], starts, ends):
            rows.append({"name": str(uniques[c]), "start_ns": int(st_), "end_ns": int(en_), "scope": scope, **matched[c]})
        break  # CPU markers win; GPU-side copies of the same ranges are not extra steps
    if not rows:
        return pd.DataFrame(columns=STEP_COLUMNS), pd.DataFrame(columns=CONTAINER_COLUMNS)
    rows.sort(key=lambda r: (r["start_ns"], -r["end_ns"]))
    stack: list[dict] = []
    for r in rows:
        while stack and not (r["start_ns"] >= stack[-1]["start_ns"] and r["end_ns"] <= stack[-1]["end_ns"]):
            stack.pop()
        r["_parents"] = list(stack)
        r["_children"] = 0
        if stack:
            stack[-1]["_children"] += 1
        stack.append(r)
    steps, containers = [], []
    for r in rows:
        if r["_children"]:
            containers.append({k: r[k] for k in CONTAINER_COLUMNS})
            continue
        r["anchor_ns"] = r["start_ns"]
        for outer in reversed(r["_parents"]):
            for k in _FILL:
                if r.get(k) is None and outer.get(k) is not None:
                    r[k] = outer[k]
            if not outer.get("_anchored"):  # the first step of a container waits from its start
                outer["_anchored"] = True
                r["anchor_ns"] = min(r["anchor_ns"], outer["start_ns"])
        steps.append(r)
    return pd.DataFrame(steps)[STEP_COLUMNS], pd.DataFrame(containers, columns=CONTAINER_COLUMNS)


_ATTN_OPS = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
}
_BMM_OPS = {"aten::matmul", "aten::bmm", "aten::baddbmm"}
DECODE_MAX_QUERY = 16  # a query this short against a longer key set reads a KV cache


def _is_int_list(x, n_min: int) -> bool:
    """A shape of at least ``n_min`` sizes, none negative (symbolic or crafted sizes vote for nothing)."""
    return isinstance(x, list) and len(x) >= n_min and all(isinstance(v, int) and v >= 0 for v in x)


def _shape_ops(trace: Trace) -> pd.DataFrame:
    """The ops that carry phase evidence, sorted by start (computed once per trace)."""
    cached = getattr(trace, "_shape_ops_cache", None)
    if cached is None:
        ops = trace.cpu_ops
        cached = ops[ops["name"].isin({"aten::linear"} | _ATTN_OPS | _BMM_OPS)].sort_values("start_ns", kind="stable")
        trace._shape_ops_cache = cached  # type: ignore[attr-defined]
    return cached


def shape_votes(trace: Trace, start_ns: int, end_ns: int, batch_hint: int | None = None) -> tuple[set[str], int | None, int | None, int | None]:
    """Phase evidence from operator shapes inside [start_ns, end_ns].

    Rules (docs/prefill-decode.md §1): ``aten::linear`` input [B, S, H]: S == 1 -> decode, S > 1 -> prefill.
    Attention (SDPA ops: q [B, H, Sq, D] vs k [B, Hk, Sk, D]; batched matmuls
    [..., Sq, D] x [..., D, Sk]): Sq == Sk > 1 -> prefill (self-attention over the prompt);
    Sq < Sk with Sq <= 16 -> decode (a few new tokens against cached keys). 2-D linears
    ([tokens, H], as vLLM-style engines flatten the batch) carry no phase evidence of their
    own; with ``batch_hint`` (``--batch``, or the engine's markers or metadata) M tokens
    against B sequences read as decode when M == B and prefill when M is a multiple k > 1 of B.

    Returns:
        (votes, batch, seq_len, context): the phases voted for; B and S of the first 3-D
        linear (else M of the first 2-D linear as B with S = 1, the decode reading; else B and
        S of the first prefill-shaped SDPA query [B, H, S, D]); the
        KV context: the longest key length of decode-shaped SDPA ops, else the key length of
        the first decode-shaped batched matmul (QK^T runs before PV); or None.
    """
    ops = trace.cpu_ops
    votes: set[str] = set()
    batch = seq = context = None
    flat_m = None
    if len(ops) == 0:
        return votes, batch, seq, context
    ops = _shape_ops(trace)
    m = (ops["start_ns"] >= start_ns) & (ops["start_ns"] <= end_ns)
    sel = ops.loc[m]
    bmm_context = None  # from the first decode-shaped batched matmul: QK^T precedes PV
    sdpa_bs = None  # (B, S) of the first prefill-shaped SDPA op
    for name, raw in zip(sel["name"].to_numpy(), sel["input_dims"].to_numpy()):
        dims = parse_input_dims(raw)
        if not dims or len(dims) < 2:
            continue
        a, b = dims[0], dims[1]
        if name == "aten::linear":
            if _is_int_list(a, 3) and len(a) == 3:
                votes.add("decode" if a[1] == 1 else "prefill")
                if batch is None:
                    batch, seq = a[0], a[1]
            elif _is_int_list(a, 2) and len(a) == 2 and flat_m is None:
                flat_m = a[0]
            continue
        if name in _ATTN_OPS:
            if _is_int_list(a, 4) and _is_int_list(b, 4):
                sq, sk = a[-2], b[-2]
            else:
                continue
        else:
            if name == "aten::baddbmm" and len(dims) >= 3:
                a, b = dims[1], dims[2]
            if not (_is_int_list(a, 3) and _is_int_list(b, 3)) or a[-1] != b[-2]:
                continue
            sq, sk = a[-2], b[-1]
        if sq == sk and sq > 1:
            votes.add("prefill")
            if name in _ATTN_OPS and sdpa_bs is None:
                sdpa_bs = (a[0], sq)  # q [B, H, S, D]: B prompts of S tokens
        elif sq < sk and sq <= DECODE_MAX_QUERY:
            votes.add("decode")
            if name in _ATTN_OPS:
                context = sk if context is None else max(context, sk)
            elif bmm_context is None:
                bmm_context = sk
    if context is None:
        context = bmm_context
    if batch is None and flat_m is None and sdpa_bs is not None:
        batch, seq = sdpa_bs
    if batch is None and flat_m is not None and votes == {"decode"}:
        batch, seq = flat_m, 1
    if not votes and flat_m is not None and batch_hint:
        if flat_m == batch_hint:
            votes.add("decode")
            batch, seq = flat_m, 1
        elif flat_m > batch_hint and flat_m % batch_hint == 0:
            votes.add("prefill")
            batch, seq = batch_hint, flat_m // batch_hint
    return votes, batch, seq, context


#: Autograd backward work: the engine's ``autograd::engine::evaluate_function: XBackward0``
#: ranges (PyTorch >= 1.10), and, in PyTorch <= 1.9 traces that have no such range, the
#: backward nodes themselves (``CudnnConvolutionBackward``, ``AddmmBackward``) and the
#: ``aten::*_backward*`` ops they run.
_BACKWARD_OP = re.compile(r"^(?:autograd::engine::evaluate_function|aten::\w*_backward(?:_\w+)?$|[A-Z]\w*Backward\d*$)")


def _backward_ops(trace: Trace) -> tuple[np.ndarray, str | None]:
    """Start times of autograd backward ops (their presence marks a training step) and the
    name of one of them (None when there is none)."""
    ops = trace.cpu_ops
    if len(ops) == 0:
        return np.zeros(0, dtype=np.int64), None
    codes, uniques = pd.factorize(ops["name"], sort=False)
    is_bw = np.array([bool(_BACKWARD_OP.match(str(u))) for u in uniques], dtype=bool)
    if not is_bw.any():
        return np.zeros(0, dtype=np.int64), None
    return ops["start_ns"].to_numpy()[is_bw[codes]], str(uniques[np.argmax(is_bw)])


def _backward_starts(trace: Trace) -> np.ndarray:
    """Start times of autograd backward ops: their presence marks a training step."""
    return _backward_ops(trace)[0]


def _why_no_phase(trace: Trace) -> str:
    """The ``missing_markers`` message: what was looked for and not found."""
    ops = trace.cpu_ops
    if len(ops) == 0:
        shapes = "the trace holds no CPU operators, so no shapes to read a phase from"
    elif ops["input_dims"].isna().all():
        shapes = "its operators carry no 'Input Dims' shapes (torch.profiler records them with record_shapes=True)"
    else:
        shapes = ("no aten::linear [B, S, H] or attention operator has shapes that tell prefill from decode "
                  "(2-D [tokens, hidden] linears need --batch)")
    legacy = ""
    if len(ops) and ops["name"].astype(str).str.startswith("ProfilerStep#").any():
        legacy = ("; a PyTorch <= 1.9 trace (ProfilerStep#N written as an operator): its operators were searched "
                  "for step markers too")
    return (f"no step markers (no range named like a vLLM, SGLang or diagnose collect step){legacy}; {shapes}: "
            "phase is 'unknown' (use --phase-regex PHASE=REGEX)")


def steps_from_shapes(trace: Trace, batch_hint: int | None = None) -> pd.DataFrame:
    """Fallback step table from operator shapes, one step per ProfilerStep (or the whole trace).

    A window gets a phase when the evidence of :func:`shape_votes` is unanimous; windows with
    no or conflicting evidence, or in which autograd backward ops ran (training, not
    inference), are left out (their activities stay ``unknown``).
    """
    ann = trace.annotations
    windows = []
    # ProfilerStep#N ranges: annotations, or operators in PyTorch <= 1.9 traces
    for cpu in (ann[ann["scope"] == "cpu"] if len(ann) else ann, trace.cpu_ops):
        if windows or len(cpu) == 0:
            continue
        codes, uniques = factorize(cpu["name"])
        is_ps = np.array([str(u).startswith("ProfilerStep#") for u in uniques], dtype=bool)
        ps = cpu[is_ps[codes]] if len(uniques) else cpu
        windows = [(n, int(s), int(e)) for n, s, e in zip(ps["name"], ps["start_ns"], ps["end_ns"])]
    if not windows:
        frames = [f for f in (trace.cpu_ops, trace.runtime) if len(f)]
        if not frames:
            return pd.DataFrame(columns=STEP_COLUMNS)
        lo = min(int(f["start_ns"].min()) for f in frames)
        hi = max(int(f["end_ns"].max()) for f in frames)
        windows = [("trace", lo, hi)]
    backward = _backward_starts(trace)
    rows = []
    for name, s, e in windows:
        if len(backward) and np.any((backward >= s) & (backward <= e)):
            continue  # a training step (autograd backward ran): not prefill or decode
        votes, b, sl, ctx = shape_votes(trace, s, e, batch_hint)
        if len(votes) != 1:
            continue
        rows.append(
            {"name": name, "phase": votes.pop(), "grammar": "shapes", "start_ns": s, "end_ns": e,
             "batch": b, "tokens": b * sl if b is not None and sl is not None else None, "context": ctx,
             "kv_tokens": None, "prefill_requests": None, "decode_requests": None, "scope": "cpu", "anchor_ns": s}
        )
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def assign_steps(trace: Trace, steps: pd.DataFrame, launches: pd.DataFrame) -> np.ndarray:
    """Step index (row of ``steps``) for each GPU activity, -1 when outside every step.

    CPU-scoped steps: the step containing the activity's launch start. GPU-scoped steps
    (markers only on the GPU timeline): the step containing the activity's start.
    """
    n = len(trace.gpu)
    idx = np.full(n, -1, dtype=np.int64)
    if n == 0 or len(steps) == 0:
        return idx
    st = steps["start_ns"].to_numpy(dtype=np.int64)
    en = steps["end_ns"].to_numpy(dtype=np.int64)
    gpu_scoped = (steps["scope"] == "gpu").all()
    t = trace.gpu["start_ns"].to_numpy() if gpu_scoped else launches["launch_start_ns"].to_numpy()
    valid = t != NO_TIME
    pos = np.searchsorted(st, t, side="right") - 1
    ok = valid & (pos >= 0)
    ok[ok] &= t[ok] <= en[pos[ok]]
    idx[ok] = pos[ok]
    return idx


FINDINGS = ()


@dataclass(frozen=True)
class StepSplit:
    """The step table and its containers (:func:`find_steps`), with the quality notes the
    split raised (phases from shapes, a training trace, no markers, an unmatched regex)."""

    steps: pd.DataFrame
    containers: pd.DataFrame
    notes: tuple[QualityIssue, ...] = ()


def split_steps(trace: Trace, phase_regex: tuple[str, ...] | list[str] = (), batch: int | None = None) -> StepSplit:
    """The step table from markers (``--phase-regex`` first), else from operator shapes
    (``batch``: the ``--batch`` hint for flattened linears).

    Raises:
        DiagnoseError: a malformed ``--phase-regex``.
    """
    notes = Notes()
    user = user_grammars(phase_regex)
    steps, containers = find_steps(trace, user)
    if user:
        used = set(steps["grammar"]) if len(steps) else set()
        unmatched = [spec for spec, g in zip(phase_regex, user) if g.name not in used]
        if unmatched:
            notes.note("phase_regex_unmatched", "--phase-regex " + ", ".join(unmatched) + " matched no range in the trace "
                       "(check the marker names: diagnose run --format json lists the steps found)", len(unmatched))
    if len(steps) == 0:
        steps = steps_from_shapes(trace, batch)
        if len(steps):
            windows = "the ProfilerStep ranges" if steps["name"].astype(str).str.startswith("ProfilerStep#").any() else "the whole trace"
            notes.note("phases_from_shapes", f"no serving-engine step markers: the steps are {windows}, their phase inferred from "
                       "operator shapes (aten::linear [B,1,H] decode, [B,S>1,H] prefill; attention queries as long as their keys: "
                       "prefill)")
        else:
            _, backward = _backward_ops(trace)
            if backward is not None:
                notes.note("training_trace", f"autograd backward ops in the trace (e.g. {backward!r}): a training step, not "
                           "inference; phase 'unknown'")
            else:
                notes.note("missing_markers", _why_no_phase(trace))
    return StepSplit(steps, containers, tuple(notes.issues))
