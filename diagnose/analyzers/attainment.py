"""Measured attainment per phase: achieved TFLOP/s and TB/s, MFU, MBU, arithmetic intensity,
compute- or memory-bound against the ridge point, and the ratio to the analytic lower bound.

Sources of each input (the report lists the ones that were missing in ``attainment_missing``):

* **FLOPs** — from operator shapes (``Input Dims`` of aten::mm/addmm/bmm/baddbmm/matmul/
  linear/_scaled_mm and the SDPA / flash-attention ops), counting only the outermost such op
  on each thread (aten::linear -> aten::matmul -> aten::mm is one GEMM). An op belongs to the
  step whose CPU range contains its start, which is also where its kernels' launch calls sit,
  so FLOPs and kernels of a step are the same work. Steps replayed from a CUDA graph run no
  operators on the CPU: their FLOPs come from the model config instead (docs/prefill-decode.md §2:
  decode ``2 * P * B`` plus attention ``4 * n_h * d * ctx * L * B``; prefill linear + LM head +
  causal attention). SDPA-family attention is causal when the op's ``Concrete Inputs`` say
  ``is_causal`` (``cpu_ops.concrete_inputs``), else counted with a full mask (an upper bound).
* **Bytes** — from the model config when known (:func:`diagnose.accounting.step_cost`: MoE
  experts touched, quantized weights, sliding windows, MLA and tensor parallelism per rank) (trace metadata ``diagnose.model_config`` or
  ``--model-config``): decode step = weight bytes + KV tokens read x KV bytes per token;
  prefill step = weight bytes + tokens x KV bytes per token written (docs/prefill-decode.md §3). Without
  a config: operand bytes of the FLOP ops (inputs + output, by ``Input type``), a lower
  estimate that ignores cache reuse.
* **Time** — the phase's step own times (GPU span minus external waits, see waits.py):
  a marker that starts long before its GPU work does not lower MFU/MBU.
* **Peaks** — the device row of ``diagnose/data/gpus.yaml`` resolved from the trace's device
  name, or ``--gpu`` / ``--peak-tflops`` / ``--bandwidth-tbps``. MFU uses the dense FP16/BF16
  tensor peak. Unknown device: attainment is skipped, never guessed.

``bound_ratio`` = phase step time / sum over its steps of max(bytes / BW, FLOPs / peak)
(:func:`diagnose.roofline.roofline`, the one formula the bounds command and the collectors use too).
"""
from __future__ import annotations


import msgspec
import numpy as np
import pandas as pd

from diagnose import accounting
from diagnose.accounting import CostTerm, ModelSpec
from diagnose.analyzers.base import Notes, declared
from diagnose.errors import DiagnoseError
from diagnose.hardware import GpuPeak, peak_from_overrides
from diagnose.model import Attainment, Device, Gpu, ModelInfo
from diagnose.model import CostTerm as Term
from diagnose.roofline import roofline
from diagnose.trace.kineto import parse_input_dims
from diagnose.trace.model import QualityIssue, Trace, per_unique

from diagnose.analyzers.opcost import (  # noqa: E402  (re-exported)
    FLOP_OPS, GEMM_OPS, MoeLayerBytes, SeqInfo, is_attention_op, is_moe_op, op_bytes, op_flops)


#: Kinds of shape FLOPs per step (:func:`step_shape_flops`), the terms of an attainment
#: whose FLOPs come from operator shapes.
SHAPE_TERMS = ("gemm", "attention", "moe")


class ShapeFlops(msgspec.Struct, frozen=True):
    """FLOPs and operand bytes from operator shapes, per step (int64/float arrays aligned with
    the step table).

    Attributes:
        flops: all FLOPs (the sum of the kinds).
        by_kind: per kind of :data:`SHAPE_TERMS`, FLOPs.
        bytes: operand bytes of the FLOP ops (GEMM/attention; no bytes for MoE ops).
        count: FLOP ops counted.
    """

    flops: np.ndarray
    by_kind: dict[str, np.ndarray]
    bytes: np.ndarray
    count: np.ndarray


