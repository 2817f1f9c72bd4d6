"""One way to give a command its flags: a dataclass whose fields carry their flag and help
(`option`). The parser is generated from the fields (`add_flags`) and the values read back
through them (`from_args`); a field made with `group` holds another such dataclass and adds
its flags too. Every value that cannot be read is listed in one `UsageError`, and the
dataclass's own checks run when it is built."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import MISSING, field, fields
from typing import Any, TypeVar

from autotune.errors import BadInput, UsageError

Options = TypeVar("Options")

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12,
          "tib": 2**40}


def option(flag: str | Sequence[str], help: str, *, default: Any = None,
           metavar: str | None = None, kind: Callable[[str], Any] | None = None,
           parse: Callable[[Any], Any] | None = None, choices: Sequence[Any] | None = None,
           repeat: bool = False, switch: bool = False, required: bool = False) -> Any:
    """A field with its flag (`--name`, several spellings, or a bare name for a positional
    argument): `kind` converts each word (argparse's `type`), `parse` the whole value once read,
    `repeat` collects a repeatable flag, `switch` is a flag without a value."""
    names = (flag,) if isinstance(flag, str) else tuple(flag)
    meta = {"flags": names, "help": help, "metavar": metavar, "kind": kind, "parse": parse,
            "choices": choices, "repeat": repeat, "switch": switch, "required": required}
    if required:
        return field(metadata=meta)
    if repeat or isinstance(default, (dict, list)):
        empty = type(default) if default is not None else dict
        return field(default_factory=empty, metadata=meta)
    return field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A field holding a dataclass of `option` fields: its flags are the command's too."""
    return field(default_factory=cls, metadata={"group": cls})


def flag_of(cls: type, name: str) -> str:
    """The flag of a field, as a message names it."""
    return next(f.metadata["flags"][-1] for f in fields(cls) if f.name == name)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argument per `option` field of `cls` (and of its groups), with help and default."""
    for f in fields(cls):
        meta = f.metadata
        if "group" in meta:
            add_flags(parser, meta["group"])
            continue
        if "flags" not in meta:
            continue
        names = meta["flags"]
        positional = not names[0].startswith("-")
        kwargs: dict[str, Any] = {"help": meta["help"]}
        if not positional:
            kwargs["dest"] = f.name
        if meta["switch"]:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = meta["metavar"] or (f.name.upper() if positional else None)
            if meta["kind"]:
                kwargs["type"] = meta["kind"]
            if meta["choices"]:
                kwargs["choices"] = meta["choices"]
            if meta["repeat"]:
                kwargs.update(action="append", default=[])
            elif f.default is not MISSING and f.default not in (None, ()):
                kwargs["default"] = f.default
        if meta["required"] and not positional:
            kwargs["required"] = True
        parser.add_argument(*((f.name,) if positional else names), **kwargs)


def from_args(args: argparse.Namespace, cls: type[Options], **given: Any) -> Options:
    """The settings the flags of `cls` were given, each read by its field's parser, and the
    fields `given` directly (what is no flag); every value that cannot be read is listed in one
    UsageError."""
    values, problems = {}, []
    for f in fields(cls):
        if "group" in f.metadata:
            values[f.name] = from_args(args, f.metadata["group"])
            continue
        if "flags" not in f.metadata or not hasattr(args, f.name):
            continue
        raw, parse = getattr(args, f.name), f.metadata["parse"]
        if raw is None or raw == []:
            continue
        try:
            values[f.name] = parse(raw) if parse else raw
        except BadInput as exc:
            problems.append(str(exc))
    if problems:
        raise UsageError("; ".join(problems))
    return cls(**values, **given)


def parse_bytes(text: str) -> int:
    """`8GiB`, `512MiB`, `8GB`, `2G` (binary), or plain bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read {text!r} as a memory size; use e.g. 8GiB, 512MiB, 8GB")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return value


def parse_duration(text: str | float) -> float:
    """`90`, `90s`, `30m`, `1h`, `1h30m` to seconds (a number, a field's default, is seconds
    already)."""
    if isinstance(text, (int, float)):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text.lower()):
        raise UsageError(f"cannot read {text!r} as a duration; use e.g. 90s, 30m, 1h30m")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"duration must be positive, got {text!r}")
    return seconds
