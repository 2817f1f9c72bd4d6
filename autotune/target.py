"""What a study tunes: a model file with its keyword arguments (`ModelFile`), or a user's own
training script with its command-line arguments and the flags named for knobs (`Script`).

A module of its own, at the top, because every side asks it: `options` builds it from the
command line, the search sends it in every `TrialRequest`, a trial's process runs it, the
study stores it in its `StudyIdentity`, and the read side names it. Code that must differ for a
script asks the type (`match target: case Script(): ...`), never a missing argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# The JSON tag of each kind of target.
MODEL_FILE, SCRIPT = "model_file", "script"


@dataclass(frozen=True)
class ModelFile:
    """A model file (`build_model`, `build_dataset`, ...) and the keyword arguments its build
    functions take (`--model-arg`)."""

    path: str
    args: dict[str, Any] = field(default_factory=dict)
    noun: ClassVar[str] = "model file"

    def to_json(self) -> dict[str, Any]:
        return {"kind": MODEL_FILE, "path": self.path, "args": dict(self.args)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelFile:
        return cls(path=data["path"], args=dict(data.get("args") or {}))

    def describe(self) -> str:
        """`model.py`, or `model.py {'dim': 8}` with its arguments."""
        return f"{self.path} {self.args}" if self.args else self.path


@dataclass(frozen=True)
class Script:
    """A training script run as `python path ARGS`, and the script's own flags the user named
    for knobs (`flags`: knob -> flag, `--arg micro_batch_size=--batch_size`)."""

    path: str
    args: tuple[str, ...] = ()
    flags: dict[str, str] = field(default_factory=dict)
    noun: ClassVar[str] = "training script"

    def to_json(self) -> dict[str, Any]:
        return {"kind": SCRIPT, "path": self.path, "args": list(self.args),
                "flags": dict(self.flags)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Script:
        return cls(path=data["path"], args=tuple(data.get("args") or ()),
                   flags=dict(data.get("flags") or {}))

    def describe(self) -> str:
        """`train.py --bf16 (--arg micro_batch_size=--batch_size)`."""
        named = [f"(--arg {knob}={flag})" for knob, flag in self.flags.items()]
        return " ".join([self.path, *self.args, *named])


Target = ModelFile | Script


def target_from_json(data: Mapping[str, Any]) -> Target:
    """The target `to_json` wrote, as its own type."""
    if data["kind"] == SCRIPT:
        return Script.from_json(data)
    if data["kind"] == MODEL_FILE:
        return ModelFile.from_json(data)
    raise ValueError(f"a target of kind {data['kind']!r}: neither a model file nor a script")
