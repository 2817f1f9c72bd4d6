"""What a study tunes: a model file with its keyword arguments (`ModelFile`), or a user's own
training script with its command-line arguments and the flags named for knobs (`Script`).

A module of its own, at the top, because every side asks it: `options` builds it from the
command line, the search sends it in every `TrialRequest`, a trial's process runs it, the
study stores it in its `StudyIdentity`, and the read side names it. What differs between the
two kinds is said by the target itself (its noun, its baseline's name, whether its trials work in
a scratch folder, whether its data splits for a loss check, its fields in a trial's request);
code that must still run differently for a script asks the type (`match target: case Script():
...`), never a missing argument.
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
    baseline_name: ClassVar[str] = "the model file's BASELINE"  # the baseline, in a message
    works_in_scratch: ClassVar[bool] = False  # autotune's own loop writes nothing
    loss_with_split: ClassVar[bool] = True  # its dataset splits: a held-out loss is measured

    def to_json(self) -> dict[str, Any]:
        return {"kind": MODEL_FILE, "path": self.path, "args": dict(self.args)}

    def identity_fields(self) -> dict[str, Any]:
        """The target in a study identity's plain data, as studies have always stored it."""
        return {"model_path": self.path, "model_args": dict(self.args)}

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
    baseline_name: ClassVar[str] = "the script's own settings"
    works_in_scratch: ClassVar[bool] = True  # its current directory: its files stay out of yours
    loss_with_split: ClassVar[bool] = False  # its loss is the training loss it computes

    def to_json(self) -> dict[str, Any]:
        return {"kind": SCRIPT, "path": self.path, "args": list(self.args),
                "flags": dict(self.flags)}

    def identity_fields(self) -> dict[str, Any]:
        """The target in a study identity's plain data: the script's path as `model_path`, its
        arguments (`script_args`, their presence marking a script) and the flags named for its
        knobs (`script_flags`, only where given)."""
        flags = {"script_flags": dict(self.flags)} if self.flags else {}
        return {"model_path": self.path, "model_args": {}, "script_args": list(self.args),
                **flags}

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


def target_from_identity(data: Mapping[str, Any]) -> Target:
    """The target `identity_fields` wrote."""
    if data.get("script_args") is not None:
        return Script(data["model_path"], tuple(data["script_args"]),
                      dict(data.get("script_flags") or {}))
    return ModelFile(data["model_path"], dict(data["model_args"] or {}))
