"""`--script FILE -- ARGS` on the command line: the script's arguments are everything after
`--`, and a script and a model file are alternatives, each mistake one message and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.cli import main, split_script_args
from autotune.errors import UsageError
from autotune.options import BenchOptions, TuneOptions
from autotune.target import ModelFile, Script


def test_everything_after_the_first_double_dash_is_the_scripts() -> None:
    assert split_script_args(["run", "--script", "t.py", "--trials", "3", "--",
                              "--output_dir", "out", "--", "x"]) == (
        ["run", "--script", "t.py", "--trials", "3"], ["--output_dir", "out", "--", "x"])
    assert split_script_args(["run", "--model", "m.py"]) == (["run", "--model", "m.py"], [])


def test_the_options_know_the_script_and_its_arguments() -> None:
    options = TuneOptions(script_path="train.py", script_args=["--bf16"],
                          script_flags={"micro_batch_size": "--batch"})
    assert options.target == Script("train.py", ("--bf16",), {"micro_batch_size": "--batch"})
    model = TuneOptions(model_path="model.py", model_args={"dim": 8})
    assert model.target == ModelFile("model.py", {"dim": 8})
    assert TuneOptions(script_path="train.py").target == Script("train.py")  # no arguments


@pytest.mark.parametrize(("given", "message"), [
    ({"model_path": "m.py", "script_path": "t.py"}, "--model and --script are alternatives"),
    ({}, "give --model FILE (a model file) or --script FILE (your training script)"),
    ({"model_path": "m.py", "script_args": ["--bf16"]},
     "the arguments after -- (--bf16) are a training script's: give --script FILE"),
    ({"script_path": "t.py", "model_args": {"dim": 8}},
     "--model-arg is a model file's keyword argument: a training script takes its own "
     "arguments after --"),
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
     "and ended without Trainer.train, Trainer.fit or a torch.optim optimizer's first step"),
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
    pytest.param("import time\ntime.sleep(120)\n",
                 "train.py ran 6 s and never reached Trainer.train, Trainer.fit or a "
                 "torch.optim optimizer's first step; a loop without a torch.optim optimizer: "
                 "write a model file (README); a start-up longer than 6 s: --startup-limit 10m",
                 marks=pytest.mark.slow),
    ("print('no training here')\n", "ended without Trainer.train, Trainer.fit or a "
                                     "torch.optim optimizer's first step"),
    ("import json\njson.loads('{')\n", 'train.py failed before its training started: '
                                       'Traceback (most recent call last): File'),
])
def test_a_script_that_never_trains_is_one_message(source: str, message: str, tmp_path: Path,
                                                   capsys) -> None:
    """One that never gets there is stopped at its start-up limit (120 s unless
    --startup-limit says otherwise)."""
    script = tmp_path / "train.py"
    script.write_text(source)
    studies = tmp_path / "studies"
    assert main(["run", "--script", str(script), "--device", "cpu", "--trials", "3",
                 "--startup-limit", "6", "--studies-dir", str(studies)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and err.count("autotune: error:") == 1
    assert not studies.exists(), "bad input leaves no study behind, nor an empty studies/"


def test_a_scripts_arguments_given_without_the_double_dash_are_refused_with_the_command(
        tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["run", "--script", "train.py", "--trials", "2", "--output_dir", "out"])
    assert ended.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.endswith("autotune: error: unrecognized arguments: --output_dir out (a script's "
                        "own arguments go after --: autotune run --script train.py "
                        "[autotune's flags] -- --output_dir out)")
    with pytest.raises(SystemExit):
        main(["run", "--model", "m.py", "--output_dir", "out"])
    assert capsys.readouterr().err.rstrip().endswith("unrecognized arguments: --output_dir out")


def _run_bad_script(tmp_path: Path, capsys, source: str, *script_args: str) -> str:
    """`run --script` of a script that fails before its training: exit 2, the message as
    printed (its lines kept), no study left."""
    script = tmp_path / "train.py"
    script.write_text(source)
    studies = tmp_path / "studies"
    assert main(["run", "--script", str(script), "--device", "cpu", "--trials", "2",
                 "--studies-dir", str(studies), "--", *script_args]) == 2
    assert not studies.exists()
    return capsys.readouterr().err


def test_a_syntax_error_arrives_as_python_shows_it(tmp_path: Path, capsys) -> None:
    err = _run_bad_script(tmp_path, capsys, "import os\nx = (1,\ny = 2\n")
    assert err.endswith(f"autotune: error: train.py failed before its training started:\n"
                        f'  File "{tmp_path / "train.py"}", line 2\n    x = (1,\n        ^\n'
                        "SyntaxError: '(' was never closed\n")


def test_a_long_failure_keeps_the_errors_own_line(tmp_path: Path, capsys) -> None:
    err = _run_bad_script(tmp_path, capsys,
                          "raise ValueError('no data: ' + 'x' * 6000 + ' (run prepare.py)')\n")
    assert err.count("autotune: error:") == 1
    assert "characters left out ...]" in err and err.endswith("x (run prepare.py)\n")


def test_a_scripts_own_reason_to_exit_is_shown(tmp_path: Path, capsys) -> None:
    err = _run_bad_script(tmp_path, capsys, "import sys\nprint('no data under ./data', "
                                            "file=sys.stderr)\nsys.exit(3)\n")
    assert err.endswith("autotune: error: train.py exited with status 3 before its training "
                        "started; its last lines:\n  no data under ./data\n")


def test_a_script_asked_for_its_help_is_told_whose_arguments_follow_the_double_dash(
        tmp_path: Path, capsys) -> None:
    err = _run_bad_script(tmp_path, capsys, "import argparse\n"
                                            "argparse.ArgumentParser().parse_args()\n", "--help")
    assert " ".join(err.split()).endswith(
        "autotune: error: train.py printed its help and exited (--help): the arguments after "
        "-- are train.py's own; autotune's are before it (autotune run --help)")


def test_a_failed_probe_keeps_the_log_its_message_names(tmp_path: Path, capsys) -> None:
    """Not bad input (the script's process died without a result): exit 1, and the log the
    message points to is there to read; the study's other files are not."""
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('loading the data')\nos._exit(1)\n")
    studies = tmp_path / "studies"
    assert main(["run", "--script", str(script), "--device", "cpu", "--trials", "2",
                 "--studies-dir", str(studies)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    log = studies / "train" / "logs" / "probe.log"
    assert f"(log: {log})" in err
    assert "loading the data" in log.read_text()
    assert [p.name for p in (studies / "train").iterdir()] == ["logs"]


@pytest.mark.slow
def test_sigterm_exits_143_and_leaves_no_temporary_folder_nor_study(tmp_path: Path) -> None:
    """A scheduler's stop while the probe runs the script: the exit code a shell gives a
    process SIGTERM ended, the probe's scratch folder and the trial's files gone from the temp
    directory, and no study, nor the studies folder, left behind."""
    temp, home = tmp_path / "tmp", tmp_path / "home"
    temp.mkdir()
    home.mkdir()
    started = tmp_path / "started"
    (home / "train.py").write_text(f"import pathlib, time\npathlib.Path({str(started)!r})"
                                   ".write_text('yes')\ntime.sleep(600)\n")
    tuner = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", "--script", "train.py", "--device", "cpu",
         "--trials", "2"], cwd=home, env={**os.environ, "TMPDIR": str(temp),
                                           "PYTHONPATH": str(Path(__file__).parents[1])},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(temp.glob("autotune-trial-*/scratch"))
    tuner.send_signal(signal.SIGTERM)
    _, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 143, err
    assert [p.name for p in temp.iterdir() if p.name.startswith("autotune")] == []
    assert sorted(p.name for p in home.iterdir()) == ["train.py"]
