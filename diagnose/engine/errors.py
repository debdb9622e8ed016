"""Errors of the rule engine."""
from __future__ import annotations

from diagnose.errors import DiagnoseError


class RuleError(DiagnoseError):
    """A rule file, fixture, override or rules config is invalid (message names the file)."""
