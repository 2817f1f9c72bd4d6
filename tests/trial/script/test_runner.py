"""A script runs as `python train.py ARGS` would run it, and every way it can fail to reach
its training is one clear message."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from autotune.trial.script.errors import (
    NeverTrained,
    ScriptArgumentsRejected,
    ScriptError,
    ScriptFailed,
    never_trained_message,
)
from autotune.trial.script.runner import absolute_arguments
from tests.conftest import need
from tests.trial.script.steps import run


def _script(tmp_path: Path, source: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_script_runs_as_main_with_its_arguments_and_its_directory_on_the_path(
        tmp_path: Path) -> None:
    _script(tmp_path, "VALUE = 42\n", "helper.py")
    script = _script(tmp_path, '''
        import sys
        from helper import VALUE
        assert __name__ == "__main__" and VALUE == 42
        assert sys.argv[1:] == ["--lr", "3"] and sys.argv[0].endswith("train.py"), sys.argv
        ''')
    argv, path = list(sys.argv), list(sys.path)
    # it ran to its end (the asserts held), and it never trained
    with pytest.raises(NeverTrained, match=r"^train.py ran \d+ s and ended without "
                                           r"Trainer.train, Trainer.fit or a torch.optim "
                                           r"optimizer's first step; a loop without a "
                                           r"torch.optim optimizer: write a model file "
                                           r"\(README\)$"):
        run(script, ["--lr", "3"], tmp_path / "s")
    assert sys.argv == argv and sys.path == path


def test_the_message_for_a_script_stopped_by_its_time_limit() -> None:
    assert never_trained_message("train.py", 120) == (
        "train.py ran 120 s and never reached Trainer.train, Trainer.fit or a torch.optim "
        "optimizer's first step; a loop without a torch.optim optimizer: write a model file "
        "(README)")


def test_a_script_that_fails_before_training_shows_its_own_traceback_once(
        tmp_path: Path) -> None:
    script = _script(tmp_path, '''
        def load():
            raise ValueError("no data under ./data")
        load()
        ''')
    with pytest.raises(ScriptFailed) as caught:
        run(script, [], tmp_path / "s")
    message = str(caught.value)
    assert message.startswith("train.py failed before its training started:\nTraceback")
    assert f'File "{script}", line 4, in <module>' in message
    assert 'line 3, in load\n    raise ValueError("no data under ./data")' in message
    assert message.count("ValueError: no data under ./data") == 1
    assert "runpy" not in message and "autotune" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_script_that_exits_before_training_says_so(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nsys.exit(3)\n")
    with pytest.raises(ScriptFailed, match="^train.py exited with status 3 before its training "
                                           "started$"):
        run(script, [], tmp_path / "s")


def test_a_script_whose_argparse_parser_refuses_its_arguments(tmp_path: Path) -> None:
    script = _script(tmp_path, '''
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, required=True)
        parser.parse_args()
        ''')
    with pytest.raises(ScriptArgumentsRejected) as caught:
        run(script, ["--epochs", "many"], tmp_path / "s")
    assert str(caught.value) == (
        "train.py rejected its arguments (--epochs many):\nusage: train.py [-h] --epochs "
        "EPOCHS\ntrain.py: error: argument --epochs: invalid int value: 'many'")


@pytest.mark.parametrize(("argv", "says"), [
    (["--per_device_train_batch_size", "many"], "invalid int value: 'many'"),
    (["--output_dir", "x", "--no_such_flag", "3"],
     "Some specified arguments are not used by the HfArgumentParser: ['--no_such_flag', '3']"),
])
def test_a_script_whose_hfargumentparser_refuses_its_arguments(
        tmp_path: Path, argv: list[str], says: str) -> None:
    need("transformers", "examples")
    with pytest.raises(ScriptArgumentsRejected, match="hf_argparser.py rejected its arguments") \
            as caught:
        run("hf_argparser.py", argv, tmp_path / "s")
    assert says in str(caught.value)


def test_a_script_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="training script not found: .*missing.py"):
        run(tmp_path / "missing.py", [], tmp_path / "s")


def test_a_script_works_in_a_scratch_folder_that_finds_the_users_files(
        tmp_path: Path, monkeypatch) -> None:
    """What the script writes by a relative path to a new file lands in the run's scratch
    folder, never the user's; its relative reads still find the user's files, and an
    argument naming a path outside the user's folder (`../shared`) still names it."""
    home, shared = tmp_path / "home", tmp_path / "shared"
    (home / "data").mkdir(parents=True)
    (home / "data" / "train.csv").write_text("x,y\n")
    shared.mkdir()
    (shared / "vocab.txt").write_text("a b\n")
    script = _script(home, '''
        import os, sys
        from pathlib import Path
        assert Path("data/train.csv").read_text() == "x,y\\n"
        assert Path(sys.argv[2]).read_text() == "a b\\n", sys.argv
        assert sys.argv[3:] == ["--out", "new_dir"], sys.argv
        Path("made_at_import.txt").write_text("written")
        os.makedirs("new_dir")
        ''')
    monkeypatch.chdir(home)
    scratch = tmp_path / "scratch"
    with pytest.raises(NeverTrained):
        run(script, ["--vocab", "../shared/vocab.txt", "--out", "new_dir"], scratch)
    assert sorted(p.name for p in home.iterdir()) == ["data", "train.py"]
    assert (scratch / "cwd" / "made_at_import.txt").read_text() == "written"
    assert (scratch / "cwd" / "new_dir").is_dir()
    assert Path.cwd() == home


