"""Text from a trace shown on a terminal: control characters escaped.

Kernel, marker and call names come from the trace file; a name holding ANSI/OSC escape
sequences (clear screen, set the window title, hyperlinks) must reach the terminal as
visible text, never as commands. JSON output escapes them itself; HTML and the web report
escape markup.
"""
from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x80-0x9f, CSI = 0x9b among them).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """``text`` with every control character (ESC, BEL, CSI...) shown as ``\\xNN``."""
    s = str(text)
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s) if _CONTROL.search(s) else s
