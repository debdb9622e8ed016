"""YAML reading for the packaged tables and rules: libyaml's C loader when PyYAML has it
(~10x faster than the pure-Python one), the same safe semantics either way; what a packaged
file parses to is cached on disk (:func:`load_yaml`)."""
from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _c_loader():
    """libyaml's safe loader when PyYAML has it (imported here: a run whose packaged files all
    come from the cache never imports PyYAML)."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def is_yaml_error(e: BaseException) -> bool:
    """Whether ``e`` is PyYAML's error (malformed YAML); False when PyYAML was never imported."""
    yaml = sys.modules.get("yaml")
    return yaml is not None and isinstance(e, yaml.YAMLError)


def load_yaml(text: str | bytes) -> Any:
    """``yaml.safe_load`` with the C loader when available (for the packaged tables and rules),
    through a cache of parsed documents keyed by their content (:func:`cache_dir`).

    Even with libyaml, PyYAML builds the objects in Python: the 45 packaged files take about
    50 ms to parse on a 2-core machine, a tenth of ``diagnose run`` on a small trace, and
    about 2 ms to read back as msgpack (msgspec). A document is cached only when its msgpack
    form reads back equal to it (plain mappings, lists, text, numbers, booleans, null); a
    cache entry that does not decode is parsed again. Nothing is cached when the directory
    cannot be written.

    Raises:
        yaml.YAMLError: malformed YAML.
    """
    where = cache_dir()
    if where is None:
        return _parse(text)
    import hashlib

    import msgspec

    data = text.encode() if isinstance(text, str) else text
    path = os.path.join(where, hashlib.blake2b(data, digest_size=16, person=_CACHE_SALT).hexdigest() + ".msgpack")
    try:
        with open(path, "rb") as f:
            return msgspec.msgpack.decode(f.read())
    except (OSError, msgspec.DecodeError):
        pass
    obj = _parse(text)
    try:
        packed = msgspec.msgpack.encode(obj)
        if msgspec.msgpack.decode(packed) == obj:
            os.makedirs(where, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(packed)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the whole entry or none
    except (OSError, TypeError, ValueError, OverflowError, msgspec.EncodeError, msgspec.DecodeError):
        pass
    return obj


def _parse(text: str | bytes) -> Any:
    import yaml

    return yaml.load(text, Loader=_c_loader())


# the cache key's salt: the entries' format (a change of what a packaged file must parse to
# changes this)
_CACHE_SALT = b"diagnose-yaml-1"


def cache_dir() -> str | None:
    """Where parsed packaged YAML is cached: ``$DIAGNOSE_CACHE_DIR`` (empty: no cache), else
    ``$XDG_CACHE_HOME/diagnose-llm/yaml`` or ``~/.cache/diagnose-llm/yaml``; None without a
    home directory. Entries are named by a hash of the file's text: an edited file is a new
    entry, and the directory can be deleted at any time."""
    env = os.environ.get("DIAGNOSE_CACHE_DIR")
    if env is not None:
        return os.path.join(env, "yaml") if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None
    return os.path.join(base, "diagnose-llm", "yaml")


#: Largest YAML file a user may give (rules, rules config).
MAX_USER_YAML_BYTES = 1 << 20
#: Deepest nesting of lists/mappings accepted in a YAML file a user gives (a rule file nests 4).
MAX_YAML_DEPTH = 64


@lru_cache(maxsize=1)
def _no_alias_loader():
    """A safe loader that refuses anchors and aliases: a few KB of nested aliases ("billion
    laughs") expand to gigabytes. Files users give (rules, rules configs) never need them.
    It also refuses nesting deeper than :data:`MAX_YAML_DEPTH` (PyYAML composes nodes
    recursively: 50,000 levels in 100 KB exhaust Python's recursion limit)."""
    import yaml

    class _NoAliasLoader(yaml.SafeLoader):
        _depth = 0

        def compose_node(self, parent, index):  # noqa: D401 - PyYAML hook
            if self.check_event(yaml.events.AliasEvent) or getattr(self.peek_event(), "anchor", None):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "anchors and aliases (&name / *name) are not allowed",
                                                  event.start_mark)
            if self._depth >= MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  self.peek_event().start_mark)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return _NoAliasLoader


def load_user_yaml(text: str | bytes, max_bytes: int = MAX_USER_YAML_BYTES) -> Any:
    """Parse a YAML file a user gave (rules, rules config): at most ``max_bytes`` (1 MiB),
    nested at most :data:`MAX_YAML_DEPTH` levels, no anchors or aliases, safe types only.

    Raises:
        yaml.YAMLError: malformed YAML, an anchor or alias, nesting too deep, or a file over
            ``max_bytes`` (:func:`is_yaml_error`).
    """
    import yaml

    if len(text) > max_bytes:
        raise yaml.YAMLError(f"file larger than {max_bytes:,} bytes")
    try:
        return yaml.load(text, Loader=_no_alias_loader())
    except RecursionError:  # a parser stage that recurses before the composer's depth check
        raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    except ValueError as e:  # Python refuses integers of over 4,300 digits
        if "digits" not in str(e):
            raise
        raise yaml.YAMLError("holds a number thousands of digits long") from None
