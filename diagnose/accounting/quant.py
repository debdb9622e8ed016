"""Weight quantization from ``quantization_config``: :class:`QuantSpec` and its parser (fp8,
fbgemm_fp8, FP8 compressed-tensors, mxfp4, AWQ, GPTQ, bitsandbytes; ``modules_to_not_convert``)."""
from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.accounting.units import UnsupportedModelConfig


class QuantSpec(msgspec.Struct, frozen=True):
    """Weight quantization read from ``quantization_config``.

    Attributes:
        method: the config's ``quant_method``.
        bits: storage bits per quantized weight, flat per-block scales included
            (mxfp4 17/4 = 4.25; bitsandbytes nf4 9/2 = 4.5; fp8 8), as an exact fraction.
        group_size: AWQ/GPTQ group along the input dimension (``-1``: one group per output
            channel), or None.
        group_bits: bits per AWQ/GPTQ group (fp16 scale + packed zero: 16 + ``bits``).
        experts_only: only routed-expert weights are quantized (mxfp4).
        lm_head: the LM head is quantized too (GPTQ ``lm_head: true``).
        skip: module-name patterns left unquantized (``modules_to_not_convert``,
            ``llm_int8_skip_modules``, compressed-tensors ``ignore``).
        kv_dtype: KV-cache dtype the config sets (compressed-tensors ``kv_cache_scheme``),
            or None.
        label: short description for reports, e.g. "mxfp4 (4.25 bit)".
    """

    method: str
    bits: Fraction
    group_size: int | None = None
    group_bits: int = 0
    experts_only: bool = False
    lm_head: bool = False
    skip: tuple[str, ...] = ()
    kv_dtype: str | None = None
    label: str = ""


def _skip_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise DiagnoseError(f"model config key {key!r} must be a list of module names, got {value!r}")
    return tuple(value)


def _parse_quantization(q: Any) -> QuantSpec | None:
    """QuantSpec from a ``quantization_config`` dict (None when absent).

    Raises:
        UnsupportedModelConfig: unknown ``quant_method`` or an unmodelled variant.
        DiagnoseError: malformed values.
    """
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise DiagnoseError("model config key 'quantization_config' must be a JSON object")
    method = q.get("quant_method")
    if not isinstance(method, str):
        raise DiagnoseError("model config key 'quantization_config.quant_method' is missing")
    m = method.lower()
    skip = _skip_list(q.get("modules_to_not_convert"), "quantization_config.modules_to_not_convert")
    if m in ("fp8", "fbgemm_fp8"):
        # 1 byte per weight; fp32 block (128x128) or per-channel scales are < 0.1 % and not counted.
        skip += _skip_list(q.get("ignored_layers"), "quantization_config.ignored_layers")
        return QuantSpec(m, Fraction(8), skip=skip, label=f"{m} (8 bit)")
    if m == "mxfp4":
        # OCP MX spec: 32 FP4 (E2M1) values share one 8-bit E8M0 scale: 4 + 8/32 = 4.25 bit.
        return QuantSpec(m, Fraction(17, 4), experts_only=True, skip=skip, label="mxfp4 (4.25 bit)")
    if m in ("awq", "gptq"):
        bits = q.get("bits")
        group = q.get("group_size")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
            raise DiagnoseError(f"model config key 'quantization_config.bits' must be an integer 1..8, got {bits!r}")
        if isinstance(group, bool) or not isinstance(group, int) or (group < 1 and group != -1):
            raise DiagnoseError(
                f"model config key 'quantization_config.group_size' must be a positive integer or -1, got {group!r}"
            )
        lm_head = bool(q.get("lm_head", False)) if m == "gptq" else False
        gtxt = "per output channel" if group == -1 else f"group {group}"
        return QuantSpec(m, Fraction(bits), group_size=group, group_bits=16 + bits, lm_head=lm_head, skip=skip,
                         label=f"{m} int{bits}, {gtxt} (+{16 + bits}-bit scale and zero per group)")
    if m == "bitsandbytes":
        four = bool(q.get("load_in_4bit") or q.get("_load_in_4bit"))
        eight = bool(q.get("load_in_8bit") or q.get("_load_in_8bit"))
        skip += _skip_list(q.get("llm_int8_skip_modules"), "quantization_config.llm_int8_skip_modules")
        if four:
            if q.get("bnb_4bit_use_double_quant"):
                # absmax quantized to 8 bit per 64 weights + one fp32 scale per 256 blocks.
                bits = Fraction(4) + Fraction(8, 64) + Fraction(32, 64 * 256)
                return QuantSpec(m, bits, skip=skip, label="bitsandbytes 4-bit, double quant (~4.13 bit)")
            return QuantSpec(m, Fraction(4) + Fraction(32, 64), skip=skip, label="bitsandbytes 4-bit (4.5 bit)")
        if eight:
            return QuantSpec(m, Fraction(8), skip=skip, label="bitsandbytes 8-bit (8 bit)")
        raise UnsupportedModelConfig("quantization_config", "bitsandbytes config without load_in_4bit or load_in_8bit")
    if m == "compressed-tensors":
        groups = q.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise UnsupportedModelConfig("quantization_config.config_groups", "compressed-tensors config without weight groups")
        for name, g in groups.items():
            w = g.get("weights") if isinstance(g, Mapping) else None
            if not isinstance(w, Mapping) or w.get("num_bits") != 8 or w.get("type") != "float":
                raise UnsupportedModelConfig(
                    f"quantization_config.config_groups.{name}",
                    "only FP8 compressed-tensors weights (num_bits 8, type float) are modelled",
                )
        skip += _skip_list(q.get("ignore"), "quantization_config.ignore")
        kv = q.get("kv_cache_scheme")
        kv_dtype = None
        if kv is not None:
            if isinstance(kv, Mapping) and kv.get("num_bits") == 8 and kv.get("type") in ("float", "int"):
                kv_dtype = "fp8" if kv.get("type") == "float" else "int8"
            else:
                raise UnsupportedModelConfig("quantization_config.kv_cache_scheme", "only 8-bit KV-cache schemes are modelled")
        return QuantSpec(m, Fraction(8), skip=skip, kv_dtype=kv_dtype, label="compressed-tensors fp8 (8 bit)")
    raise UnsupportedModelConfig(
        "quantization_config.quant_method",
        f"quant_method {method!r} is not modelled (modelled: fp8, fbgemm_fp8, compressed-tensors fp8, mxfp4, awq, gptq, bitsandbytes)",
    )


def _module_excluded(names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    """Whether a module named by any of ``names`` matches a ``modules_to_not_convert`` pattern.

    Matching follows transformers' ``should_convert_module`` (quantizers_utils): a pattern
    matches when ``pattern + "."`` occurs in the name, the name ends with it, or it matches
    the name's start as a regex; compressed-tensors ``re:`` patterns are regexes searched in
    the name.
    """
    from diagnose.patterns import outside_pattern

    for p in patterns:
        rx = outside_pattern(p[3:] if p.startswith("re:") else p)  # None: invalid, or nested repeats
        for name in names:
            if p.startswith("re:"):
                if rx is not None and rx.search(name):
                    return True
                continue
            if f"{p}." in name or name.endswith(p):
                return True
            if rx is not None and rx.match(name):
                return True
    return False
