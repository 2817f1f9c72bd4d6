"""Run settings: one dataclass is the command line, its defaults and its checks."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from autotune.cli import build_parser, main
from autotune.options import (
    TuneOptions,
    UsageError,
    add_options,
    flag_of,
    options_from_args,
    parse_bytes,
    parse_duration,
)


def test_parse_bytes() -> None:
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("1.5G") == int(1.5 * 2**30)
    with pytest.raises(UsageError, match="memory size"):
        parse_bytes("lots")


def test_parse_duration() -> None:
    assert parse_duration("90") == 90 and parse_duration("1h30m") == 5400
    with pytest.raises(UsageError, match="duration"):
        parse_duration("soon")


def test_every_setting_with_a_flag_is_on_the_command_line_with_its_default() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, TuneOptions)
    text = parser.format_help()
    flagged = [f for f in fields(TuneOptions) if "flag" in f.metadata]
    assert len(flagged) >= 25
    for f in flagged:
        assert f.metadata["flag"] in text
        assert f.metadata["help"].split()[0] in text
    args = parser.parse_args(["--model", "m.py"])
    defaults = options_from_args(args, TuneOptions)
    assert defaults == TuneOptions(model_path="m.py")


def test_flags_are_read_through_their_fields() -> None:
    args = build_parser().parse_args([
        "run", "--model", "m.py", "--model-arg", "hidden=32", "--timeout", "30m", "--fix",
        "precision=bf16", "--memory-limit", "1GiB", "--free-batch-size", "8:64",
        "--devices", "cuda:0, cuda:1", "--plain-tpe"])
    options = options_from_args(args, TuneOptions)
    assert options.model_args == {"hidden": 32} and options.timeout_s == 1800
    assert options.fixes == {"precision": "bf16"} and options.memory_limit_bytes == 2**30
    assert options.free_batch == (8, 64) and options.devices == ("cuda:0", "cuda:1")
    assert options.plain_tpe


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(UsageError) as caught:
        TuneOptions(model_path="m.py", trials=0, stall_penalty=1.5, workers=0,
                    global_batch=8, free_batch=(1, 4))
    message = str(caught.value)
    for part in ("--trials must be >= 1", "--stall-penalty must be in [0, 1)",
                 "--workers must be >= 1", "contradict each other"):
        assert part in message
    assert flag_of(TuneOptions, "heartbeat_s") == "--heartbeat-interval"


def test_unreadable_values_are_all_named(capsys) -> None:
    code = main(["run", "--model", "models/mlp.py", "--timeout", "soon", "--memory-limit",
                 "lots"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert "cannot read 'soon' as a duration" in err and "cannot read 'lots'" in err


@pytest.mark.parametrize(("args", "message"), [
    (["--workers", "0"], "--workers must be >= 1"),
    (["--devices", "cpu,cpu"], "distinct devices"),
    (["--device", "cpu", "--devices", "cpu"], "either --device or"),
    (["--device", "cuda", "--workers", "2"], "would run 2 trials on one GPU at once"),
    (["--device", "cuda:1", "--workers", "3"], "give several GPUs"),
])
def test_parallel_options_are_checked(args, message, capsys) -> None:
    assert main(["run", "--model", "models/mlp.py", *args]) == 2
    assert message in capsys.readouterr().err
