"""`--script FILE -- ARGS` on the command line: the script's arguments are everything after
`--`, and a script and a model file are alternatives, each mistake one message and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main, split_script_args
from autotune.errors import UsageError
from autotune.options import BenchOptions, TuneOptions


def test_everything_after_the_first_double_dash_is_the_scripts() -> None:
    assert split_script_args(["run", "--script", "t.py", "--trials", "3", "--",
                              "--output_dir", "out", "--", "x"]) == (
        ["run", "--script", "t.py", "--trials", "3"], ["--output_dir", "out", "--", "x"])
    assert split_script_args(["run", "--model", "m.py"]) == (["run", "--model", "m.py"], [])


def test_the_options_know_the_script_and_its_arguments() -> None:
    options = TuneOptions(script_path="train.py", script_args=["--bf16"])
    assert options.workload_path == "train.py"
    assert options.script_argv == ["--bf16"]
    model = TuneOptions(model_path="model.py")
    assert model.workload_path == "model.py" and model.script_argv is None
    assert TuneOptions(script_path="train.py").script_argv == []  # a script with no arguments


@pytest.mark.parametrize(("given", "message"), [
    ({"model_path": "m.py", "script_path": "t.py"}, "--model and --script are alternatives"),
    ({}, "give --model FILE (a model file) or --script FILE (your training script)"),
    ({"model_path": "m.py", "script_args": ["--bf16"]},
     "the arguments after -- (--bf16) are a training script's: give --script FILE"),
])
def test_a_model_file_or_a_script_never_both(given: dict, message: str) -> None:
    for options in (TuneOptions, BenchOptions):
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            options(**given)


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "--model", "m.py", "--script", "t.py"], "--model and --script are alternatives"),
    (["bench", "--model", "m.py", "--", "--bf16"], "are a training script's: give --script"),
    (["show", "s", "--", "--bf16"], "autotune show takes no script arguments (after --)"),
    (["bench", "--script", "t.py", "--set", "precision=bf16", "--device", "cpu"],
     "and ended without calling Trainer.train or Trainer.fit"),
])
def test_command_line_mistakes_are_one_message_and_exit_2(argv, message, tmp_path: Path,
                                                         capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_script_that_is_not_there(command: str, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "missing.py"
    where = ["--studies-dir", str(tmp_path / "studies")] if command == "run" else []
    assert main([command, "--script", str(missing), "--device", "cpu", *where]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == f"autotune: error: training script not found: {missing}"


@pytest.mark.parametrize(("source", "message"), [
    ("import time\ntime.sleep(120)\n", "train.py ran 6 s and never called Trainer.train or "
                                       "Trainer.fit; for other training loops write a model "
                                       "file: README"),
    ("print('no training here')\n", "ended without calling Trainer.train or Trainer.fit"),
    ("import json\njson.loads('{')\n", 'train.py failed before its training started: '
                                       'Traceback (most recent call last): File'),
])
def test_a_script_that_never_trains_is_one_message(source: str, message: str, tmp_path: Path,
                                                   capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(source)
    studies = tmp_path / "studies"
    assert main(["run", "--script", str(script), "--device", "cpu", "--trials", "3",
                 "--trial-time-limit", "6", "--studies-dir", str(studies)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and err.count("autotune: error:") == 1
    assert not list(studies.rglob("journal.log")), "bad input leaves no study behind"