def moe_flops_per_token(inp: "AttainmentInputs | None") -> float | None:
    """Routed-expert FLOPs one token costs in one MoE layer on one rank: ``2 * k * (one
    expert's gate, up and down weights)`` from the model config; None without a MoE config."""
    if inp is None or inp.spec is None or inp.spec.moe is None:
        return None
    try:
        w = accounting.model_weights(inp.spec, inp.weight_dtype, inp.tp)
    except DiagnoseError:
        return None
    return 2.0 * w.num_experts_per_tok * w.expert_params if w.expert_params else None


def _moe_call_flops(dims: list | None, per_token: float | None) -> float | None:
    """FLOPs of one MoE-layer call from its shapes: the tokens routed (first dimension of
    its first input, ``vllm::moe_forward [[T, H], [T, E]]``) x :func:`moe_flops_per_token`."""
    if per_token is None or not dims or not isinstance(dims[0], list) or len(dims[0]) != 2:
        return None
    t = dims[0][0]
    return float(t * per_token) if isinstance(t, int) and not isinstance(t, bool) and 0 < t < 1 << 40 else None


def step_shape_flops(trace: Trace, steps: pd.DataFrame, moe_per_token: float | None = None,
                     seqs: list | None = None) -> ShapeFlops:
    """FLOPs and operand bytes from shapes per step, by kind, and the count of FLOP ops per
    step (:mod:`diagnose.analyzers.opcost`; varlen attention ops get the step's sequence sums
    from its markers, :func:`diagnose.analyzers.kernels.step_seq_infos`). MoE-layer ops
    (``vllm::moe_forward``) count ``T x moe_per_token`` (:func:`moe_flops_per_token`: their
    expert weights are not in their shapes; without a MoE config they count nothing).
    """
    n = len(steps)
    by_kind = {k: np.zeros(n, dtype=np.float64) for k in SHAPE_TERMS}
    nbytes = np.zeros(n, dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    ops = trace.cpu_ops
    empty = ShapeFlops(np.zeros(n, dtype=np.float64), by_kind, nbytes, count)
    if n == 0 or len(ops) == 0:
        return empty
    names_all = ops["name"]
    keep = names_all.isin(FLOP_OPS).to_numpy() | per_unique(names_all, is_attention_op)
    if moe_per_token is not None:
        keep |= per_unique(names_all, is_moe_op)
    ops = ops[keep]
    if len(ops) == 0:
        return empty
    ops = ops.sort_values(["tid", "start_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    # Outermost only: an op is nested when an earlier op on its thread ends at or after its end.
    tid = ops["tid"].to_numpy()
    end = ops["end_ns"].to_numpy()
    nested = np.zeros(len(ops), dtype=bool)
    for t in np.unique(tid):
        m = np.nonzero(tid == t)[0]
        e = end[m]
        prev_max = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], e[:-1])))
        nested[m] = e <= prev_max
    outer = ops[~nested]
    if seqs is None:
        from diagnose.analyzers.kernels import step_seq_infos

        seqs = step_seq_infos(trace, steps)
    st = steps["start_ns"].to_numpy(dtype=np.int64)
    en = steps["end_ns"].to_numpy(dtype=np.int64)
    s_all = outer["start_ns"].to_numpy(dtype=np.int64)
    pos = np.searchsorted(st, s_all, side="right") - 1
    inside = (pos >= 0) & (s_all <= en[np.maximum(pos, 0)])
    outer, pos = outer[inside], pos[inside]
    if len(outer) == 0:
        return empty
    names = outer["name"].to_numpy(dtype=object)
    cols = [outer[c].to_numpy(dtype=object) if c in outer else np.full(len(outer), None, dtype=object)
            for c in ("input_dims", "input_types", "concrete_inputs")]
    # only attention costs read the step (its sequence sums): other ops cost the same in every step
    per_step = ~np.asarray(outer["name"].isin(GEMM_OPS).to_numpy(), dtype=bool)
    key = _key_codes([names, *cols, np.where(per_step, pos, -1)])
    first = np.unique(key, return_index=True)[1]
    u_kind, u_flops, u_bytes = _distinct_costs(names[first], [c[first] for c in cols], pos[first], moe_per_token, seqs)
    kind, f, b = u_kind[key], u_flops[key], u_bytes[key]
    for j, k in enumerate(SHAPE_TERMS):  # summed in the op table's order, as one call after another
        by_kind[k] = np.bincount(pos, weights=np.where(kind == j, f, 0.0), minlength=n)
    np.add.at(count, pos, (kind >= 0).astype(np.int64))
    np.add.at(nbytes, pos, b)
    return ShapeFlops(sum(by_kind.values()), by_kind, nbytes, count)


