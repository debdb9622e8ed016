"""The web server's Host check: one ``before_request`` hook in front of every route (the page,
its layout, every Dash callback, assets), against DNS rebinding.

A page on ``attacker.example`` whose name is re-pointed at 127.0.0.1 can make the victim's
browser send requests to ``diagnose serve`` on the loopback address: same origin for the
browser, so it could read the kernel table and file paths. Those requests carry
``Host: attacker.example``; a request whose Host is not a name this server was meant to be
reached by is refused with 421 (Misdirected Request) before any callback runs.

Allowed: ``localhost``, ``127.0.0.1`` and ``[::1]`` with the served port (or no port), the
bound address itself when it is a specific one, and the names given with ``--allowed-host``
(required when binding every interface, ``--host 0.0.0.0`` / ``::``).
"""
from __future__ import annotations

from typing import Any, Iterable

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: Bind addresses meaning "every interface": the clients' Host names cannot be known.
ANY_ADDRESS = ("0.0.0.0", "::", "[::]", "")
CONFIG_NAMES = "DIAGNOSE_ALLOWED_HOSTS"
CONFIG_PORT = "DIAGNOSE_PORT"


def host_name(name: str) -> str:
    """A host name or address as the Host header carries it: lower case, no trailing dot,
    IPv6 literals in brackets."""
    n = name.strip().lower().rstrip(".")
    if ":" in n and not n.startswith("["):
        n = f"[{n}]"
    return n


def split_host(header: str) -> tuple[str, str | None]:
    """``"localhost:8050"`` -> ("localhost", "8050"); ``"[::1]:8050"`` -> ("[::1]", "8050")."""
    h = header.strip()
    if h.startswith("["):
        end = h.find("]")
        name, rest = h[:end + 1], h[end + 1:]
        return host_name(name), (rest[1:] if rest.startswith(":") else None)
    name, sep, port = h.rpartition(":")
    return (host_name(name), port) if sep else (host_name(h), None)


def allowed_names(bind_host: str | None = None, extra: Iterable[str] = ()) -> set[str]:
    """The Host names accepted: loopback names, ``bind_host`` when it is a specific address,
    and ``extra`` (``--allowed-host``)."""
    names = set(LOOPBACK_NAMES)
    if bind_host is not None and bind_host.strip() not in ANY_ADDRESS:
        names.add(host_name(bind_host))
    names.update(host_name(x) for x in extra if x.strip())
    return names


def host_allowed(header: str | None, names: set[str], port: int | None) -> bool:
    """Whether a request's Host header names this server (``port`` None: any port)."""
    if not header:
        return False
    name, p = split_host(header)
    if name not in names:
        return False
    return p is None or port is None or p == str(port)


def install(flask_app: Any, names: set[str] | None = None, port: int | None = None) -> None:
    """Refuse, on every route of ``flask_app``, a request whose Host is not allowed (421,
    one line of text). The names and port live in the app's config (``serve`` sets the port
    once it is bound)."""
    from flask import request

    flask_app.config[CONFIG_NAMES] = set(names) if names is not None else allowed_names()
    flask_app.config[CONFIG_PORT] = port

    @flask_app.before_request
    def _check_host():  # noqa: ANN202 - Flask hook
        if host_allowed(request.headers.get("Host"), flask_app.config[CONFIG_NAMES], flask_app.config[CONFIG_PORT]):
            return None
        shown = (request.headers.get("Host") or "")[:100]
        return (f"diagnose serve: Host {shown!r} is not one this server answers to (DNS rebinding guard); "
                "start it with --allowed-host NAME to allow another name\n", 421, {"Content-Type": "text/plain; charset=utf-8"})
