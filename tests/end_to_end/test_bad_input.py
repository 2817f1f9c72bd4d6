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


@pytest.mark.parametrize("case", sorted(LOAD_TIME))
def test_contract_violations_at_load(case: str, write_model, tmp_path, capsys) -> None:
    source, pattern = LOAD_TIME[case]
    err = run_bad(tmp_path, capsys, "--model", str(write_model(source)))
    assert re.search(pattern, err), err


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(TRIAL_TIME))
def test_contract_violations_in_the_first_trial(case: str, write_model, tmp_path,
                                                capsys) -> None:
    source, message = TRIAL_TIME[case]
    err = run_bad(tmp_path, capsys, "--model", str(write_model(source)))
    assert message in err, err
    assert not (tmp_path / "studies" / "model").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--fix", "micro_batch=4"], "unknown knob(s) micro_batch"),
    (["--fix", "precision=fp8"], "precision must be one of"),
    (["--space", "{space}", "--global-batch-size", "7"],
     "no micro_batch_size keeps the effective batch at 7"),
    (["--space", "{space}", "--fix", "micro_batch_size=8"],
     "--fix micro_batch_size=8 contradicts {space}, which lists micro_batch_size: [2, 4]"),
    (["--global-batch-size", "0"], "--global-batch-size must be >= 1"),
    (["--fix", "optimizer=adafactor"], "changes what the model learns (another update rule "
                                       "than the baseline's adamw): add --allow-optimizer-change"),
    (["--memory-limit", "1KiB"], "below what the model alone needs"),
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
