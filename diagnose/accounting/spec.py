"""The model config: :class:`ModelSpec` from a Hugging Face ``config.json`` (MoE, MLA, sliding
windows, quantization), the shipped configs, units and dtype widths (see :mod:`diagnose.accounting`)."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.inputs import check_model_sizes, parsing, read_text_file
from diagnose.accounting.units import UnsupportedModelConfig, _nonneg_int, _positive_int
from diagnose.accounting.quant import QuantSpec, _parse_quantization


_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def _set(v: Any) -> bool:
    """True when a config value is present and not null/false/empty/0."""
    return v is not None and v is not False and v != 0 and v != [] and v != {} and v != ""


#: Config keys that change bytes or FLOPs but are not modelled, each with the test that its
#: value is "active" and the reason given in :class:`UnsupportedModelConfig`. Kept beside
#: the accounting so that adding support means removing a row here.
UNSUPPORTED_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ep_size": (lambda v: v not in (None, 1), "expert parallelism is not modelled (experts are split by width over tensor-parallel ranks only)"),
    "attention_chunk_size": (_set, "chunked local attention (Llama 4) is not modelled"),
    "interleave_moe_layer_step": (_set, "Llama 4 MoE interleaving is not modelled"),
    "intermediate_size_mlp": (_set, "Llama 4 dense/shared MLP widths are not modelled"),
    "moe_layers": (_set, "an explicit list of MoE layers is not modelled"),
    "mlp_layer_types": (_set, "per-layer MLP types are not modelled"),
    "residual_moe": (_set, "a dense MLP in parallel with the experts (residual MoE) is not modelled"),
    "moe_num_experts": (_set, "this MoE expert-count key is not read (use num_local_experts, num_experts or n_routed_experts)"),
    "moe_num_shared_experts": (_set, "this shared-expert key is not read (use n_shared_experts or shared_expert_intermediate_size)"),
    "dense_intermediate_size": (_set, "a separate dense-layer width is not modelled"),
    "shared_intermediate_size": (_set, "this shared-expert width key is not read (use shared_expert_intermediate_size)"),
    "cross_attention_layers": (_set, "cross-attention layers are not modelled"),
    "layers_block_type": (_set, "hybrid (state-space / linear-attention) layers are not modelled"),
    "hybrid_override_pattern": (_set, "hybrid (state-space) layers are not modelled"),
    "attn_layer_period": (_set, "hybrid (state-space) layers are not modelled"),
    "expert_layer_period": (_set, "hybrid MoE layer periods are not modelled"),
    "linear_num_key_heads": (_set, "linear-attention layers are not modelled"),
    "full_attention_interval": (_set, "linear-attention layers are not modelled"),
    "index_topk": (_set, "sparse attention with an indexer (DeepSeek-V3.2) is not modelled"),
    "compression_config": (_set, "legacy compressed-tensors configs are not modelled (use quantization_config)"),
}

#: Model types whose sliding-window layer pattern is implied by the architecture (not by the
#: config) when ``layer_types`` is absent: refused rather than guessed.
_PATTERNED_SLIDING = ("gemma2", "gemma3", "gemma3_text", "cohere2")

#: Attention kinds of ``layer_types`` that are modelled.
_LAYER_TYPES = ("full_attention", "sliding_attention")




class MoeSpec(msgspec.Struct, frozen=True):
    """Mixture-of-experts shape, in Hugging Face config terms.

    Attributes:
        num_experts: E, routed experts per MoE layer (``num_local_experts`` |
            ``num_experts`` | ``n_routed_experts``).
        num_experts_per_tok: k, experts each token is routed to (``num_experts_per_tok``).
        expert_intermediate_size: F_e, width of one expert's gated MLP
            (``moe_intermediate_size``, else ``intermediate_size``).
        shared_intermediate_size: total width of the shared-expert MLP every token runs
            (``shared_expert_intermediate_size``, else ``n_shared_experts`` x F_e; 0 if none).
        moe_layers: one bool per decoder layer, True where the MLP is a MoE block (dense
            layers from ``first_k_dense_replace``, ``moe_layer_freq``, ``mlp_only_layers``,
            ``decoder_sparse_step``).
    """

    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    moe_layers: tuple[bool, ...] = ()

    @property
    def num_moe_layers(self) -> int:
        """Decoder layers whose MLP is a MoE block."""
        return sum(self.moe_layers)


class MlaSpec(msgspec.Struct, frozen=True):
    """Multi-head latent attention (DeepSeek-V2/V3), config names.

    Attributes:
        kv_lora_rank: width of the compressed KV latent (cached per token and layer).
        q_lora_rank: width of the query low-rank projection, or None (a plain q_proj).
        qk_nope_head_dim: per-head query/key width without rotary embedding.
        qk_rope_head_dim: per-head rotary width (one shared rotary key cached per token).
        v_head_dim: per-head value width.
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV-cache elements per token and layer: kv_lora_rank + qk_rope_head_dim (the
        latent vLLM's MLA backends cache; DeepSeek-V2 paper section 2.1.2)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def _parse_moe(src: Mapping[str, Any], layers: int, intermediate: int) -> MoeSpec | None:
    key, e = None, None
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        if src.get(k) is not None:
            key, e = k, src[k]
            break
    if key is None or e == 0:
        return None
    e = _positive_int(e, key)
    k_key = "num_experts_per_tok" if src.get("num_experts_per_tok") is not None else "experts_per_token"
    top_k = src.get(k_key)
    if top_k is None:
        raise DiagnoseError(f"model config has {key} but no 'num_experts_per_tok'")
    top_k = _positive_int(top_k, k_key)
    if top_k > e:
        raise DiagnoseError(f"model config: num_experts_per_tok ({top_k}) exceeds {key} ({e})")
    width = src.get("moe_intermediate_size")
    width = intermediate if width is None else _positive_int(width, "moe_intermediate_size")
    if src.get("shared_expert_intermediate_size") is not None:
        shared = _nonneg_int(src["shared_expert_intermediate_size"], "shared_expert_intermediate_size")
    else:
        n_shared = src.get("n_shared_experts")
        shared = 0 if n_shared is None else _nonneg_int(n_shared, "n_shared_experts") * width
    first = src.get("first_k_dense_replace")
    first = 0 if first is None else _nonneg_int(first, "first_k_dense_replace")
    freq = src.get("moe_layer_freq")
    freq = 1 if freq is None else _positive_int(freq, "moe_layer_freq")
    step = src.get("decoder_sparse_step")
    step = 1 if step is None else _positive_int(step, "decoder_sparse_step")
    only = src.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise DiagnoseError(f"model config key 'mlp_only_layers' must be a list of layer indices, got {only!r}")
    dense = set(only)
    # DeepSeek (modeling_deepseek.py): MoE where i >= first_k_dense_replace and
    # i % moe_layer_freq == 0; Qwen2-MoE (modeling_qwen2_moe.py): MoE where i is not in
    # mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    moe_layers = tuple(
        i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in dense for i in range(layers)
    )
    return MoeSpec(e, top_k, width, shared, moe_layers)


