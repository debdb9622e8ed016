"""The base of the report model (:mod:`diagnose.model`): value types (:data:`Share`,
:data:`NonNegative`, :data:`Number`, :data:`Dtype`), the frozen :class:`Record` every report
record derives from, and the JSON hook for numpy scalars."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

from diagnose import vocab

Share = Annotated[float, Meta(ge=0, le=1, description="fraction in [0, 1]")]
NonNegative = Annotated[float, Meta(ge=0)]
Number = Union[int, float]
Dtype = Literal[vocab.DTYPES]  # type: ignore[valid-type]


class Record(Struct, frozen=True, kw_only=True):
    """Base of every report record: frozen, keyword-only, encoded in field order."""

    def to_dict(self) -> dict[str, Any]:
        """This record as JSON-able builtins (what the JSON report holds)."""
        return msgspec.to_builtins(self, enc_hook=_enc_hook)


def _enc_hook(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return None if np.isnan(obj) else float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
