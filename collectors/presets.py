"""Model config presets for the collectors, as Hugging Face ``config.json``-style dicts.

Each preset is a plain dict with the Hugging Face ``LlamaConfig`` field names
(``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ...) plus
``model_type``, so it can be turned into a config with
``transformers.AutoConfig.for_model(**preset)`` and into a randomly initialised
model with ``AutoModelForCausalLM.from_config``. No weights are ever downloaded.

Presets:
    tiny: 2 layers, hidden 64, 4 heads (2 KV heads, head_dim 16), intermediate 128,
        vocab 256. Runs a prefill plus a few decode steps in well under a second on
        one CPU core; used by the tests and the shipped sample trace.
    ref7b: the "7B-like" reference config of docs/prefill-decode.md section 2 (L=32,
        H=4096, n_h=32, n_kv=8, d=128, F=11008, V=128000, untied embeddings):
        6,719,275,008 parameters, 13.44 GB of bf16/fp16 weights. Meant for a GPU.
"""

from __future__ import annotations

import copy

from diagnose.errors import DiagnoseError

PRESETS: dict[str, dict] = {
    "tiny": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 256,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
    },
    # Source: docs/prefill-decode.md section 2, "Reference config 7B-like".
    "ref7b": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 11008,
        "vocab_size": 128000,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
    },
}


def preset_names() -> list[str]:
    """Return the preset names, sorted.

    Returns:
        The keys of :data:`PRESETS`, e.g. ``["ref7b", "tiny"]``.
    """
    return sorted(PRESETS)


def get_preset(name: str) -> dict:
    """Return a copy of one preset config dict.

    Args:
        name: A key of :data:`PRESETS` (``"tiny"`` or ``"ref7b"``).

    Returns:
        A deep copy of the preset, safe to modify.

    Raises:
        DiagnoseError: ``name`` is not a known preset.
    """
    try:
        return copy.deepcopy(PRESETS[name])
    except KeyError:
        raise DiagnoseError(
            f"unknown model config {name!r}; choose one of: {', '.join(preset_names())}"
        ) from None
