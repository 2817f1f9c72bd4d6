"""The flag mechanism: a dataclass's fields become a command line and are read back."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from autotune.errors import UsageError
from autotune.flags import add_flags, from_args, group, option, parse_bytes, parse_duration


def test_parse_bytes() -> None:
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("1.5G") == int(1.5 * 2**30)
    with pytest.raises(UsageError, match="memory size"):
        parse_bytes("lots")


def test_parse_duration() -> None:
    assert parse_duration("90") == 90 and parse_duration("1h30m") == 5400
    with pytest.raises(UsageError, match="duration"):
        parse_duration("soon")


@dataclass(kw_only=True)
class _Inner:
    rate: float = option("--rate", "a rate", default=1.5, kind=float)


@dataclass(kw_only=True)
class _Outer:
    name: str = option("name", "a positional", required=True)
    out: str | None = option(("-o", "--out"), "two spellings", metavar="FILE")
    size: int = option("--size", "a size", default=4, kind=int)
    tags: list[str] = option("--tag", "repeatable", repeat=True, default=[])
    limit: int | None = option("--limit", "parsed once read", parse=parse_bytes)
    fast: bool = option("--fast", "a switch", default=False, switch=True)
    inner: _Inner = group(_Inner)
    internal: int = 7


def test_fields_become_flags_and_are_read_back_through_their_parsers() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, _Outer)
    assert "--internal" not in parser.format_help()
    read = from_args(parser.parse_args(
        ["x", "-o", "f", "--tag", "a", "--tag", "b", "--limit", "1KiB", "--fast", "--rate",
         "2"]), _Outer)
    assert read == _Outer(name="x", out="f", tags=["a", "b"], limit=1024, fast=True,
                          inner=_Inner(rate=2.0))
    assert from_args(parser.parse_args(["y"]), _Outer) == _Outer(name="y")


def test_every_unreadable_value_is_named_at_once() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, _Outer)
    with pytest.raises(UsageError) as caught:
        from_args(parser.parse_args(["x", "--limit", "lots"]), _Outer)
    assert "cannot read 'lots'" in str(caught.value)
