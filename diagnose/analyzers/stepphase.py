"""A step's phase from what the step shows, when no marker says it.

Steps found from ``ProfilerStep#N``, engine python frames or the GPU structure carry no phase.
It is read from the evidence inside the step's CPU range, and left ``unknown`` when the
evidence is absent or disagrees (never forced):

* **operator shapes** (:func:`shape_votes`): ``aten::linear`` input ``[B, 1, H]`` decode,
  ``[B, S>1, H]`` prefill; attention whose query is as long as its keys (> 1) prefill, a
  query of at most 16 tokens against longer keys decode.
* **tokens and rows** (:func:`tokens_and_rows`): serving engines flatten the batch, so a step's
  linears read ``[T, H]`` with T = the tokens the step processes; the rows R into the LM head
  or the sampler are the sequences that get a token. T == R: every sequence adds one token,
  **decode**; R == 1 < T: one prompt, **prefill**; T > R > 1: a prefill of R prompts or a
  mixed step, which the counts cannot tell apart: no vote.
* **engine phase frames** (``phase_frames`` of ``diagnose/data/step_markers.yaml``): the engine
  took its decode path (SGLang ``forward_decode`` or a CUDA-graph replay, nano-vllm
  ``prepare_decode``) or its prefill path.
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

import numpy as np
import pandas as pd

from diagnose.trace.kineto import parse_input_dims
from diagnose.trace.model import Trace, factorize

_ATTN_OPS = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward",
    "aten::_efficient_attention_forward",
}
_BMM_OPS = {"aten::matmul", "aten::bmm", "aten::baddbmm"}
#: Sampler ops: their first input is the logits ``[R, V]``.
SAMPLER_OPS = {"aten::argmax", "aten::topk", "aten::multinomial", "aten::sort"}
DECODE_MAX_QUERY = 16  # a query this short against a longer key set reads a KV cache
#: A logits row at least this wide is a vocabulary (the project's LM-head width, see
#: ``diagnose.analyzers.tracetype.LM_HEAD_MIN_OUT``: vocabularies of released LLMs are 32k-256k).
VOCAB_MIN = 16384


def _is_int_list(x, n_min: int) -> bool:
    """A shape of at least ``n_min`` sizes, none negative (symbolic or crafted sizes vote for nothing)."""
    return isinstance(x, list) and len(x) >= n_min and all(isinstance(v, int) and v >= 0 for v in x)


def _shape_ops(trace: Trace) -> pd.DataFrame:
    """The ops that carry phase evidence, sorted by start (computed once per trace)."""
    cached = getattr(trace, "_shape_ops_cache", None)
    if cached is None:
        ops = trace.cpu_ops
        cached = ops[ops["name"].isin({"aten::linear"} | _ATTN_OPS | _BMM_OPS | SAMPLER_OPS)].sort_values("start_ns", kind="stable")
        trace._shape_ops_cache = cached  # type: ignore[attr-defined]
    return cached


def _window(trace: Trace, start_ns: int, end_ns: int) -> pd.DataFrame:
    ops = _shape_ops(trace)
    st = ops["start_ns"].to_numpy()
    lo = np.searchsorted(st, start_ns, side="left")
    hi = np.searchsorted(st, end_ns, side="right")
    return ops.iloc[int(lo):int(hi)]


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
    votes: set[str] = set()
    batch = seq = context = None
    flat_m = None
    if len(trace.cpu_ops) == 0:
        return votes, batch, seq, context
    sel = _window(trace, start_ns, end_ns)
    bmm_context = None  # from the first decode-shaped batched matmul: QK^T precedes PV
    sdpa_bs = None  # (B, S) of the first prefill-shaped SDPA op
    for name, raw in zip(sel["name"].to_numpy(), sel["input_dims"].to_numpy()):
        if name in SAMPLER_OPS:
            continue
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


def tokens_and_rows(trace: Trace, start_ns: int, end_ns: int) -> tuple[int | None, int | None]:
    """(T, R) of the step in [start_ns, end_ns] (module docstring), None where not shown.

    R: the rows of a sampler op on logits ``[R, V >= VOCAB_MIN]``, else of the LM head: the
    2-D linear with the widest output, called once in the step while every other weight
    shape is called at least twice (one per layer: the head runs once per forward, after
    the last layer). T: the most frequent first dimension of the other 2-D linears' inputs
    (the layers' ``[T, H]``); None when the layers ran inside a CUDA-graph replay (no ops).
    """
    if len(trace.cpu_ops) == 0:
        return None, None
    sel = _window(trace, start_ns, end_ns)
    rows_sampler = None
    weights: Counter = Counter()
    firsts: dict[tuple[int, int], Counter] = {}
    for name, raw in zip(sel["name"].to_numpy(), sel["input_dims"].to_numpy()):
        if name not in SAMPLER_OPS and name != "aten::linear":
            continue
        dims = parse_input_dims(raw)
        if not dims:
            continue
        a = dims[0]
        if name in SAMPLER_OPS:
            if rows_sampler is None and _is_int_list(a, 2) and len(a) == 2 and a[1] >= VOCAB_MIN:
                rows_sampler = a[0]
            continue
        if len(dims) < 2 or not (_is_int_list(a, 2) and len(a) == 2 and _is_int_list(dims[1], 2) and len(dims[1]) == 2):
            continue
        w = (dims[1][0], dims[1][1])
        weights[w] += 1
        firsts.setdefault(w, Counter())[a[0]] += 1
    head = None
    if weights:
        widest = max(weights, key=lambda w: w[0])
        if weights[widest] == 1 and all(c >= 2 for w, c in weights.items() if w != widest) and \
                sum(1 for w in weights if w[0] == widest[0]) == 1:
            head = widest
    rows = rows_sampler
    if rows is None and head is not None:
        rows = next(iter(firsts[head]))
    body: Counter = Counter()
    for w, c in firsts.items():
        if w != head:
            body.update(c)
    tokens = body.most_common(1)[0][0] if body else None
    return tokens, rows


def tr_vote(tokens: int | None, rows: int | None) -> str | None:
    """decode when T == R, prefill when R == 1 < T, else None (module docstring)."""
    if tokens is None or rows is None or rows < 1:
        return None
    if tokens == rows:
        return "decode"
    if rows == 1 and tokens > 1:
        return "prefill"
    return None


@lru_cache(maxsize=1)
def _phase_frame_table() -> tuple[tuple[str, re.Pattern], ...]:
    from diagnose.tables import marker_table

    return tuple((r.phase, re.compile(r.pattern)) for r in marker_table().phase_frames)


def _phase_frame_events(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns sorted, phase) of the python frames a phase-frame grammar matches (once per trace)."""
    cached = getattr(trace, "_phase_frames_cache", None)
    if cached is None:
        pf = trace.python_frames
        st, ph = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=object)
        if len(pf):
            codes, uniq = factorize(pf["name"])
            table = _phase_frame_table()
            phase_of = np.array([next((p for p, rx in table if rx.search(str(u))), "") for u in uniq] + [""], dtype=object)
            hit = phase_of[codes] != ""
            if hit.any():
                st = pf["start_ns"].to_numpy()[hit]
                ph = phase_of[codes][hit]
                order = np.argsort(st, kind="stable")
                st, ph = st[order], ph[order]
        cached = (st, ph)
        trace._phase_frames_cache = cached  # type: ignore[attr-defined]
    return cached


