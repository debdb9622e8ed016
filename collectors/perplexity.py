"""Perplexity of a text under a model with real weights (``diagnose collect bench
--perplexity-text``): the check that a quantized or otherwise changed model still predicts
the same text (S6). Torch and transformers are imported when called."""
from __future__ import annotations

import math
import os
from typing import Any

from diagnose.errors import DiagnoseError

PERPLEXITY_WINDOW = 1024


def perplexity_token_ids(model_path: str, text_path: str) -> Any:
    """Token ids (1-D LongTensor) of a text file, from the tokenizer stored with the model.

    Raises:
        DiagnoseError: unreadable text, tokenizer not loadable, or fewer than 2 tokens.
    """
    from transformers import AutoTokenizer

    try:
        with open(text_path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnoseError(f"cannot read --perplexity-text {text_path!r}: {_one_line_of(exc)}") from None
    local = os.path.exists(model_path)
    try:
        tok = AutoTokenizer.from_pretrained(model_path, local_files_only=local)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DiagnoseError(f"cannot load the tokenizer of {model_path!r}: {_one_line_of(exc)}") from None
    ids = tok(text, return_tensors="pt", verbose=False)["input_ids"][0]
    if ids.numel() < 2:
        raise DiagnoseError(f"--perplexity-text {text_path!r} has fewer than 2 tokens")
    return ids


def perplexity_from_ids(model: Any, ids: Any, device: str, window: int | None = None) -> dict:
    """Perplexity of ``model`` over token ids ``ids`` (1-D).

    The ids are cut into consecutive windows of ``window`` predicted tokens (default
    :data:`PERPLEXITY_WINDOW`, capped at ``max_position_embeddings - 1``); each forward
    sees ``window + 1`` tokens, so every token after the first is predicted exactly once,
    from at most ``window`` tokens of left context. Perplexity = exp(total negative
    log-likelihood / predicted tokens), log-softmax in fp32.

    Returns:
        ``{"value", "nll_mean", "tokens" (predicted), "window", "text": None, "reason": None}``.
    """
    import torch

    if window is None:
        window = PERPLEXITY_WINDOW
        max_pos = getattr(model.config, "max_position_embeddings", None)
        if isinstance(max_pos, int) and max_pos > 1:
            window = min(window, max_pos - 1)
    nll_sum = 0.0
    count = 0
    n = int(ids.numel())
    with torch.inference_mode():
        for start in range(0, n - 1, window):
            chunk = ids[start : start + window + 1].unsqueeze(0).to(device)
            logits = model(input_ids=chunk, use_cache=False).logits[0, :-1].float()
            targets = chunk[0, 1:]
            nll = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
            nll_sum += float(nll)
            count += int(targets.numel())
    mean = nll_sum / count
    return {"value": math.exp(mean), "nll_mean": mean, "tokens": count, "window": window, "text": None, "reason": None}


def perplexity_of_text(model: Any, model_path: str, text_path: str, device: str, window: int | None = None) -> dict:
    """Perplexity of ``model`` over a text file, tokenized with the model's own tokenizer
    (:func:`perplexity_token_ids` then :func:`perplexity_from_ids`); ``text`` is set to
    ``text_path``.

    Raises:
        DiagnoseError: unreadable text, tokenizer not loadable, or fewer than 2 tokens.
    """
    out = perplexity_from_ids(model, perplexity_token_ids(model_path, text_path), device, window)
    out["text"] = text_path
    return out


def _one_line_of(exc: BaseException) -> str:
    from diagnose.collectors.torch_collector import _one_line

    return _one_line(exc)


# -- output -------------------------------------------------------------------------