def _key_codes(columns: list[np.ndarray]) -> np.ndarray:
    """One code per row for the combination of ``columns`` (equal rows, equal codes; codes
    dense from 0). Unhashable values (decoded lists) are told apart by identity."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    for col in columns:
        try:
            c = pd.factorize(col, use_na_sentinel=False)[0]
        except TypeError:
            c = pd.factorize(np.fromiter(map(id, col), dtype=np.int64, count=len(col)))[0]
        code = pd.factorize(code * (int(c.max(initial=0)) + 1) + c)[0]
    return code


def _distinct_costs(names, cols, pos, moe_per_token, seqs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct (name, Input Dims, Input type, Concrete Inputs[, step]) of
    :func:`step_shape_flops`: the kind (index into :data:`SHAPE_TERMS`, -1: not counted),
    FLOPs and operand bytes (0 when unknown) of one call."""
    kinds = np.full(len(names), -1, dtype=np.int64)
    flops = np.zeros(len(names), dtype=np.float64)
    nbytes = np.zeros(len(names), dtype=np.int64)
    for i, (name, raw, traw, craw, p) in enumerate(zip(names, *cols, pos.tolist())):
        dims = parse_input_dims(raw)
        if is_moe_op(name):
            f = _moe_call_flops(dims, moe_per_token)
            if f is not None:
                kinds[i], flops[i] = SHAPE_TERMS.index("moe"), f
            continue
        f = op_flops(name, dims, concrete=parse_input_dims(craw) if craw is not None else None, seqs=seqs[p])
        if f is None:
            continue
        kinds[i], flops[i] = SHAPE_TERMS.index("gemm" if name in GEMM_OPS else "attention"), f
        nbytes[i] = op_bytes(dims, parse_input_dims(traw) if traw is not None else None) or 0
    return kinds, flops, nbytes


class AttainmentInputs(msgspec.Struct):
    """What attainment needs besides the trace. Flags win over trace metadata."""

    spec: ModelSpec | None = None
    spec_source: str | None = None
    peak: GpuPeak | None = None
    weight_dtype: str | None = None  # None: the config's quantization_config (16-bit without one)
    kv_dtype: str | None = None
    tp: int = 1
    tp_source: str | None = None
    batch: int | None = None
    context: int | None = None
    prompt_len: int | None = None
    lm_head: str = "last"
    notes: list[str] = msgspec.field(default_factory=list)


def _step_cost(spec: ModelSpec, inp: AttainmentInputs, phase: str, batch, tokens, kv_tokens, seqs: accounting.SeqSums | None = None,
               logit_rows: int | None = None) -> accounting.StepCost:
    """:func:`diagnose.accounting.step_cost` of one step on one rank with the inputs' dtypes,
    tensor parallelism and LM-head convention (engine FLOPs: the step's sums and sampled rows)."""
    return accounting.step_cost(spec, phase, batch=batch, tokens=tokens, kv_tokens=kv_tokens, weight_dtype=inp.weight_dtype,
                                kv_dtype=inp.kv_dtype, tp=inp.tp, lm_head=inp.lm_head, seqs=seqs, logit_rows=logit_rows)


