"""User-facing errors: the CLI prints ``str(err)`` on one line and exits with status 2."""


class DiagnoseError(Exception):
    """Unusable input or arguments. The message is one line, meant for the user."""


class TraceFormatError(DiagnoseError):
    """The file is not a trace this tool can read (wrong format, corrupt, empty)."""
