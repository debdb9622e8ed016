"""JSON report: ``Analysis.to_dict()`` serialised with msgspec (numpy scalars converted)."""
from __future__ import annotations

from typing import Any

import msgspec
import numpy as np


def _default(obj: Any) -> Any:
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return None if np.isnan(obj) else float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


_enc = msgspec.json.Encoder(enc_hook=_default)


def to_json(report: dict, indent: int = 2) -> str:
    """Encode a report dict as (pretty) JSON text."""
    raw = _enc.encode(report)
    return msgspec.json.format(raw, indent=indent).decode() if indent else raw.decode()
