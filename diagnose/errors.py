"""User-facing errors: the CLI prints ``str(err)`` on one line and exits with status 2."""

#: The distribution name (``diagnose`` on the package index is an unrelated project); the
#: import package and the command stay ``diagnose``. It is not published on the package index:
#: install hints name the checkout, never ``diagnose-llm[...]``.
DIST_NAME = "diagnose-llm"


def install_hint(extra: str) -> str:
    """How to install an optional extra: from the project's checkout (the distribution is not
    on the package index)."""
    return f"pip install '.[{extra}]' in the project's checkout"


class DiagnoseError(Exception):
    """Unusable input or arguments. The message is one line, meant for the user."""


class TraceFormatError(DiagnoseError):
    """The file is not a trace this tool can read (wrong format, corrupt, empty)."""