def test_only_arguments_naming_a_path_outside_the_users_folder_are_made_absolute(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    (tmp_path / "shared").mkdir()
    assert absolute_arguments(
        ["../shared", "--vocab=../shared", "data", "--out", "../missing", "-3", "..x"],
        home) == [str(tmp_path / "shared"), f"--vocab={tmp_path / 'shared'}", "data", "--out",
                  "../missing", "-3", "..x"]


def test_a_syntax_error_in_the_script_is_shown_as_python_shows_it(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nx = (1,\ny = 2\n")
    with pytest.raises(ScriptFailed) as caught:
        run(script, [], tmp_path / "s")
    assert str(caught.value) == (
        f"train.py failed before its training started:\n  File \"{script}\", line 2\n"
        "    x = (1,\n        ^\nSyntaxError: '(' was never closed")


def test_a_script_that_exits_before_training_shows_its_own_last_lines(tmp_path: Path) -> None:
    script = _script(tmp_path, '''
        import sys
        for i in range(20):
            print(f"loading shard {i}\\r", end="")
        print()
        print("no data under ./data: run prepare.py first", file=sys.stderr)
        sys.exit(3)
        ''')
    with pytest.raises(ScriptFailed) as caught:
        run(script, [], tmp_path / "s")
    assert str(caught.value) == (
        "train.py exited with status 3 before its training started; its last lines:\n"
        "  loading shard 19\n  no data under ./data: run prepare.py first")


def test_a_script_that_exits_with_its_reason_says_it(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys\nsys.exit('no GPU found')\n")
    with pytest.raises(ScriptFailed, match="^train.py exited before its training started: "
                                           "no GPU found$"):
        run(script, [], tmp_path / "s")


def test_a_script_asked_for_its_help_says_so(tmp_path: Path) -> None:
    script = _script(tmp_path, '''
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int)
        parser.parse_args()
        ''')
    with pytest.raises(ScriptError) as caught:
        run(script, ["--help"], tmp_path / "s")
    assert str(caught.value) == (
        "train.py printed its help and exited (--help): the arguments after -- are "
        "train.py's own; autotune's are before it (autotune run --help)")


def test_a_long_usage_is_left_out_of_a_parsers_refusal_and_its_reason_kept(
        tmp_path: Path) -> None:
    script = _script(tmp_path, '''
        import argparse
        parser = argparse.ArgumentParser()
        for i in range(300):
            parser.add_argument(f"--option_number_{i}", type=int)
        parser.parse_args()
        ''')
    with pytest.raises(ScriptArgumentsRejected) as caught:
        run(script, ["--option_number_7", "many"], tmp_path / "s")
    assert str(caught.value) == (
        "train.py rejected its arguments (--option_number_7 many):\ntrain.py: error: argument "
        "--option_number_7: invalid int value: 'many'")
