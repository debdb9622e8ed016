"""User-facing errors: the CLI prints ``str(err)`` on one line and exits with status 2."""

#: The distribution name on the package index (``diagnose`` there is an unrelated project);
#: the import package and the command stay ``diagnose``.
DIST_NAME = "diagnose-llm"


def install_hint(extra: str) -> str:
    """How to install an optional extra: by distribution name, or from a checkout."""
    return f"pip install '{DIST_NAME}[{extra}]' (from a source checkout: pip install '.[{extra}]')"


class DiagnoseError(Exception):
    """Unusable input or arguments. The message is one line, meant for the user."""


class TraceFormatError(DiagnoseError):
    """The file is not a trace this tool can read (wrong format, corrupt, empty)."""