def frame_phases(trace: Trace, start_ns: int, end_ns: int) -> set[str]:
    """Phases said by the engine's phase frames that start inside [start_ns, end_ns]."""
    st, ph = _phase_frame_events(trace)
    if len(st) == 0:
        return set()
    lo, hi = np.searchsorted(st, start_ns, side="left"), np.searchsorted(st, end_ns, side="right")
    return set(ph[lo:hi].tolist())


def step_phase(trace: Trace, start_ns: int, end_ns: int, batch_hint: int | None = None) -> dict:
    """The phase a step window shows (module docstring) and the counts read on the way.

    Returns:
        {"phase": prefill | decode | unknown, "evidence": what decided it (str, "" when
        nothing did), "batch", "seq", "context", "tokens"}.
    """
    votes, b, sl, ctx = shape_votes(trace, start_ns, end_ns, batch_hint)
    used = ["operator shapes"] if votes else []
    tokens, rows = tokens_and_rows(trace, start_ns, end_ns)
    v = tr_vote(tokens, rows)
    if v:
        votes.add(v)
        used.append(f"{tokens} tokens for {rows} sampled row(s)")
    fph = frame_phases(trace, start_ns, end_ns)
    if fph:
        votes |= fph
        used.append("the engine's " + "/".join(sorted(fph)) + " path")
    phase = next(iter(votes)) if len(votes) == 1 else "unknown"
    if b is None and v == "decode":
        b, sl = rows, 1
    tok = b * sl if b is not None and sl is not None else tokens
    return {"phase": phase, "evidence": ", ".join(used) if phase != "unknown" else "", "batch": b, "seq": sl,
            "context": ctx, "tokens": tok}
