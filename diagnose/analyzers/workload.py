"""What the trace runs, before its steps get a prefill/decode reading: LLM serving, or not.

Traces that are not LLM serving are named with a quality code and the headline's caveat;
their steps are still found and timed, but no prefill/decode phase is read from them (no
TTFT, TPOT or phase MFU/MBU, so no prefill or decode rule applies). The evidence, in order:

1. ``training_trace``: autograd backward ops (``*_backward``, ``autograd::engine::evaluate_function``),
   optimizer ranges (``Optimizer.step#``, ``Optimizer.zero_grad#``, ``## zero_grad ##``), or
   backward kernels (cuDNN ``dgrad``/``wgrad``, ``bn_bw``, ``*backward*``) of at least two kinds
   (a model's backward pass runs the backward of several layer kinds; a single one, e.g. a
   loss's backward in an op benchmark, is not a training step).
2. LLM serving (no code): a KV-cache kernel (paged attention, ``reshape_and_cache``,
   ``store_kvcache``...), a sampler (``argmax``/``topk``/``multinomial``/``sort`` on
   vocabulary-wide logits, an engine's sampler frames), an engine step marker or frame, or
   causal attention (an attention op whose ``is_causal`` is true).
3. ``vision_forward``: convolution kernels take more time than the other GEMMs (a CNN).
4. ``diffusion_loop``: two or more steps that run the same kernels (weighted Jaccard of their
   kernel-name counts >= :data:`diagnose.analyzers.structure.SIM` for every consecutive
   pair), with GEMM and attention kernels and none of the LLM evidence: a denoising loop
   (or any repeated non-serving forward; a kernels-only trace cannot tell them apart).
5. ``encoder_forward``: GEMM and attention with bidirectional attention (``is_causal``
   false) and none of the LLM evidence: an encoder forward, or one transformer block.
Otherwise nothing is said (an LLM forward without a sampler, e.g. a plain Hugging Face
forward with causal attention, keeps its shape-based reading).
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.categories import CATEGORY_NAMES, base_name, category_ids
from diagnose.analyzers.opcost import _CAUSAL_ARG, _flag
from diagnose.analyzers.stepphase import SAMPLER_OPS, VOCAB_MIN, _is_int_list
from diagnose.analyzers.structure import CONV_KERNEL, SIM, weighted_jaccard_pairs
from diagnose.patterns import ascii_folded
from diagnose.trace.kineto import parse_input_dims
from diagnose.trace.model import Trace, factorize

#: Autograd backward work: the engine's ``autograd::engine::evaluate_function: XBackward0``
#: ranges (PyTorch >= 1.10), and in PyTorch <= 1.9 traces the backward nodes themselves
#: (``CudnnConvolutionBackward``, ``AddmmBackward``) and the ``aten::*_backward*`` ops they run.
BACKWARD_OP = re.compile(r"^(?:autograd::engine::evaluate_function|aten::\w*_backward(?:_\w+)?$|[A-Z]\w*Backward\d*$)")
BACKWARD_KERNEL = re.compile(r"wgrad|dgrad|bn_bw|backward|updateGradInput", re.I)
OPTIMIZER_RANGE = re.compile(r"^Optimizer\.(?:step|zero_grad)#|^## zero_grad ##$")
#: Kernels that write a paged KV cache (attention-category names, but no attention compute).
KV_WRITE_KERNEL = re.compile(r"reshape_and_cache|store_kvcache|set_kv_buffer|concat_and_cache|kv_cache_write", re.I)
#: Kernels that write or read a paged KV cache: LLM serving.
KV_CACHE_KERNEL = re.compile(r"reshape_and_cache|store_kvcache|set_kv_buffer|concat_and_cache|kv_?cache|paged_?attention|"
                             r"PagedKV", re.I)
SAMPLER_FRAME = re.compile(r"(?:^|/)sampler\.py\(\d+\): |/sampling/|/v1/sample/")


class Evidence(msgspec.Struct, frozen=True):
    """Counts of what the trace shows (module docstring); ``conv_ms``/``gemm_ms`` kernel time."""

    backward_ops: int = 0
    backward_kernels: int = 0
    optimizer_ranges: int = 0
    kv_cache_kernels: int = 0
    sampler: int = 0
    causal_attention: int = 0
    bidirectional_attention: int = 0
    attention_kernels: int = 0
    gemm_kernels: int = 0
    conv_ms: float = 0.0
    gemm_ms: float = 0.0

    backward_kernel_kinds: int = 0
    backward_example: str | None = None  # one backward op's name, for the message

    @property
    def training(self) -> bool:
        return bool(self.backward_ops or self.optimizer_ranges or self.backward_kernel_kinds >= 2)

    @property
    def llm(self) -> bool:
        return bool(self.kv_cache_kernels or self.sampler or self.causal_attention)


class Workload(msgspec.Struct, frozen=True):
    """The trace's kind: a quality ``code`` of :data:`diagnose.vocab.NON_LLM_TRACE_TYPES` and
    its message, or None (LLM serving, or nothing to say)."""

    code: str | None = None
    message: str = ""
    evidence: Evidence = Evidence()


def _name_counts(values: pd.Series) -> pd.Series:
    """Occurrences per distinct name (a hash of the column, not a factorization: op names are
    hundreds of thousands of Python str)."""
    return values.value_counts(sort=False) if len(values) else pd.Series([], dtype=np.int64)


def _count(counts: pd.Series, rx: re.Pattern) -> int:
    """How many of the counted names ``rx`` matches (each distinct name matched once)."""
    return int(sum(c for u, c in counts.items() if rx.search(str(u))))


def _first(counts: pd.Series, rx: re.Pattern) -> str | None:
    """The first counted name (in trace order) ``rx`` matches."""
    return next((str(u) for u in counts.index if rx.search(str(u))), None)


def trace_evidence(trace: Trace) -> Evidence:
    """The counts of :class:`Evidence` (each distinct name classified once)."""
    ops, ann, g = trace.cpu_ops, trace.annotations, trace.gpu
    op_counts = _name_counts(ops["name"])
    backward_ops = _count(op_counts, BACKWARD_OP)
    example = _first(op_counts, BACKWARD_OP)
    optim = _count(_name_counts(ann[ann["scope"] == "cpu"]["name"]), OPTIMIZER_RANGE) + _count(op_counts, OPTIMIZER_RANGE)
    sampler = _count(_name_counts(trace.python_frames["name"]), SAMPLER_FRAME)
    causal = bidir = 0
    if len(ops):
        sub = ops[ops["name"].isin(SAMPLER_OPS | set(_CAUSAL_ARG))]
        for name, raw, craw in zip(sub["name"].to_numpy(), sub["input_dims"].to_numpy(), sub["concrete_inputs"].to_numpy()):
            if name in SAMPLER_OPS:
                dims = parse_input_dims(raw)
                a = dims[0] if dims else None
                if _is_int_list(a, 2) and len(a) == 2 and a[1] >= VOCAB_MIN:
                    sampler += 1
                continue
            flag = _flag(parse_input_dims(craw) if craw is not None else None, _CAUSAL_ARG[name])
            causal += flag is True
            bidir += flag is False
    bw_k = kv = attn = gemm = bw_kinds = 0
    conv_ms = gemm_ms = 0.0
    if len(g):
        codes, names = factorize(g["name"])
        cat = CATEGORY_NAMES[category_ids(g, codes, names)]
        is_kernel = (g["kind"] == "kernel").to_numpy()
        dur = (g["end_ns"] - g["start_ns"]).to_numpy()

        def flag_of(rx):
            found = ascii_folded(rx)
            return np.array([found(str(n)) for n in names] + [False], dtype=bool)[codes] & is_kernel

        conv, kvk, bwk = flag_of(CONV_KERNEL), flag_of(KV_CACHE_KERNEL), flag_of(BACKWARD_KERNEL)
        gm = np.isin(cat, ("gemm", "moe")) & is_kernel & ~conv
        at = (cat == "attention") & is_kernel & ~kvk
        bw_k, kv, attn, gemm = int(bwk.sum()), int(kvk.sum()), int(at.sum()), int(gm.sum())
        bw_kinds = len({base_name(str(names[c])) for c in np.unique(codes[bwk])})
        conv_ms, gemm_ms = float(dur[conv].sum()) / 1e6, float(dur[gm].sum()) / 1e6
    return Evidence(backward_ops, bw_k, optim, kv, sampler, causal, bidir, attn, gemm, conv_ms, gemm_ms, bw_kinds, example)


def repeated_steps(step_idx: np.ndarray, codes: np.ndarray, n_steps: int) -> bool:
    """Two or more steps, every consecutive pair running the same kernels (weighted Jaccard
    of their kernel-name counts >= SIM)."""
    if n_steps < 2:
        return False
    sim = weighted_jaccard_pairs(step_idx, codes, n_steps, 1)
    return bool(len(sim) and (sim >= SIM).all())


def _note(code: str, message: str, ev: Evidence) -> Workload:
    """The kind ``code`` with its quality-note message."""
    return Workload(code, message, ev)


def classify(ev: Evidence, engine_steps: bool, repeated: int) -> Workload:
    """The kind (module docstring). ``engine_steps``: an engine marker or frame gave steps;
    ``repeated``: the number of steps when they repeat (:func:`repeated_steps`), else 0."""
    if ev.training:
        parts = [f"{n:,} {what}" for n, what in ((ev.backward_ops, "autograd backward ops"),
                                                  (ev.backward_kernels if ev.backward_kernel_kinds >= 2 else 0, "backward kernels"),
                                                  (ev.optimizer_ranges, "optimizer ranges")) if n]
        eg = f", e.g. {ev.backward_example!r}" if ev.backward_example else ""
        return _note("training_trace", f"a training step ({', '.join(parts)}{eg}): steps are timed, no prefill/decode "
                        "reading (TTFT, TPOT, phase MFU/MBU) applies", ev)
    if ev.llm or engine_steps:
        return Workload(None, "", ev)
    if ev.conv_ms > 0 and ev.conv_ms > ev.gemm_ms:
        return _note("vision_forward", f"a convolutional (vision) forward: convolution kernels take {ev.conv_ms:.3f} ms, "
                        f"more than the other GEMMs ({ev.gemm_ms:.3f} ms), with no KV cache or sampler: not LLM serving; "
                        "steps are timed, no prefill/decode reading applies", ev)
    if ev.gemm_kernels and ev.attention_kernels and repeated:
        return _note("diffusion_loop", f"{repeated} repeated steps of GEMM + attention kernels (the same kernels each "
                        "step) with no KV-cache write, sampler or causal attention: a denoising loop (diffusion) or a "
                        "repeated forward, not LLM serving; steps are timed, no prefill/decode reading (TTFT, TPOT) "
                        "applies", ev)
    if ev.gemm_kernels and ev.attention_kernels and ev.bidirectional_attention and not ev.causal_attention:
        return _note("encoder_forward", f"a transformer forward with bidirectional attention (is_causal false on "
                        f"{ev.bidirectional_attention} attention op(s)) and no KV cache or sampler: an encoder forward "
                        "or one block, not LLM serving; no prefill/decode reading (TTFT, prefill MFU) applies", ev)
    return Workload(None, "", ev)