def moe_layer_bytes(steps: pd.DataFrame | None, inp: AttainmentInputs | None) -> MoeLayerBytes | None:
    """Per step, the routed-expert bytes one MoE layer reads (:class:`MoeLayerBytes`), with
    each step's batch, tokens and KV tokens resolved exactly as for its MFU/MBU (flags first,
    then the step's markers). None without a MoE model config or without steps."""
    if inp is None or inp.spec is None or inp.spec.moe is None or steps is None or len(steps) == 0:
        return None
    try:
        w = accounting.model_weights(inp.spec, inp.weight_dtype, inp.tp)
    except DiagnoseError:
        return None
    if not w.moe_layers:
        return None
    n = len(steps)
    per_layer, touched, tokens = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    for i, r in enumerate(steps.itertuples(index=False)):
        phase = r.phase
        batch, tok, kv_tokens = _step_shape(r, phase, inp)
        try:
            c = _step_cost(inp.spec, inp, phase, batch, tok, kv_tokens)
        except DiagnoseError:
            continue
        if c.experts_touched_per_layer is None:
            continue
        per_layer[i] = c.expert_bytes / w.moe_layers
        touched[i] = c.experts_touched_per_layer
        t = batch if phase == "decode" else tok
        tokens[i] = np.nan if t is None else t
    if np.isnan(per_layer).all():
        return None
    return MoeLayerBytes(per_layer, touched, tokens, w.num_experts, w.num_experts_per_tok, w.expert_bytes, w.moe_layers)


def _val(v):
    return None if v is None or pd.isna(v) else int(v)


def _step_shape(r, phase: str, inp: AttainmentInputs) -> tuple[int | None, int | None, int | None]:
    """(batch, tokens, kv_tokens) of a step: flags first, then the step's markers or shapes."""
    batch, tokens, kv_tokens = _val(r.batch), _val(r.tokens), _val(r.kv_tokens)
    if phase == "decode":
        batch = inp.batch or batch
        ctx = inp.context or _val(r.context)
        if (kv_tokens is None or inp.context or inp.batch) and batch and ctx:
            kv_tokens = batch * ctx
    elif phase == "prefill":
        batch = inp.batch or batch
        if inp.prompt_len and batch:
            tokens = inp.prompt_len * batch
    return batch, tokens, kv_tokens


def _seq_sums(r) -> accounting.SeqSums | None:
    """The step's per-sequence sums (``seq_info`` column: :class:`~.opcost.SeqInfo`) when
    they are complete."""
    si = getattr(r, "seq_info", None)
    if si is None or not isinstance(si, SeqInfo) or None in (si.q_tokens, si.kv_tokens, si.q_sq_sum, si.qk_sum):
        return None
    return accounting.SeqSums(si.q_tokens, si.kv_tokens, si.q_sq_sum, si.qk_sum)


def _logit_rows(r) -> int | None:
    """Rows the LM head computes in a step whose marker counts its requests (prefill +
    decode requests: one sampled token each), else None."""
    n = [_val(getattr(r, c, None)) for c in ("prefill_requests", "decode_requests")]
    if all(x is None for x in n):
        return None
    return sum(x for x in n if x) or None


def _config_costs(phase: str, psteps: pd.DataFrame, inp: AttainmentInputs) -> list:
    """Engine cost (:func:`diagnose.accounting.step_cost`) of each step from the model config."""
    out: list = []
    for r in psteps.itertuples(index=False):
        batch, tokens, kv_tokens = _step_shape(r, phase, inp)
        try:
            out.append(_step_cost(inp.spec, inp, phase, batch, tokens, kv_tokens, _seq_sums(r), _logit_rows(r)))
        except DiagnoseError:
            out.append(None)
    return out


def _sum_terms(costs: list, shapes: pd.DataFrame | None) -> list[CostTerm]:
    """The phase's FLOP and byte terms: the config terms summed over its steps (FLOPs kept
    only where the FLOPs come from the config), and, when ``shapes`` (the steps' shape-FLOP
    columns) is given, the shape terms instead of the config FLOPs."""
    names: list[str] = []
    acc: dict[str, list] = {}
    for c in costs:
        for t in (c.terms if c is not None else ()):
            if t.name not in acc:
                names.append(t.name)
                acc[t.name] = [None, None, t.flops_source, t.bytes_source]
            a = acc[t.name]
            if t.flops is not None:
                a[0] = (a[0] or 0.0) + t.flops
            if t.bytes is not None:
                a[1] = (a[1] or 0.0) + t.bytes
            if t.flops_source == "marker":
                a[2] = "marker"
    out = []
    if shapes is not None:
        for k in SHAPE_TERMS:
            v = float(shapes[f"shape_{k}_flops"].sum())
            if v:
                out.append(CostTerm(k, v, None, "shapes", None))
    for n in names:
        f, b, fs, bs = acc[n]
        if shapes is not None:
            f, fs = None, None
        if f is None and b is None:
            continue
        out.append(CostTerm(n, f, b, fs if f is not None else None, bs if b is not None else None))
    return out


