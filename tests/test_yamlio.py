"""The cache of parsed packaged YAML (``diagnose.yamlio.load_yaml``): what a cached document
reads back as is what PyYAML parses, for every packaged file; odd cache states fall back to
parsing."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from diagnose import yamlio

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = sorted([*ROOT.glob("rules/*.yaml"), *ROOT.glob("diagnose/data/*.yaml")])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(tmp_path))
    return tmp_path / "yaml"


def test_every_packaged_file_reads_back_from_the_cache_as_parsed(cache):
    assert len(PACKAGED) == 45
    for p in PACKAGED:
        text = p.read_text()
        want = yaml.load(text, Loader=yaml.CSafeLoader)
        assert yamlio.load_yaml(text) == want, p.name  # parsed, then cached
        assert yamlio.load_yaml(text) == want, p.name  # read back
    assert len(list(cache.glob("*.msgpack"))) == 45  # one entry per distinct text, none left as .tmp
    assert list(cache.glob("*.tmp")) == []


def test_the_cache_is_keyed_by_content_and_survives_a_bad_entry(cache):
    a = yamlio.load_yaml("x: 1\nname: gemm\n")
    b = yamlio.load_yaml("x: 2\nname: gemm\n")
    assert (a, b) == ({"x": 1, "name": "gemm"}, {"x": 2, "name": "gemm"})
    entries = sorted(cache.glob("*.msgpack"))
    assert len(entries) == 2
    for e in entries:
        e.write_bytes(b"\xc1 not msgpack")  # a damaged entry: parsed again and rewritten
    assert yamlio.load_yaml("x: 1\nname: gemm\n") == {"x": 1, "name": "gemm"}
    assert sum(e.read_bytes().startswith(b"\xc1") for e in cache.glob("*.msgpack")) == 1


def test_documents_msgpack_cannot_hold_are_parsed_every_time(cache):
    text = "when: 2024-01-02\nbig: 123456789012345678901234567890\n"
    first = yamlio.load_yaml(text)
    assert yamlio.load_yaml(text) == first and str(first["when"]) == "2024-01-02"
    assert list(cache.glob("*.msgpack")) == []  # a date and a 100-bit int: not cached


def test_no_cache_where_it_is_turned_off_or_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", "")
    assert yamlio.cache_dir() is None and yamlio.load_yaml("a: [1, 2]") == {"a": [1, 2]}
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("DIAGNOSE_CACHE_DIR", str(blocked))
    assert yamlio.load_yaml("a: [1, 2]") == {"a": [1, 2]}  # the write fails quietly
    monkeypatch.delenv("DIAGNOSE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert yamlio.cache_dir() == str(tmp_path / "xdg" / "diagnose-llm" / "yaml")
