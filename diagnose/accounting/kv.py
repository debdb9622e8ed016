"""KV-cache bytes (per token, per sequence, read per decode step) and the KV budget: how many
sequences fit on a device (docs/prefill-decode.md section 3, "KV capacity"); :func:`kv_plan` is the one
answer the ``kv-budget`` command and the web KV page give."""
from __future__ import annotations

import functools
import math

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.accounting.units import (
    DTYPE_BITS,
    FRAGMENTATION_FACTOR,
    GB,
    GiB,
    _check_dtype,
    _check_tp,
    _positive_arg,
    _positive_float,
    _positive_int,
)
from diagnose.accounting.spec import ModelSpec
from diagnose.accounting.weights import _tp_shapes, model_weights


def kv_bytes_per_token_from_shape(
    num_hidden_layers: int, num_key_value_heads: int, head_dim: int, kv_dtype: str = "fp16"
) -> int:
    """KV bytes per token = 2 (K and V) * L * n_kv * d * bytes per element.

    docs/prefill-decode.md section 2. ``int8``/``fp8`` = 1 byte, ``int4`` = half a byte (rounded up to
    whole bytes for the total); KV quantization scales are not counted.

    Raises:
        DiagnoseError: unknown dtype or non-positive shape.
    """
    kv_dtype = _check_dtype(kv_dtype, "KV dtype")
    for value, key in (
        (num_hidden_layers, "num_hidden_layers"),
        (num_key_value_heads, "num_key_value_heads"),
        (head_dim, "head_dim"),
    ):
        _positive_int(value, key)
    elems = 2 * num_hidden_layers * num_key_value_heads * head_dim
    return math.ceil(elems * DTYPE_BITS[kv_dtype] / 8)


def _kv_dtype(spec: ModelSpec, kv_dtype: str | None, default: str = "fp16") -> str:
    if kv_dtype is None:
        q = spec.quantization
        return q.kv_dtype if q is not None and q.kv_dtype else default
    return _check_dtype(kv_dtype, "KV dtype")


class KvLayout(msgspec.Struct, frozen=True):
    """KV-cache elements per token on one tensor-parallel rank, by attention window.

    Attributes:
        full_elements_per_token: elements per token summed over full-attention layers
            (2 * n_kv_per_rank * d per GQA layer; kv_lora_rank + qk_rope_head_dim per MLA layer).
        sliding: ``(window, elements per token summed over the layers with that window)``,
            ascending by window; () when no layer slides.
    """

    full_elements_per_token: int
    sliding: tuple[tuple[int, int], ...] = ()

    @property
    def elements_per_token(self) -> int:
        """Elements one token occupies over all layers (sliding layers included)."""
        return self.full_elements_per_token + sum(e for _, e in self.sliding)

    def sequence_elements(self, context: float) -> float:
        """Elements one sequence of ``context`` tokens holds (or a decode step reads for it):
        full layers every token, sliding layers min(context, window)."""
        return self.full_elements_per_token * context + sum(e * min(context, w) for w, e in self.sliding)


@functools.lru_cache(maxsize=256)
def _kv_layout(spec: ModelSpec, tp: int) -> KvLayout:
    if spec.mla is not None:
        per_layer = spec.mla.kv_elements_per_token_per_layer  # the latent, replicated on every rank
    else:
        per_layer = 2 * _tp_shapes(spec, tp)["kv_heads"] * spec.head_dim
    elems: dict[int | None, int] = {}
    for w in spec.layer_windows or (None,) * spec.num_hidden_layers:
        elems[w] = elems.get(w, 0) + per_layer
    full = elems.pop(None, 0)
    return KvLayout(full, tuple(sorted((w, e) for w, e in elems.items())))  # type: ignore[misc]


def kv_layout(spec: ModelSpec, tp: int = 1) -> KvLayout:
    """KV-cache elements per token on one rank, split by attention window (:class:`KvLayout`).

    GQA layers cache K and V: 2 * n_kv * d elements per token (docs/prefill-decode.md section 2), with
    max(1, n_kv / tp) heads per rank (vLLM replicates KV heads when tp > n_kv). MLA layers
    cache the latent kv_lora_rank + qk_rope_head_dim, replicated on every rank (vLLM MLA).

    Raises:
        DiagnoseError: bad ``tp`` or heads not divisible by it.
    """
    return _kv_layout(spec, _check_tp(tp))


