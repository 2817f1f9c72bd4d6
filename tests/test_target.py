"""What a study tunes reads back as its own kind: a model file with its keyword arguments, or a
training script with its arguments and the flags named for its knobs."""

from __future__ import annotations

import json

import pytest

from autotune.target import ModelFile, Script, target_from_json


@pytest.mark.parametrize("target", [
    ModelFile("/w/m.py", {"dim": 8, "name": "x"}),
    ModelFile("/w/m.py"),
    Script("/w/train.py", ("--output_dir", "out"), {"grad_accum_steps": "--accum"}),
    Script("/w/train.py"),
], ids=["model-file", "model-file-bare", "script", "script-bare"])
def test_a_target_reads_back_as_its_own_kind(target) -> None:
    read = target_from_json(json.loads(json.dumps(target.to_json())))
    assert read == target and type(read) is type(target)
    assert type(target).from_json(target.to_json()) == target


def test_a_model_file_and_a_script_of_the_same_path_are_not_the_same_target() -> None:
    assert ModelFile("/w/x.py") != Script("/w/x.py")
    assert target_from_json(Script("/w/x.py").to_json()) != ModelFile("/w/x.py")


def test_a_target_of_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="kind 'notebook'"):
        target_from_json({"kind": "notebook", "path": "/w/x.ipynb"})


def test_a_target_says_what_it_runs() -> None:
    assert ModelFile("m.py").describe() == "m.py"
    assert ModelFile("m.py", {"dim": 8}).describe() == "m.py {'dim': 8}"
    assert Script("train.py", ("--bf16",), {"micro_batch_size": "--batch"}).describe() == \
        "train.py --bf16 (--arg micro_batch_size=--batch)"
    assert Script("train.py").describe() == "train.py"
    assert (ModelFile.noun, Script.noun) == ("model file", "training script")