def phase_attainment(phase: str, psteps: pd.DataFrame, inp: AttainmentInputs, graph_steps: np.ndarray) -> Attainment:
    """Attainment numbers for one phase from its steps (columns of the step table plus
    shape_flops, shape_bytes, shape_ops, the shape FLOPs by kind and seq_info).
    ``graph_steps``: bool per step, kernels replayed from a graph."""
    out: dict = {k: None for k in ("flops", "bytes", "achieved_tflops", "achieved_tbps", "mfu", "mbu",
                                             "arithmetic_intensity", "bound", "bound_ratio", "peak_tflops", "peak_tbps")}
    out["flops_source"] = None
    out["bytes_source"] = None
    missing: list[str] = []
    if len(psteps) == 0:
        out["attainment_missing"] = ["steps"]
        return Attainment(**out)
    time_ns = psteps["own_ns"].to_numpy(dtype=np.float64)
    total_s = float(time_ns.sum()) / 1e9
    step_flops = np.full(len(psteps), np.nan)
    step_bytes = np.full(len(psteps), np.nan)
    shape_ok = (psteps["shape_ops"].to_numpy() > 0) & ~graph_steps
    if shape_ok.all():
        step_flops[:] = psteps["shape_flops"].to_numpy(dtype=np.float64)
        out["flops_source"] = "shapes"
    costs = _config_costs(phase, psteps, inp) if inp.spec is not None else []
    model_flops = np.array([np.nan if c is None or c.flops is None else c.flops for c in costs], dtype=np.float64)
    for i, c in enumerate(costs):
        if c is None:
            continue
        if np.isnan(step_flops[i]) and c.flops is not None:
            step_flops[i] = c.flops
        if c.bytes is not None:
            step_bytes[i] = c.bytes
    if inp.spec is not None and not np.isnan(step_bytes).any():
        out["bytes_source"] = f"model config ({inp.spec_source})"
    elif inp.spec is None and shape_ok.all() and (psteps["shape_bytes"].to_numpy() > 0).all():
        step_bytes[:] = psteps["shape_bytes"].to_numpy(dtype=np.float64)
        out["bytes_source"] = "operand sizes from shapes (no model config)"
    if out["flops_source"] == "shapes" and inp.spec is not None:
        if len(model_flops) and not np.isnan(model_flops).any() and model_flops.sum() > 0:
            out["forward_coverage"] = round(float(step_flops.sum() / model_flops.sum()), 4)
    if out["flops_source"] is None and not np.isnan(step_flops).any():
        out["flops_source"] = f"model config ({inp.spec_source})"
    if np.isnan(step_flops).any():
        step_flops[:] = np.nan
        if graph_steps.any():
            missing.append("flops (kernels replayed from a CUDA graph carry no operator shapes; give --model-config)")
        else:
            missing.append("flops (no operator shapes; give --model-config)")
    if np.isnan(step_bytes).any():
        step_bytes[:] = np.nan
        if inp.spec is None:
            missing.append("bytes (no model config: give --model-config)")
        else:
            missing.append("bytes (batch/context unknown: give --batch and --context)")
    if costs or out["flops_source"] == "shapes":
        terms = _sum_terms(costs, psteps if out["flops_source"] == "shapes" else None)
        if terms:
            out["terms"] = [Term(name=t.name, flops=t.flops, bytes=t.bytes, flops_source=t.flops_source,
                                 bytes_source=t.bytes_source) for t in terms]
    peak = inp.peak
    if peak is None:
        missing.append("peak (device not in the GPU table: give --gpu or --peak-tflops/--bandwidth-tbps)")
    r = roofline(step_flops, step_bytes, total_s, peak)
    out.update({k: getattr(r, k) for k in ("flops", "bytes", "achieved_tflops", "achieved_tbps", "mfu", "mbu",
                                           "arithmetic_intensity", "bound", "bound_ratio", "peak_tflops", "peak_tbps")})
    if r.bound_s is not None:
        out["bound_s"] = r.bound_s
    out["attainment_missing"] = missing
    return Attainment(**out)


