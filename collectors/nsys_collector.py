"""Record an Nsight Systems trace of any command and export it to SQLite for ``diagnose run``.

:func:`collect_nsys` runs two commands::

    nsys profile --trace=cuda,nvtx --cuda-graph-trace=node -o OUT --force-overwrite true CMD...
    nsys export --type sqlite --output OUT.sqlite OUT.nsys-rep

``--trace=cuda,nvtx`` records CUDA API calls, kernels and copies plus NVTX ranges (the
torch collector and ``diagnose collect bench`` emit NVTX ranges named like the phase
markers when on CUDA; SGLang/vLLM can emit their own); ``--cuda-graph-trace=node`` records
every kernel replayed from a CUDA graph instead of one row per graph launch, so launch-gap
and kernel-category numbers stay available for graph-captured decode. The SQLite file is
what :mod:`diagnose.trace.nsys` reads.

The profiled command's stdout and stderr pass through to the caller's (stderr is also
kept, to quote its last line when nsys fails); the export's output is captured.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from typing import Sequence

from diagnose.errors import DiagnoseError

NSYS_NOT_FOUND = "Nsight Systems `nsys` not found on PATH; install Nsight Systems or pass --nsys PATH"
"""Error message when no ``nsys`` executable can be found."""

PROFILE_OPTIONS = ("--trace=cuda,nvtx", "--cuda-graph-trace=node")
"""Options of ``nsys profile`` before ``-o``."""

REPORT_SUFFIX = ".nsys-rep"
SQLITE_SUFFIX = ".sqlite"


def find_nsys(nsys: str | None = None) -> str:
    """Path of the ``nsys`` executable.

    Args:
        nsys: An explicit path (or a command name looked up on PATH); None looks up
            ``nsys`` on PATH.

    Returns:
        The executable's path.

    Raises:
        DiagnoseError: not found, or ``nsys`` names something that is not executable.
    """
    if nsys is None:
        found = shutil.which("nsys")
        if found is None:
            raise DiagnoseError(NSYS_NOT_FOUND)
        return found
    if os.sep in nsys or (os.altsep and os.altsep in nsys):
        if os.path.isfile(nsys) and os.access(nsys, os.X_OK):
            return nsys
        raise DiagnoseError(f"--nsys {nsys!r} is not an executable file")
    found = shutil.which(nsys)
    if found is None:
        raise DiagnoseError(f"--nsys {nsys!r} not found on PATH")
    return found


def output_base(out: str) -> str:
    """The report path without extension: ``report.nsys-rep`` and ``report.sqlite`` -> ``report``."""
    for suffix in (REPORT_SUFFIX, SQLITE_SUFFIX):
        if out.endswith(suffix) and len(out) > len(suffix):
            return out[: -len(suffix)]
    return out


def profile_argv(nsys: str, out: str, cmd: Sequence[str]) -> list[str]:
    """argv of the ``nsys profile`` call for output base ``out``."""
    return [nsys, "profile", *PROFILE_OPTIONS, "-o", out, "--force-overwrite", "true", *cmd]


def export_argv(nsys: str, out: str) -> list[str]:
    """argv of the ``nsys export`` call turning ``out.nsys-rep`` into ``out.sqlite``."""
    return [nsys, "export", "--type", "sqlite", "--output", out + SQLITE_SUFFIX, out + REPORT_SUFFIX]


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output on stderr)"


def _run_tee_stderr(argv: list[str]) -> tuple[int, str]:
    """Run argv with stdout inherited and stderr copied to ours; return (rc, stderr text)."""
    kept: list[str] = []
    with subprocess.Popen(argv, stdout=None, stderr=subprocess.PIPE, text=True, errors="replace") as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            kept.append(line)
            if len(kept) > 200:
                del kept[:100]
        sys.stderr.flush()
        rc = proc.wait()
    return rc, "".join(kept)


def collect_nsys(cmd: list[str], out: str, nsys: str | None = None) -> dict:
    """Profile ``cmd`` under Nsight Systems and export the report to SQLite.

    Args:
        cmd: The command to profile and its arguments (e.g. ``["python", "serve.py"]``).
        out: Output base path; ``out.nsys-rep`` and ``out.sqlite`` are written (a trailing
            ``.nsys-rep`` or ``.sqlite`` is dropped first). Parent directories are
            created; an existing report is overwritten, and a stale ``out.sqlite`` is
            removed before the export (``nsys export`` refuses to overwrite).
        nsys: Path of the ``nsys`` executable; None looks it up on PATH.

    Returns:
        ``nsys`` (executable used), ``report`` (``out.nsys-rep``), ``sqlite``
        (``out.sqlite``), ``profile_argv``, ``export_argv`` and ``next`` (the
        ``diagnose run --trace ...`` command to run next).

    Raises:
        DiagnoseError: empty ``cmd``, no ``nsys``, or either nsys call exits non-zero
            (the message quotes its last stderr line) or writes no output file.
    """
    cmd = list(cmd)
    if not cmd:
        raise DiagnoseError("no command to profile: put it after --, e.g. diagnose collect nsys --out report -- python app.py")
    exe = find_nsys(nsys)
    base = output_base(out)
    parent = os.path.dirname(os.path.abspath(base))
    os.makedirs(parent, exist_ok=True)
    report = base + REPORT_SUFFIX
    sqlite = base + SQLITE_SUFFIX

    p_argv = profile_argv(exe, base, cmd)
    try:
        rc, err = _run_tee_stderr(p_argv)
    except OSError as exc:
        raise DiagnoseError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if rc != 0:
        hint = f" ({report} was written)" if os.path.exists(report) else ""
        raise DiagnoseError(f"nsys profile failed (exit {rc}): {_last_line(err)}{hint}")
    if not os.path.exists(report):
        raise DiagnoseError(f"nsys profile exited 0 but wrote no {report}")

    if os.path.exists(sqlite):
        os.unlink(sqlite)
    e_argv = export_argv(exe, base)
    try:
        proc = subprocess.run(e_argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        raise DiagnoseError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise DiagnoseError(f"nsys export failed (exit {proc.returncode}): {_last_line(proc.stderr or proc.stdout)}")
    if not os.path.exists(sqlite):
        raise DiagnoseError(f"nsys export exited 0 but wrote no {sqlite}")
    return {
        "nsys": exe,
        "report": report,
        "sqlite": sqlite,
        "profile_argv": p_argv,
        "export_argv": e_argv,
        "next": f"diagnose run --trace {shlex.quote(sqlite)}",
    }
