"""Where outside input enters: one place for its encodings, sizes, nesting and numbers.

Every file a user gives besides the trace itself (model config, metrics JSON, rules and
rules-config YAML) is read with :func:`read_text_file`: a size bound, a byte-order mark
honoured (UTF-8, UTF-16 and UTF-32, as PowerShell and some editors write them), one
``error:`` line otherwise. Every parser runs under :func:`parsing`, which turns the
parser's recursion and memory errors (JSON or YAML nested tens of thousands of levels deep)
into one :class:`~diagnose.errors.DiagnoseError` naming the file. Every number that comes
from outside goes through :func:`finite_number` (CLI options, rule thresholds, rules
configs) or the model-config size bounds (:data:`MODEL_SIZE_BOUNDS`).

The README's table "Inputs and their bounds" lists each input, what is checked and what
the user sees.
"""
from __future__ import annotations

import codecs
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from diagnose.errors import DiagnoseError

#: Byte-order marks, longest first (UTF-32 LE starts with the UTF-16 LE mark).
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))

#: Side files (model config, metrics JSON) larger than this are refused: a Hugging Face
#: config.json is a few KB (DeepSeek-V3's 1.7 KB; with a quantization section under 20 KB).
MAX_SIDE_FILE_BYTES = 1 << 20


def bom_encoding(raw: bytes) -> tuple[str | None, int]:
    """(encoding named by the byte-order mark at the start of ``raw``, length of the mark);
    (None, 0) without one."""
    for bom, enc in _BOMS:
        if raw.startswith(bom):
            return enc, len(bom)
    return None, 0