def _gpu(peak: GpuPeak | None) -> Gpu | None:
    return None if peak is None else Gpu(**peak.to_dict())


def _model_info(inp: AttainmentInputs) -> ModelInfo | None:
    if inp.spec is None:
        return None
    sp = inp.spec
    w = accounting.model_weights(sp, inp.weight_dtype, inp.tp)
    return ModelInfo(
        name=sp.name,
        source=inp.spec_source,
        params_total=sp.params_total,
        params_active_per_token=sp.params_active_per_token,
        weight_dtype=inp.weight_dtype,
        weight_format=w.weight_format,
        weight_bytes=w.bytes,
        kv_dtype=inp.kv_dtype,
        kv_bytes_per_token=accounting.kv_bytes_per_token(sp, inp.kv_dtype, tp=inp.tp),
        tp=inp.tp,
        tp_source=inp.tp_source,
    )


_DTYPE_ALIASES = {"float32": "fp32", "torch.float32": "fp32", "float16": "fp16", "torch.float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "torch.bfloat16": "bf16", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                  "fp8": "fp8", "int8": "int8", "int4": "int4"}


def attainment_inputs(trace: Trace, options, dev_list: list[Device], note) -> AttainmentInputs:
    """Resolve model config, peaks, dtypes and shapes from flags, then trace metadata.

    Raises:
        DiagnoseError: an unreadable ``--model-config``, unknown ``--gpu`` or bad override.
    """
    inp = AttainmentInputs(batch=options.batch, context=options.context, prompt_len=options.prompt_len)
    meta = trace.metadata.get("diagnose") if isinstance(trace.metadata.get("diagnose"), dict) else {}
    if options.model_config:
        inp.spec = accounting.load_model_config(options.model_config)
        inp.spec_source = options.model_config
    elif isinstance(meta.get("model_config"), dict):
        try:
            inp.spec = ModelSpec.from_hf_config(meta["model_config"], name=meta["model_config"].get("_name_or_path") or "trace metadata")
            inp.spec_source = "trace metadata"
        except accounting.UnsupportedModelConfig as e:
            note("model_config_unsupported", f"the model config in trace metadata has {e.key!r}, which changes bytes or FLOPs in a "
                 f"way not modelled ({e}): no analytic bound")
        except DiagnoseError as e:
            note("model_config_unusable", f"model config in trace metadata is unusable: {e}")
    wd = options.weight_dtype or _DTYPE_ALIASES.get(str(meta.get("dtype", "")).lower())
    inp.weight_dtype = wd
    inp.kv_dtype = options.kv_dtype or (wd if wd in ("fp32", "fp16", "bf16") else None)
    if options.tp:
        inp.tp, inp.tp_source = options.tp, "--tp"
    elif inp.spec is not None:
        di = trace.metadata.get("distributedInfo") if isinstance(trace.metadata.get("distributedInfo"), dict) else {}
        ws = di.get("world_size")
        if isinstance(ws, int) and not isinstance(ws, bool) and ws > 1:
            why = _tp_refusal(inp.spec, ws)
            if why is None:
                inp.tp, inp.tp_source = ws, "distributedInfo.world_size (every rank taken as tensor-parallel; give --tp otherwise)"
            else:  # a pipeline/data-parallel world (vllm#10365): never an error about a flag not given
                inp.tp, inp.tp_source = 1, f"1: distributedInfo.world_size {ws} is not a tensor-parallel degree of this model ({why})"
                note("world_size_not_tp", f"distributedInfo.world_size is {ws}, which cannot be this model's tensor-parallel "
                     f"degree ({why}): the rank is taken as unsharded (tp 1); give --tp if it is sharded otherwise")
    if isinstance(meta.get("prefill_logits_positions"), int) and meta["prefill_logits_positions"] > 1:
        inp.lm_head = "all"  # a plain Hugging Face forward computes logits for every position
    name = dev_list[0].name if dev_list else ""
    inp.peak = peak_from_overrides(options.gpu, options.peak_tflops, options.bandwidth_tbps, device_name=name)
    if inp.peak is None and dev_list:
        note("unknown_device_peak", f"device {name or '(unnamed)'!r} is not in the GPU peak table: MFU/MBU skipped (use --gpu NAME or --peak-tflops/--bandwidth-tbps)")
    return inp


def _tp_refusal(spec: ModelSpec, tp: int) -> str | None:
    """Why ``tp`` cannot shard ``spec`` the way vLLM does (heads, KV heads or widths not
    divisible), or None when it can."""
    try:
        accounting.kv_layout(spec, tp)
        accounting.model_weights(spec, None, tp)
    except DiagnoseError as e:
        return str(e).split(": ", 1)[-1]
    return None


#: The roofline numbers of a row that is not a step phase (all, unknown).
NO_ATTAINMENT = Attainment(flops=None, bytes=None, achieved_tflops=None, achieved_tbps=None, mfu=None, mbu=None,
                           arithmetic_intensity=None, bound=None, bound_ratio=None, peak_tflops=None, peak_tbps=None,
                           attainment_missing=["computed per step phase (prefill, decode, mixed) only"])


class AttainmentPrep(msgspec.Struct, frozen=True):
    """What attainment needs per phase, prepared once per trace.

    Attributes:
        steps: the step table plus shape_flops, shape_bytes, shape_ops (operator FLOPs and
            operand bytes per step, :func:`step_shape_flops`).
        graph_steps: per step, True when its kernels were replayed from a graph.
        inputs: model config, peaks, dtypes and shape flags (:func:`attainment_inputs`).
        moe: per step, the routed-expert bytes of one MoE layer (:func:`moe_layer_bytes`; the
            kernel table's MoE rows), None without a MoE config.
        gpu, model: the report's ``gpu`` and ``model`` sections.
        notes: unnamed_device, model_config_unsupported / _unusable, unknown_device_peak.
    """

    steps: pd.DataFrame
    graph_steps: np.ndarray
    inputs: AttainmentInputs
    moe: MoeLayerBytes | None
    gpu: Gpu | None
    model: ModelInfo | None
    notes: tuple[QualityIssue, ...] = ()


def prepare_attainment(trace: Trace, options, steps: pd.DataFrame, activities: pd.DataFrame,
                       devices: list[Device]) -> AttainmentPrep:
    """Operator FLOPs per step, which steps were replayed from a graph, the model/peak inputs
    and, for a MoE model config, each step's routed-expert bytes per layer.

    Raises:
        DiagnoseError: an unreadable ``--model-config``, unknown ``--gpu`` or bad override.
    """
    notes = Notes()
    g = activities
    inp = attainment_inputs(trace, options, devices, notes.note)
    from diagnose.analyzers.kernels import step_seq_infos

    seqs = step_seq_infos(trace, steps) if len(steps) else []
    sf = step_shape_flops(trace, steps, moe_flops_per_token(inp), seqs)
    steps = steps.assign(shape_flops=sf.flops, shape_bytes=sf.bytes, shape_ops=sf.count,
                         **{f"shape_{k}_flops": v for k, v in sf.by_kind.items()},
                         seq_info=pd.Series(seqs, index=steps.index, dtype=object))
    graph_steps = np.zeros(len(steps), dtype=bool)
    if len(steps) and len(g):
        gs = g.loc[(g["step"] >= 0) & (g["launch_kind"] == "graph_launch"), "step"].unique()
        graph_steps[gs.astype(np.int64)] = True
    for d in devices:
        if not d.name:
            given = (f"peaks from {inp.peak.selection or inp.peak.name}" if inp.peak is not None
                     else "peak numbers cannot be resolved from it (use --gpu)")
            notes.note("unnamed_device", f"device {d.id} has no name in the trace: {given}")
    return AttainmentPrep(steps, graph_steps, inp, moe_layer_bytes(steps, inp), _gpu(inp.peak), _model_info(inp),
                          tuple(notes.issues))


FINDINGS = declared("attainment")
