"""Where a script's setting is said: its parser's options as parsed, a library call's keyword
traced to the flag its value came from, or the call's own line; flags set on a command line
as the script's parser reads them."""

from __future__ import annotations

import argparse
import inspect
import runpy
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autotune.trial.protocol import EQUALS, NEGATABLE, SWITCH, VALUE, ScriptFlag, without_flag
from autotune.trial.script.sources import (
    Source,
    assignment_line,
    call_site,
    named_flag,
    record_flags,
    with_flags,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", "-b", type=int, default=8)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--layers", nargs="+", type=int, default=[1])
    parser.add_argument("data")
    return parser


def test_each_option_is_recorded_with_its_value_and_how_it_was_written() -> None:
    words = ["--batch_size=4", "--bf16", "train.bin"]
    flags: dict[str, Any] = {}
    record_flags(_parser(), words, _parser().parse_args(words), flags)
    assert flags["batch_size"].option == "--batch_size" and flags["batch_size"].value == 4
    assert (flags["batch_size"].form, flags["batch_size"].given) == (EQUALS, True)
    assert (flags["bf16"].form, flags["bf16"].const, flags["bf16"].given) == (SWITCH, True, True)
    assert (flags["compile"].form, flags["compile"].given) == (NEGATABLE, False)
    assert "layers" not in flags and "data" not in flags  # a list and a positional set nothing


def test_flags_are_set_on_a_command_line_as_its_parser_reads_them() -> None:
    argv = ["train.bin", "-x", "--batch_size", "4", "--bf16", "--compile"]
    set_ = [ScriptFlag("--batch_size", 16, VALUE), ScriptFlag("--bf16", False, SWITCH, True),
            ScriptFlag("--compile", False, NEGATABLE), ScriptFlag("--accum", 2, EQUALS)]
    assert with_flags(argv, set_) == ["train.bin", "-x", "--batch_size", "16", "--no-compile",
                                      "--accum=2"]
    parsed = _parser().parse_known_args(with_flags(argv, set_[:3]))[0]
    assert (parsed.batch_size, parsed.bf16, parsed.compile) == (16, False, False)
    assert without_flag(["--lr=3", "--batch_size=4", "--x"], "--batch_size", EQUALS) == \
        ["--lr=3", "--x"]



def test_a_flag_given_by_its_short_option_is_named_and_set_by_either() -> None:
    """`-b 4` on the command line, `--arg micro_batch_size=-b` named: either spelling is the
    flag, and setting it takes out whichever the command line used (`-b 4`, `-b4`)."""
    words = ["-b", "4", "train.bin"]
    flags: dict[str, Any] = {}
    record_flags(_parser(), words, _parser().parse_args(words), flags)
    assert (flags["batch_size"].option, flags["batch_size"].aliases) == ("--batch_size", ("-b",))
    named = named_flag("-b", flags, "micro_batch_size")
    assert (named.flag, named.aliases) == ("-b", ("--batch_size",))
    for given in (["-b", "4", "x"], ["-b4", "x"], ["--batch_size", "4", "x"]):
        assert with_flags(given, [ScriptFlag(named.flag, 16, named.form, None, named.aliases)]) \
            == ["x", "-b", "16"]


SCRIPT = '''
import argparse
from hook import Loader

parser = argparse.ArgumentParser()
parser.add_argument("--batch_size", type=int, default=8)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--drop_last", action="store_true")
args = parser.parse_args()
workers = args.workers
model = dict(
    layers=2)
common = dict(drop_last=args.drop_last)
loader = Loader(None,
                batch_size=args.batch_size,
                num_workers=workers, shuffle=True, **common)
'''

HOOK = '''
import sys
from autotune.trial.script.sources import call_site

class Loader:
    def __init__(self, data, **kwargs):
        Loader.site = call_site(sys._getframe(1), self)
        Loader.sources = {k: Loader.site.source(k, Loader.flags, Loader.folder)
                          for k in ("batch_size", "num_workers", "shuffle", "drop_last")}
        Loader.passed = {k for k in ("drop_last", "pin_memory") if Loader.site.passes(k)}
'''


def test_a_keyword_is_traced_to_the_flag_its_value_came_from_else_to_its_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hook.py").write_text(textwrap.dedent(HOOK))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["train.py", "--batch_size", "4", "--workers", "2"])
    import hook

    flags: dict[str, Any] = {}
    original = argparse.ArgumentParser.parse_known_args

    def recorded(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        parsed = original(self, args, namespace)
        record_flags(self, args, parsed[0], flags)
        return parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", recorded)
    hook.Loader.flags, hook.Loader.folder = flags, tmp_path
    runpy.run_path(str(script), run_name="__main__")
    line = Source(file="train.py", line=14, call="Loader")
    assert hook.Loader.site.line == 14 and hook.Loader.site.callee == "Loader"
    assert hook.Loader.sources == {
        "batch_size": Source(flag="--batch_size", form=VALUE),
        "num_workers": line,  # through a variable: the line that passes it
        "shuffle": line,
        # in the `**common` it built as dict(...), as timm's train.py builds its loaders'
        "drop_last": Source(flag="--drop_last", form=SWITCH, const=True)}
    assert hook.Loader.passed == {"drop_last"}
    assert assignment_line(str(script), "model") == 11


def test_a_call_autotune_or_a_library_makes_has_no_site_of_the_users() -> None:
    frames: list[Any] = []

    class Grab:
        flag, form, aliases = "--x", VALUE, ()

        def words(self) -> list[str]:
            frames.append(sys._getframe(1))  # autotune's own code calls it
            return []

    with_flags([], [Grab()])  # type: ignore[list-item]
    inspect.getmembers(Grab, lambda member: frames.append(sys._getframe(1)))  # a library's
    assert frames[0].f_code.co_name == "with_flags" and "inspect" in frames[1].f_code.co_filename
    assert [call_site(frame) for frame in frames[:2]] == [None, None]
    assert Source.from_dict(Source(flag="--b", form=SWITCH, const=True).to_dict()) == \
        Source(flag="--b", form=SWITCH, const=True)