@functools.lru_cache(maxsize=256)
def _kv_groups(spec: ModelSpec, kv_dtype: str, tp: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(full-attention KV bytes per token, ((window, KV bytes per token of the layers with
    that window), ...)) on one rank."""
    lay = _kv_layout(spec, tp)
    bits = DTYPE_BITS[kv_dtype]
    return math.ceil(lay.full_elements_per_token * bits / 8), tuple((w, math.ceil(e * bits / 8)) for w, e in lay.sliding)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | None = "fp16", *, tp: int = 1) -> int:
    """KV-cache bytes one token occupies over all layers on one rank (docs/prefill-decode.md section 2).

    ``2 * L * n_kv * d * bytes_per_elem``; reference config in fp16: 131,072 B = 128 KiB.
    MLA caches ``kv_lora_rank + qk_rope_head_dim`` elements per layer (replicated on every
    rank); with ``tp`` > 1, KV heads per rank are max(1, n_kv / tp). Sliding-window layers
    hold this per token only up to their window (see :func:`kv_read_bytes`). ``kv_dtype``
    None: the config's KV scheme, else fp16.

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    kvd = _kv_dtype(spec, kv_dtype)
    tp = _check_tp(tp)
    if tp == 1 and spec.mla is None:
        return kv_bytes_per_token_from_shape(spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim, kvd)
    full, sliding = _kv_groups(spec, kvd, tp)
    return full + sum(b for _, b in sliding)


def kv_read_bytes(spec: ModelSpec, batch: int, context: float, kv_dtype: str | None = "fp16", *, tp: int = 1) -> float:
    """KV bytes a decode step reads for ``batch`` sequences of ``context`` cached tokens each.

    Full-attention layers read ``batch * context`` tokens; a sliding-window layer reads
    ``batch * min(context, window)`` (it holds no more: Mistral/gpt-oss/Qwen2 sliding
    attention). Exact integer when ``context`` is an integer.

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    kvd = _kv_dtype(spec, kv_dtype)
    full, sliding = _kv_groups(spec, kvd, _check_tp(tp))
    total = batch * context * full
    for w, b in sliding:
        total += batch * min(context, w) * b
    return total


def kv_sequence_bytes(spec: ModelSpec, seq_len: int, kv_dtype: str | None = "fp16", *, tp: int = 1) -> int:
    """KV bytes one sequence of ``seq_len`` tokens holds on one rank: full layers keep every
    token, sliding-window layers min(seq_len, window) (vLLM frees blocks outside the window).

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    return int(kv_read_bytes(spec, 1, _positive_arg(seq_len, "sequence length"), kv_dtype, tp=tp))




class KvBudget(msgspec.Struct, frozen=True):
    """KV-cache footprint of a batch and, when memory is known, the concurrency ceiling.

    Attributes:
        kv_bytes_per_token: bytes one token occupies over all layers.
        seq_len: tokens per sequence (prompt + output).
        batch: sequences.
        kv_bytes_per_sequence: seq_len * kv_bytes_per_token (less for sliding-window
            layers, which hold at most their window).
        kv_bytes_total: batch * kv_bytes_per_sequence.
        memory_gb: device memory in GB (1e9), or None.
        overhead_gb: runtime overhead in GB (activations, CUDA context, allocator slack).
        weight_bytes: weights resident on the device.
        kv_memory_bytes: memory left for the KV cache, or None when memory is unknown.
        max_sequences: floor(kv_memory_bytes / kv_bytes_per_sequence), or None.
        usable_sequences: floor(max_sequences * fragmentation_factor), or None.
        fragmentation_factor: share of the ceiling usable after fragmentation.
        fits: batch <= max_sequences, or None when memory is unknown.
    """

    kv_bytes_per_token: int
    seq_len: int
    batch: int
    kv_bytes_per_sequence: int
    kv_bytes_total: int
    memory_gb: float | None
    overhead_gb: float
    weight_bytes: int
    kv_memory_bytes: int | None
    max_sequences: int | None
    usable_sequences: int | None
    fragmentation_factor: float
    fits: bool | None

    @property
    def kv_gib_per_sequence(self) -> float:
        """kv_bytes_per_sequence in GiB (2**30)."""
        return self.kv_bytes_per_sequence / GiB

    @property
    def kv_gib_total(self) -> float:
        """kv_bytes_total in GiB (2**30)."""
        return self.kv_bytes_total / GiB

    @property
    def kv_memory_gib(self) -> float | None:
        """kv_memory_bytes in GiB (2**30), or None."""
        return None if self.kv_memory_bytes is None else self.kv_memory_bytes / GiB


def kv_budget(
    kv_bytes_per_token: int,
    seq_len: int,
    batch: int = 1,
    *,
    memory_gb: float | None = None,
    overhead_gb: float = 0.0,
    weight_bytes: int = 0,
    kv_memory_bytes: int | None = None,
    fragmentation_factor: float = FRAGMENTATION_FACTOR,
    kv_bytes_per_sequence: int | None = None,
) -> KvBudget:
    """KV-cache footprint and concurrency ceiling (docs/prefill-decode.md sections 2 and 3).

    Memory for the KV cache is ``kv_memory_bytes`` when given, else
    ``memory_gb * 1e9 - overhead_gb * 1e9 - weight_bytes`` when ``memory_gb`` is given
    (GB = 1e9 throughout; pass GiB figures through ``kv_memory_bytes``). Then
    ``max_sequences = floor(kv_memory_bytes / (seq_len * kv_bytes_per_token))`` and
    ``usable_sequences = floor(max_sequences * fragmentation_factor)``.

    The default factor 0.75 reproduces docs/prefill-decode.md section 3 for the reference config with
    60 GiB of KV memory: 2k -> 240 (180 usable), 8k -> 60 (45), 32k -> 15 (11, the article
    says ~10), 128k -> 3 (2). No single factor gives both 240 -> 180 and 15 -> 10; 0.75 is
    the one the article's own 240 -> 180 and 60 -> 45 state. Note that 80 GB - 13.44 GB of
    weights - 5 GB overhead is 61.56 GB = 57.3 GiB, which the article rounds to "~60 GiB".

    Args:
        kv_bytes_per_token: bytes per token over all layers (:func:`kv_bytes_per_token`).
        seq_len: tokens per sequence (> 0).
        batch: sequences (> 0).
        memory_gb: device memory in GB (1e9 bytes), optional.
        overhead_gb: non-KV, non-weight memory in GB (1e9 bytes).
        weight_bytes: resident weight bytes.
        kv_memory_bytes: memory for KV directly, overriding the memory arithmetic.
        fragmentation_factor: in (0, 1].
        kv_bytes_per_sequence: bytes one sequence holds, when not seq_len *
            kv_bytes_per_token (sliding-window layers: :func:`kv_sequence_bytes`).

    Returns:
        The budget; ceiling fields are None when no memory figure is given.

    Raises:
        DiagnoseError: bad sizes, or weights plus overhead exceed the memory.
    """
    per_token = _positive_arg(kv_bytes_per_token, "KV bytes per token")
    s = _positive_arg(seq_len, "sequence length")
    b = _positive_arg(batch, "batch")
    if not 0 < fragmentation_factor <= 1:
        raise DiagnoseError(f"fragmentation factor must be in (0, 1], got {fragmentation_factor!r}")
    if overhead_gb < 0 or weight_bytes < 0:
        raise DiagnoseError("overhead and weight sizes must not be negative")
    per_seq = s * per_token if kv_bytes_per_sequence is None else _positive_arg(kv_bytes_per_sequence, "KV bytes per sequence")
    kv_mem: int | None = None
    if kv_memory_bytes is not None:
        kv_mem = int(kv_memory_bytes)
    elif memory_gb is not None:
        _positive_float(memory_gb, "memory (GB)")
        kv_mem = round(memory_gb * GB) - round(overhead_gb * GB) - int(weight_bytes)
    max_seq = usable = fits = None
    if kv_mem is not None:
        if kv_mem <= 0:
            raise DiagnoseError(
                f"no memory left for the KV cache: {memory_gb} GB minus {overhead_gb} GB "
                f"overhead minus {weight_bytes / GB:.2f} GB of weights is not positive"
            )
        max_seq = kv_mem // per_seq
        usable = math.floor(max_seq * fragmentation_factor)
        fits = b <= max_seq
    return KvBudget(
        kv_bytes_per_token=per_token,
        seq_len=s,
        batch=b,
        kv_bytes_per_sequence=per_seq,
        kv_bytes_total=b * per_seq,
        memory_gb=memory_gb,
        overhead_gb=overhead_gb,
        weight_bytes=int(weight_bytes),
        kv_memory_bytes=kv_mem,
        max_sequences=max_seq,
        usable_sequences=usable,
        fragmentation_factor=fragmentation_factor,
        fits=fits,
    )


class KvPlan(msgspec.Struct, frozen=True):
    """The answer to "how much KV cache, and how many sequences fit" for one model and
    sequence length: the ``diagnose kv-budget`` result, and one row of the web KV page.

    Attributes:
        model: the config's name, or None (shape flags only).
        layers, kv_heads, head_dim: the shapes used; kv_heads_per_rank: KV heads on one
            tensor-parallel rank (None for MLA, whose latent is not per head).
        mla: the per-token figure is MLA's latent (kv_lora_rank + qk_rope_head_dim).
        tp: tensor-parallel ranks; bytes_per_elem: KV element size in bytes.
        weight_dtype: the weights' format (the override, else the config's quantization).
        budget: the :class:`KvBudget` (bytes per token, sequence and batch; memory left for
            KV; the concurrency ceiling and its usable part).
        notes: assumptions worth a line (sliding windows, MLA, weights not subtracted...).
    """

    model: str | None
    layers: int
    kv_heads: int
    kv_heads_per_rank: int | None
    head_dim: int
    mla: bool
    tp: int
    bytes_per_elem: float
    weight_dtype: str | None
    budget: KvBudget
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """The ``diagnose kv-budget --format json`` object."""
        b = self.budget
        return {
            "model": self.model, "layers": self.layers, "kv_heads": self.kv_heads,
            "kv_heads_per_rank": self.kv_heads_per_rank, "head_dim": self.head_dim, "tp": self.tp,
            "bytes_per_elem": self.bytes_per_elem, "kv_bytes_per_token": b.kv_bytes_per_token, "seq_len": b.seq_len,
            "batch": b.batch, "kv_bytes_per_sequence": b.kv_bytes_per_sequence, "kv_bytes_total": b.kv_bytes_total,
            "kv_gib_per_sequence": b.kv_gib_per_sequence, "kv_gib_total": b.kv_gib_total, "memory_gb": b.memory_gb,
            "overhead_gb": b.overhead_gb, "weight_bytes": b.weight_bytes, "weight_dtype": self.weight_dtype,
            "kv_memory_bytes": b.kv_memory_bytes, "kv_memory_gib": b.kv_memory_gib, "max_sequences": b.max_sequences,
            "usable_sequences": b.usable_sequences, "fragmentation_factor": b.fragmentation_factor, "fits": b.fits,
            "notes": list(self.notes),
        }


def _kv_shapes(spec: ModelSpec | None, layers: int | None, kv_heads: int | None, head_dim: int | None) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim): the flags, else the config's.

    Raises:
        DiagnoseError: a shape is missing or not positive.
    """
    if spec is not None:
        layers = spec.num_hidden_layers if layers is None else layers
        kv_heads = spec.num_key_value_heads if kv_heads is None else kv_heads
        head_dim = spec.head_dim if head_dim is None else head_dim
    missing = [f for f, v in (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim)) if v is None]
    if missing:
        raise DiagnoseError(f"give {', '.join(missing)} or --model-config")
    for flag, value in (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim)):
        if value <= 0:
            raise DiagnoseError(f"{flag} must be > 0, got {value}")
    return layers, kv_heads, head_dim


def kv_plan(spec: ModelSpec | None, seq_len: int, batch: int = 1, *, layers: int | None = None, kv_heads: int | None = None,
            head_dim: int | None = None, bytes_per_elem: float = 2.0, weight_dtype: str | None = None, tp: int = 1,
            memory_gb: float | None = None, overhead_gb: float = 0.0, weights_gb: float | None = None,
            kv_memory_gib: float | None = None) -> KvPlan:
    """KV-cache bytes per token, sequence and batch, and how many sequences fit: the one
    function behind ``diagnose kv-budget`` and the web KV page.

    KV bytes per token = 2 * L * n_kv * d * bytes per element (docs/prefill-decode.md section 2); from the
    config, MLA layers cache kv_lora_rank + qk_rope_head_dim per token and sliding-window
    layers hold at most their window of each sequence. With ``tp``, per rank: max(1, n_kv /
    tp) KV heads (vLLM). Weights: the config's (quantization-aware, :func:`model_weights`;
    ``weight_dtype`` overrides), else ``weights_gb``. With ``memory_gb`` (or
    ``kv_memory_gib``): ceiling = floor(KV memory / KV per sequence), usable =
    floor(0.75 * ceiling) after fragmentation (docs/prefill-decode.md section 3; :func:`kv_budget`).

    Args:
        spec: the model config, or None (then ``layers``, ``kv_heads``, ``head_dim``).
        seq_len: tokens per sequence; batch: concurrent sequences.
        layers, kv_heads, head_dim: shape flags (override the config: every layer then
            counts as full GQA attention).
        bytes_per_elem: KV element size in bytes (2 fp16/bf16, 1 fp8/int8, 0.5 int4).
        memory_gb, overhead_gb, weights_gb: device memory, runtime overhead, weights without
            a config, in GB (1e9 B); kv_memory_gib: KV memory in GiB (2**30 B) instead.

    Raises:
        DiagnoseError: missing or bad shapes and sizes, conflicting options, weights plus
            overhead above the memory.
    """
    notes: list[str] = []
    shape_flags = any(v is not None for v in (layers, kv_heads, head_dim))
    layers, kv_heads, head_dim = _kv_shapes(spec, layers, kv_heads, head_dim)
    if not bytes_per_elem > 0 or math.isinf(bytes_per_elem):
        raise DiagnoseError(f"--bytes-per-elem must be > 0, got {bytes_per_elem}")
    if spec is not None and weights_gb is not None:
        raise DiagnoseError("give --weights-gb or --model-config, not both")
    if weights_gb is not None and weights_gb < 0:
        raise DiagnoseError(f"--weights-gb must be >= 0, got {weights_gb}")
    if kv_memory_gib is not None and not kv_memory_gib > 0:
        raise DiagnoseError(f"--kv-memory-gib must be > 0, got {kv_memory_gib}")
    if weight_dtype is not None and spec is None:
        raise DiagnoseError("--weight-dtype needs --model-config")
    per_seq: int | None = None
    mla = False
    if spec is not None and not shape_flags:
        lay = kv_layout(spec, tp)
        per_token = math.ceil(lay.elements_per_token * bytes_per_elem)
        if lay.sliding:
            per_seq = math.ceil(lay.sequence_elements(seq_len) * bytes_per_elem)
            windows = ", ".join(str(w) for w, _ in lay.sliding)
            notes.append(f"{spec.num_sliding_layers} sliding-window layers (window {windows}) hold at most their window of each sequence")
        mla = spec.mla is not None
        kv_heads_rank = None if mla else max(1, kv_heads // tp)
        if mla:
            notes.append("MLA: kv_lora_rank + qk_rope_head_dim elements per token and layer (--kv-heads/--head-dim do not apply)")
    else:
        if tp > 1 and kv_heads % tp and tp % kv_heads:
            raise DiagnoseError(f"--tp {tp}: --kv-heads {kv_heads} and {tp} do not divide one another")
        kv_heads_rank = max(1, kv_heads // tp)
        per_token = math.ceil(2 * layers * kv_heads_rank * head_dim * bytes_per_elem)
        if spec is not None and (spec.mla is not None or spec.layer_windows):
            notes.append("shape flags given: every layer counted as full GQA attention with those shapes")
    w = model_weights(spec, weight_dtype, tp) if spec is not None else None
    budget = kv_budget(per_token, seq_len, batch, memory_gb=memory_gb, overhead_gb=overhead_gb,
                       weight_bytes=w.bytes if w is not None else round((weights_gb or 0.0) * GB),
                       kv_memory_bytes=None if kv_memory_gib is None else round(kv_memory_gib * GiB),
                       kv_bytes_per_sequence=per_seq)
    if memory_gb is not None and spec is None and weights_gb is None and kv_memory_gib is None:
        notes.append("no weights subtracted from --memory-gb: give --model-config or --weights-gb")
    if kv_memory_gib is not None and memory_gb is not None:
        notes.append("--kv-memory-gib given: --memory-gb/--overhead-gb/weights are not used for the KV memory")
    wd = (weight_dtype.lower() if weight_dtype else model_weights(spec, None, tp).weight_format) if spec else None
    return KvPlan(spec.name if spec else None, layers, kv_heads, kv_heads_rank, head_dim, mla, tp, bytes_per_elem, wd,
                  budget, tuple(notes))