def utf8_without_bom(raw: bytes, what: str) -> tuple[bytes, str | None]:
    """``raw`` as UTF-8 bytes: a UTF-8 byte-order mark dropped, UTF-16/UTF-32 text (with its
    mark) transcoded. Returns (bytes, the encoding that was converted or None).

    Raises:
        DiagnoseError: a UTF-16/32 mark followed by text that is not valid in that encoding.
    """
    enc, n = bom_encoding(raw)
    if enc is None:
        return raw, None
    if enc == "utf-8":
        return raw[n:], "UTF-8 with a byte-order mark"
    try:
        text = raw[n:].decode(enc)
    except UnicodeDecodeError as e:
        raise DiagnoseError(f"{what}: starts with a {enc.upper()} byte-order mark but is not valid {enc.upper()} "
                            f"text (byte {e.start + n:,}); save it as UTF-8") from None
    return text.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace").encode("utf-8"), enc.upper()


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_SIDE_FILE_BYTES) -> str:
    """A text file a user gave: at most ``max_bytes``, UTF-8 (a byte-order mark, UTF-8,
    UTF-16 or UTF-32, is honoured).

    Raises:
        DiagnoseError: missing, unreadable, larger than ``max_bytes``, or not text in its
            encoding (the message starts with ``what`` and the path).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise DiagnoseError(f"{what} {path}: {size:,} bytes, larger than the {max_bytes:,} bytes accepted")
        with open(p, "rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise DiagnoseError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise DiagnoseError(f"{what} {path}: is a directory") from None
    except OSError as e:
        raise DiagnoseError(f"cannot read {what} {path}: {e.strerror or type(e).__name__}") from None
    if len(raw) > max_bytes:
        raise DiagnoseError(f"{what} {path}: larger than the {max_bytes:,} bytes accepted")
    data, _ = utf8_without_bom(raw, f"{what} {path}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DiagnoseError(f"cannot read {what} {path}: not UTF-8 text (invalid byte at {e.start:,})") from None


@contextmanager
def parsing(what: str) -> Iterator[None]:
    """Run a parser, turning its recursion and memory errors into one line naming ``what``:
    JSON or YAML nested thousands of levels deep exhausts Python's recursion limit (json,
    PyYAML's composer, msgspec's guard), a document can ask for more memory than there is,
    and Python refuses to read integers of over 4,300 digits.

    Raises:
        DiagnoseError: the parser raised RecursionError, MemoryError, or ValueError for an
            integer too long (other errors, JSONDecodeError included, pass through).
    """
    try:
        yield
    except RecursionError:
        raise DiagnoseError(f"{what}: nested too deeply to parse (thousands of levels of lists/objects)") from None
    except MemoryError:
        raise DiagnoseError(f"{what}: too large to parse in the memory available") from None
    except ValueError as e:  # Python refuses integers of over 4,300 digits (CVE-2020-10735)
        if "digits" not in str(e) or type(e).__name__ == "JSONDecodeError":
            raise
        raise DiagnoseError(f"{what}: holds a number thousands of digits long") from None


def finite_number(value: Any, what: str, *, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False) -> float | int:
    """``value`` as a finite number within [lo, hi] (``lo_open``: strictly above lo).

    NaN passes every comparison as false, so it is refused first: a threshold of NaN would
    make a gate pass whatever it measured.

    Raises:
        DiagnoseError: not a number (bools are not numbers), NaN or infinite, or out of range
            (the message starts with ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DiagnoseError(f"{what}: must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise DiagnoseError(f"{what}: must be a finite number, got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise DiagnoseError(f"{what}: must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
    if hi is not None and value > hi:
        raise DiagnoseError(f"{what}: must be <= {hi:g}, got {value!r}")
    return value


#: Upper bounds on model-config sizes, far above any published model (the largest shipped:
#: DeepSeek-V3, 61 layers, hidden 7168, 256 experts, vocabulary 129,280, 163,840 positions;
#: Llama 3.1 405B: 126 layers, hidden 16,384), so that a config cannot ask the accounting for
#: billions of per-layer entries or exact integers of millions of digits.
MODEL_SIZE_BOUNDS: dict[str, int] = {
    "num_hidden_layers": 1_000,
    "hidden_size": 1_000_000,
    "intermediate_size": 10_000_000,
    "moe_intermediate_size": 10_000_000,
    "shared_expert_intermediate_size": 10_000_000,
    "num_attention_heads": 100_000,
    "num_key_value_heads": 100_000,
    "head_dim": 100_000,
    "num_local_experts": 10_000,
    "num_experts": 10_000,
    "n_routed_experts": 10_000,
    "n_shared_experts": 10_000,
    "num_experts_per_tok": 10_000,
    "vocab_size": 10_000_000,
    "max_position_embeddings": 100_000_000,
    "sliding_window": 100_000_000,
    "kv_lora_rank": 1_000_000,
    "q_lora_rank": 1_000_000,
    "qk_rope_head_dim": 100_000,
    "qk_nope_head_dim": 100_000,
    "v_head_dim": 100_000,
    "num_nextn_predict_layers": 1_000,
    "first_k_dense_replace": 1_000,
    "max_window_layers": 1_000,
    "decoder_sparse_step": 1_000,
}
#: Lists a config may hold per layer (``layer_types``, ``mlp_only_layers``...) are bounded by
#: the layer bound; other lists (``modules_to_not_convert``) by this many entries.
MAX_CONFIG_LIST = 10_000


def check_model_sizes(cfg: Mapping[str, Any], where: str) -> None:
    """Refuse a model config (``config.json`` or trace metadata) whose sizes exceed
    :data:`MODEL_SIZE_BOUNDS` (nested ``text_config`` included), or whose lists are longer
    than the layer bound / :data:`MAX_CONFIG_LIST`.

    Raises:
        DiagnoseError: one line naming the key, its value and the bound.
    """
    for scope in (cfg, cfg.get("text_config")):
        if not isinstance(scope, Mapping):
            continue
        for key, bound in MODEL_SIZE_BOUNDS.items():
            v = scope.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not (isinstance(v, int) or math.isfinite(v)) or v > bound:
                raise DiagnoseError(f"{where}: {key} = {v!r} is beyond the accepted bound {bound:,} (not a real model)")
        for key, v in scope.items():
            limit = MODEL_SIZE_BOUNDS["num_hidden_layers"] if key.endswith("layers") or key == "layer_types" else MAX_CONFIG_LIST
            if isinstance(v, list) and len(v) > limit:
                raise DiagnoseError(f"{where}: {key} lists {len(v):,} entries, beyond the accepted bound {limit:,}")
        q = scope.get("quantization_config")
        if isinstance(q, Mapping):
            for key, v in q.items():
                if isinstance(v, list) and len(v) > MAX_CONFIG_LIST:
                    raise DiagnoseError(f"{where}: quantization_config.{key} lists {len(v):,} entries, beyond the accepted bound {MAX_CONFIG_LIST:,}")
