"""YAML reading for the packaged tables and rules: libyaml's C loader when PyYAML has it
(~10x faster than the pure-Python one), the same safe semantics either way."""
from __future__ import annotations

from typing import Any

import yaml

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader

YAMLError = yaml.YAMLError


def load_yaml(text: str | bytes) -> Any:
    """``yaml.safe_load`` with the C loader when available (for the packaged tables and rules).

    Raises:
        yaml.YAMLError: malformed YAML.
    """
    return yaml.load(text, Loader=_Loader)


#: Largest YAML file a user may give (rules, rules config).
MAX_USER_YAML_BYTES = 1 << 20
#: Deepest nesting of lists/mappings accepted in a YAML file a user gives (a rule file nests 4).
MAX_YAML_DEPTH = 64


class _NoAliasLoader(yaml.SafeLoader):
    """A safe loader that refuses anchors and aliases: a few KB of nested aliases ("billion
    laughs") expand to gigabytes. Files users give (rules, rules configs) never need them.
    It also refuses nesting deeper than :data:`MAX_YAML_DEPTH` (PyYAML composes nodes
    recursively: 50,000 levels in 100 KB exhaust Python's recursion limit)."""

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


def load_user_yaml(text: str | bytes, max_bytes: int = MAX_USER_YAML_BYTES) -> Any:
    """Parse a YAML file a user gave (rules, rules config): at most ``max_bytes`` (1 MiB),
    nested at most :data:`MAX_YAML_DEPTH` levels, no anchors or aliases, safe types only.

    Raises:
        yaml.YAMLError: malformed YAML, an anchor or alias, nesting too deep, or a file over
            ``max_bytes``.
    """
    if len(text) > max_bytes:
        raise yaml.YAMLError(f"file larger than {max_bytes:,} bytes")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)
    except RecursionError:  # a parser stage that recurses before the composer's depth check
        raise yaml.YAMLError(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    except ValueError as e:  # Python refuses integers of over 4,300 digits
        if "digits" not in str(e):
            raise
        raise yaml.YAMLError("holds a number thousands of digits long") from None
