"""Bad input to `autotune run`: one clear message, exit 2, and nothing written to the study."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.cli import main

from ..conftest import FAST, TINY_SOURCE
from ..trial.test_workload import LOAD_TIME, TRIAL_TIME


def run_bad(tmp_path: Path, capsys, *args: str) -> str:
    studies = tmp_path / "studies"
    code = main(["run", "--device", "cpu", "--studies-dir", str(studies), "--trials", "2",
                 *FAST, *args])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert "Traceback" not in err
    assert not list(studies.rglob("journal.log")), "bad input must leave no study behind"
    return err


@pytest.mark.slow
@pytest.mark.parametrize(("source", "says"), [LOAD_TIME["syntax"], TRIAL_TIME["empty_dataset"]],
                         ids=["at_load", "in_the_first_trial"])
def test_a_contract_violation_leaves_no_study(source: str, says: str, write_model, tmp_path,
                                              capsys) -> None:
    """Each violation's own message is tests/trial/test_workload's; here one found when the
    file is loaded and one only a trial's first step finds, through `run`."""
    err = run_bad(tmp_path, capsys, "--model", str(write_model(source)))
    assert re.search(says, err), err
    assert not (tmp_path / "studies" / "model").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--fix", "micro_batch=4"], "unknown knob(s) micro_batch"),
    (["--fix", "precision=fp8"], "precision must be one of"),
    (["--space", "{space}", "--fix", "micro_batch_size=8"],
     "--fix micro_batch_size=8 contradicts {space}, which lists micro_batch_size: [2, 4]"),
    (["--global-batch-size", "0"], "--global-batch-size must be >= 1"),
    # only the probe knows the baseline's optimizer: the one case here that runs the probe
    pytest.param(["--fix", "optimizer=adafactor"],
                 "changes what the model learns (another update rule than the baseline's "
                 "adamw): add --allow-optimizer-change", marks=pytest.mark.slow),
    (["--study", "a/b"], "study name"),
    (["--study", ".."], "study name"),
    (["--study", "x..y"], "study name"),
    (["--storage", "not-a-url"], "cannot open storage"),
])
def test_knobs_contradictions_and_names(args, message, write_model, tmp_path, capsys) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [2, 4]\n")
    args = [str(space) if a == "{space}" else a for a in args]
    err = run_bad(tmp_path, capsys, "--model", str(write_model(TINY_SOURCE)), *args)
    assert message.replace("{space}", str(space)) in err, err


@pytest.mark.parametrize("space", ["micro_batch: [2]\n", "precision: [fp8]\n",
                                   "micro_batch_size: 4\n- x\n"])
def test_bad_space_files(space: str, write_model, tmp_path, capsys) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(space)
    err = run_bad(tmp_path, capsys, "--model", str(write_model(TINY_SOURCE)), "--space",
                  str(path))
    assert str(path) in err or "space" in err, err