def _parse_mla(src: Mapping[str, Any]) -> MlaSpec | None:
    if src.get("kv_lora_rank") is None:
        return None
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if src.get(key) is None:
            raise DiagnoseError(f"model config has kv_lora_rank (MLA) but no {key!r}")
    q = src.get("q_lora_rank")
    return MlaSpec(
        kv_lora_rank=_positive_int(src["kv_lora_rank"], "kv_lora_rank"),
        q_lora_rank=None if q is None else _positive_int(q, "q_lora_rank"),
        qk_nope_head_dim=_positive_int(src["qk_nope_head_dim"], "qk_nope_head_dim"),
        qk_rope_head_dim=_positive_int(src["qk_rope_head_dim"], "qk_rope_head_dim"),
        v_head_dim=_positive_int(src["v_head_dim"], "v_head_dim"),
    )


def _parse_windows(src: Mapping[str, Any], layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window (None = full attention); () when no layer slides."""
    types = src.get("layer_types")
    sw = src.get("sliding_window")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise DiagnoseError(f"model config key 'layer_types' must list {layers} layer kinds")
        bad = sorted({t for t in types if t not in _LAYER_TYPES}, key=str)
        if bad:
            raise UnsupportedModelConfig("layer_types", f"layer kind {bad[0]!r} is not modelled (modelled: {', '.join(_LAYER_TYPES)})")
        if "sliding_attention" not in types:
            return ()
        if sw is None:
            raise DiagnoseError("model config marks sliding_attention layers but has no 'sliding_window'")
        w = _positive_int(sw, "sliding_window")
        return tuple(w if t == "sliding_attention" else None for t in types)
    if "use_sliding_window" in src and not src["use_sliding_window"]:
        return ()
    if sw is None or sw is False:
        return ()
    w = _positive_int(sw, "sliding_window")
    if str(src.get("model_type", "")).lower() in _PATTERNED_SLIDING:
        raise UnsupportedModelConfig(
            "sliding_window",
            f"model_type {src.get('model_type')!r} interleaves sliding and full layers by architecture; add 'layer_types' to the config",
        )
    if _set(src.get("sliding_window_pattern")):
        raise UnsupportedModelConfig("sliding_window_pattern", "give the pattern as 'layer_types' instead")
    if "max_window_layers" in src:
        # Qwen2 family (configuration_qwen2.py): use_sliding_window defaults to False; when
        # true, layers from max_window_layers on use the window.
        if not src.get("use_sliding_window", False):
            return ()
        first = _nonneg_int(src["max_window_layers"], "max_window_layers")
        if first >= layers:
            return ()
        return tuple(w if i >= first else None for i in range(layers))
    # A bare sliding_window (Mistral-7B-v0.1): every layer slides.
    return tuple(w for _ in range(layers))


def _check_unsupported(src: Mapping[str, Any]) -> None:
    for key, (active, why) in UNSUPPORTED_KEYS.items():
        if key in src and active(src[key]):
            raise UnsupportedModelConfig(key, why)




class ModelSpec(msgspec.Struct, frozen=True):
    """Shape of a decoder-only transformer, in Hugging Face ``config.json`` names.

    Dense GQA models need only the first eight fields; MoE, MLA, sliding windows and
    quantization come from :meth:`from_hf_config`.

    Attributes:
        num_hidden_layers: L, number of decoder layers.
        hidden_size: H, model width.
        num_attention_heads: n_h, query heads.
        num_key_value_heads: n_kv, key/value heads (n_h for MHA, 1 for MQA, else GQA).
        head_dim: d, width of one head (unused by MLA layers, see ``mla``).
        intermediate_size: F, gated-MLP inner width of dense layers.
        vocab_size: V.
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        name: label for reports (``_name_or_path`` or ``model_type`` when present).
        moe: mixture-of-experts shape, or None for a dense model.
        mla: multi-head latent attention shape, or None for GQA/MHA/MQA.
        layer_windows: per-layer sliding window in tokens (None = full attention), or ()
            when no layer slides.
        quantization: weight quantization from ``quantization_config``, or None (16 bit).
        mtp_layers: ``num_nextn_predict_layers``: DeepSeek multi-token-prediction layers,
            not counted in the forward step (see :attr:`params_mtp`).
    """

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    name: str = "model"
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    layer_windows: tuple[int | None, ...] = ()
    quantization: QuantSpec | None = None
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        for key in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            _positive_int(getattr(self, key), key)
        if self.num_attention_heads % self.num_key_value_heads:
            raise DiagnoseError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_hidden_layers:
            raise DiagnoseError("layer_windows must give one entry per layer")
        if self.moe is not None and len(self.moe.moe_layers) != self.num_hidden_layers:
            raise DiagnoseError("moe.moe_layers must give one entry per layer")

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` dict.

        Defaults (docs/prefill-decode.md section 2): ``num_key_value_heads`` = ``num_attention_heads``
        (MHA) when absent or null; ``head_dim`` = ``hidden_size // num_attention_heads``
        when absent or null; ``tie_word_embeddings`` = False. When a top-level key is
        missing and the config has a nested ``text_config`` (multimodal wrappers), the
        nested values are used, falling back to the top level key by key (the vision tower
        is not counted). MoE, MLA, sliding windows and ``quantization_config`` are read as
        described in ``docs/model-accounting.md``.

        Args:
            cfg: the parsed ``config.json``.
            name: label; defaults to ``_name_or_path``, then ``model_type``, then "model".

        Returns:
            The spec.

        Raises:
            UnsupportedModelConfig: a key that changes bytes or FLOPs is not modelled
                (:data:`UNSUPPORTED_KEYS`, unknown ``quant_method`` or ``layer_types``).
            DiagnoseError: a required key is missing or not a positive integer (one-line
                message naming the key), a size beyond :data:`diagnose.inputs.MODEL_SIZE_BOUNDS`,
                or the config is not a JSON object.
        """
        if not isinstance(cfg, Mapping):
            raise DiagnoseError("model config must be a JSON object")
        check_model_sizes(cfg, "model config")
        src: Mapping[str, Any] = cfg
        text = cfg.get("text_config")
        if isinstance(text, Mapping) and any(k not in cfg for k in _REQUIRED_KEYS):
            src = {**cfg, **text}
        for key in _REQUIRED_KEYS:
            if src.get(key) is None:
                raise DiagnoseError(f"model config is missing required key {key!r}")
        _check_unsupported(src)
        n_h = _positive_int(src["num_attention_heads"], "num_attention_heads")
        hidden = _positive_int(src["hidden_size"], "hidden_size")
        layers = _positive_int(src["num_hidden_layers"], "num_hidden_layers")
        intermediate = _positive_int(src["intermediate_size"], "intermediate_size")
        n_kv = src.get("num_key_value_heads")
        n_kv = n_h if n_kv is None else _positive_int(n_kv, "num_key_value_heads")
        head_dim = src.get("head_dim")
        if head_dim is None:
            if hidden % n_h:
                raise DiagnoseError(
                    f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({n_h}) "
                    "and the config has no head_dim"
                )
            head_dim = hidden // n_h
        mtp = src.get("num_nextn_predict_layers")
        label = name or src.get("_name_or_path") or src.get("model_type") or "model"
        return cls(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=n_h,
            num_key_value_heads=n_kv,
            head_dim=_positive_int(head_dim, "head_dim"),
            intermediate_size=intermediate,
            vocab_size=_positive_int(src["vocab_size"], "vocab_size"),
            tie_word_embeddings=bool(src.get("tie_word_embeddings", False)),
            name=str(label),
            moe=_parse_moe(src, layers, intermediate),
            mla=_parse_mla(src),
            layer_windows=_parse_windows(src, layers),
            quantization=_parse_quantization(src.get("quantization_config")),
            mtp_layers=0 if mtp is None else _nonneg_int(mtp, "num_nextn_predict_layers"),
        )

    # -- layer kinds ---------------------------------------------------------------------

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a MoE block (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.num_moe_layers

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense gated MLP of width ``intermediate_size``."""
        return self.num_hidden_layers - self.num_moe_layers

    @property
    def num_sliding_layers(self) -> int:
        """Layers with a sliding attention window."""
        return sum(w is not None for w in self.layer_windows)

    # -- parameters (docs/prefill-decode.md section 2) --------------------------------------------

    @property
    def params_attention_per_layer(self) -> int:
        """Attention weights of one layer.

        GQA (docs/prefill-decode.md section 2): q and o 2*H*(n_h*d) plus k and v 2*H*(n_kv*d). MLA
        (DeepSeek-V2 paper section 2.1; modeling_deepseek.py): q_a H*q_lora + q_b
        q_lora*n_h*(nope+rope) (or q H*n_h*(nope+rope) without q_lora_rank), kv_a
        H*(kv_lora+rope), kv_b kv_lora*n_h*(nope+v), o n_h*v*H.
        """
        h = self.hidden_size
        if self.mla is not None:
            m, n_h = self.mla, self.num_attention_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * m.q_lora_rank + m.q_lora_rank * n_h * qk if m.q_lora_rank else h * n_h * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * n_h * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + n_h * m.v_head_dim * h
        d = self.head_dim
        return 2 * h * (self.num_attention_heads * d) + 2 * h * (self.num_key_value_heads * d)

    @property
    def params_mlp_per_layer(self) -> int:
        """Gated MLP (gate, up, down) of a dense layer: 3*H*F. docs/prefill-decode.md section 2."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Attention plus dense-MLP parameters of one dense layer (norms ignored)."""
        return self.params_attention_per_layer + self.params_mlp_per_layer

    @property
    def params_expert(self) -> int:
        """One routed expert (gate, up, down): 3*H*F_e; 0 for a dense model."""
        return 0 if self.moe is None else 3 * self.hidden_size * self.moe.expert_intermediate_size

    @property
    def params_router(self) -> int:
        """Router of one MoE layer: H*E; 0 for a dense model."""
        return 0 if self.moe is None else self.hidden_size * self.moe.num_experts

    @property
    def params_shared_expert(self) -> int:
        """Shared-expert MLP of one MoE layer: 3*H*F_shared; 0 if none."""
        return 0 if self.moe is None else 3 * self.hidden_size * self.moe.shared_intermediate_size

    @property
    def params_moe_block(self) -> int:
        """MLP block of one MoE layer: router + shared expert + E routed experts."""
        if self.moe is None:
            return 0
        return self.params_router + self.params_shared_expert + self.moe.num_experts * self.params_expert

    @property
    def params_experts(self) -> int:
        """All routed-expert weights: MoE layers * E * 3*H*F_e."""
        return 0 if self.moe is None else self.num_moe_layers * self.moe.num_experts * self.params_expert

    @property
    def params_body(self) -> int:
        """Every decoder-layer weight: L * attention + dense layers * 3HF + MoE layers * MoE block."""
        return (
            self.num_hidden_layers * self.params_attention_per_layer
            + self.num_dense_layers * self.params_mlp_per_layer
            + self.num_moe_layers * self.params_moe_block
        )

    @property
    def params_body_active(self) -> int:
        """Decoder-layer weights one token uses: attention, dense MLPs, and per MoE layer the
        router, shared expert and top-k experts (= :attr:`params_body` for a dense model)."""
        if self.moe is None:
            return self.params_body
        active_block = self.params_router + self.params_shared_expert + self.moe.num_experts_per_tok * self.params_expert
        return (
            self.num_hidden_layers * self.params_attention_per_layer
            + self.num_dense_layers * self.params_mlp_per_layer
            + self.num_moe_layers * active_block
        )

    @property
    def params_embedding(self) -> int:
        """Embedding V*H, plus an LM head V*H unless tied. docs/prefill-decode.md section 2."""
        vh = self.vocab_size * self.hidden_size
        return vh if self.tie_word_embeddings else 2 * vh

    @property
    def params_lm_head(self) -> int:
        """Parameters used by the LM-head matmul (V*H, shared with the embedding if tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def params_total(self) -> int:
        """params_body + params_embedding: every stored weight (MTP layers excluded)."""
        return self.params_body + self.params_embedding

    @property
    def params_active_per_token(self) -> int:
        """Weights one token uses: attention, router, shared experts, top-k experts, dense
        MLPs and the LM head; not the embedding table (a lookup, not a matmul)."""
        return self.params_body_active + self.params_lm_head

    @property
    def params_mtp(self) -> int:
        """DeepSeek multi-token-prediction layers (``num_nextn_predict_layers``), not in
        :attr:`params_total`: each is one more decoder layer (a MoE layer when the model
        has experts) plus an ``eh_proj`` 2H*H; it shares the embedding and LM head
        (DeepSeek-V3 technical report section 2.2). Serving engines run it only for MTP
        speculative decoding, which this accounting does not model."""
        if not self.mtp_layers:
            return 0
        block = self.params_moe_block if self.moe is not None else self.params_mlp_per_layer
        return self.mtp_layers * (self.params_attention_per_layer + block + 2 * self.hidden_size * self.hidden_size)

    @property
    def kv_elements_per_token(self) -> int:
        """KV-cache elements per token over all layers: 2 * L * n_kv * d, or for MLA
        L * (kv_lora_rank + qk_rope_head_dim). Sliding layers hold at most the window."""
        if self.mla is not None:
            return self.num_hidden_layers * self.mla.kv_elements_per_token_per_layer
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim




def shipped_model_configs() -> tuple[str, ...]:
    """Names of the model configs shipped as package data (``diagnose/data/models/``),
    usable as ``--model-config NAME``."""
    root = resources.files("diagnose.data").joinpath("models")
    try:
        names = sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    return tuple(names)


def read_model_config(path_or_name: str) -> tuple[dict[str, Any], str]:
    """The parsed ``config.json`` and a label, from a file path or a shipped config name.

    An existing file wins over a shipped name. The label is ``_name_or_path`` when set, else
    the folder of a ``config.json``, else the file stem.

    Raises:
        DiagnoseError: neither a readable file nor a shipped name, not JSON, not an object.
    """
    p = Path(path_or_name)
    if p.is_file():
        text = read_text_file(p, "model config")  # size bound, byte-order marks
        where = str(path_or_name)
        default_name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    else:
        key = str(path_or_name).strip().lower()
        key = key.removesuffix(".json")
        if key not in shipped_model_configs():
            if p.exists():
                raise DiagnoseError(f"cannot read model config {path_or_name}: not a file")
            raise DiagnoseError(
                f"model config not found: {path_or_name} (not a file, and not a shipped config: "
                f"{', '.join(shipped_model_configs())})"
            )
        text = resources.files("diagnose.data").joinpath("models", f"{key}.json").read_text(encoding="utf-8")
        where = f"shipped config {key}"
        default_name = key
    try:
        with parsing(f"model config {where}"):
            cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiagnoseError(f"model config {where} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(cfg, dict):
        raise DiagnoseError(f"model config {where} must be a JSON object")
    check_model_sizes(cfg, f"model config {where}")  # here too, to name the file
    name = cfg.get("_name_or_path") or default_name
    return cfg, str(name)


def load_model_config(path_or_name: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (a file path, or the name of a shipped config such
    as ``gpt-oss-20b``; see :func:`shipped_model_configs`) and build a :class:`ModelSpec`.

    Raises:
        UnsupportedModelConfig: a key that changes bytes or FLOPs is not modelled.
        DiagnoseError: missing/unreadable file and no such shipped name, not JSON, or
            missing keys.
    """
    cfg, name = read_model_config(path_or_name)
    return ModelSpec.from_hf_config(cfg, name=name)
