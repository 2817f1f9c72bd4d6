"""Run settings: one dataclass per command is its command line, its defaults and its checks."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from autotune.cli import COMMANDS, build_parser, main
from autotune.errors import UsageError
from autotune.flags import add_flags, flag_of, from_args
from autotune.options import (
    BenchOptions,
    MeasureSettings,
    TuneOptions,
    parse_batch_range,
    parse_model_args,
    parse_script_flags,
)


def _flagged(cls: type) -> list:
    """The option fields of `cls`, its groups' included."""
    out = []
    for f in fields(cls):
        if "group" in f.metadata:
            out += _flagged(f.metadata["group"])
        elif "flags" in f.metadata:
            out.append(f)
    return out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_setting_with_a_flag_is_on_the_command_line_with_its_default(name) -> None:
    options = COMMANDS[name].options
    parser = argparse.ArgumentParser()
    add_flags(parser, options)
    text = parser.format_help()
    for f in _flagged(options):
        assert f.metadata["flags"][-1] in text or f.name in text
        assert f.metadata["help"].split()[0] in text
    required = {"run": ["--model", "m.py"], "bench": ["--model", "m.py"],
                "profile": ["--model", "m.py"], "report": ["s"], "show": ["s"],
                "export": ["s"], "verify": ["s"], "studies": []}[name]
    assert from_args(parser.parse_args(required), options) == options(
        **({"model_path": "m.py"} if "--model" in required else
           {"study": "s"} if required else {}))


def test_run_has_every_setting_and_the_measurement_settings_as_flags() -> None:
    flags = [f.metadata["flags"][-1] for f in _flagged(TuneOptions)]
    assert len(flags) >= 35
    assert {"--window-seconds", "--profile-steps", "--contention-retries"} <= set(flags)


def test_flags_are_read_through_their_fields() -> None:
    args = build_parser().parse_args([
        "run", "--model", "m.py", "--model-arg", "hidden=32", "--timeout", "30m", "--fix",
        "precision=bf16", "--memory-limit", "1GiB", "--free-batch-size", "8:64",
        "--devices", "cpu", "--plain-tpe", "--window-seconds", "0.5"])
    options = from_args(args, TuneOptions)
    assert options.model_args == {"hidden": 32} and options.timeout_s == 1800
    assert options.fixes == {"precision": "bf16"} and options.memory_limit_bytes == 2**30
    assert options.free_batch == (8, 64) and options.devices == ("cpu",)
    assert options.plain_tpe and options.settings.window_seconds == 0.5
    bench = from_args(build_parser().parse_args(
        ["bench", "--model", "m.py", "--set", "precision=bf16", "--window-steps", "4"]),
        BenchOptions)
    assert bench.knobs == ["precision=bf16"] and bench.settings.window_steps == 4


def test_model_args_are_typed() -> None:
    assert parse_model_args(["a=3", "b=0.5", "c=true", "d=False", "e=gpt2", "f=1e-3"]) == \
        {"a": 3, "b": 0.5, "c": True, "d": False, "e": "gpt2", "f": 0.001}


@pytest.mark.parametrize("bad", ["novalue", "=3", "1x=2"])
def test_malformed_model_arg(bad: str) -> None:
    with pytest.raises(UsageError, match="key=value"):
        parse_model_args([bad])


@pytest.mark.parametrize(("text", "message"), [
    ("16", "expects MIN:MAX"), ("a:b", "expects MIN:MAX"), ("16:64:2", "expects MIN:MAX"),
    ("0:8", "positive integers"),
    ("64:16", "MIN is larger than MAX")])
def test_free_batch_range_is_read_and_checked(text, message) -> None:
    assert [parse_batch_range(t) for t in ("16:64", " 1 : 8 ", "32:32")] == \
        [(16, 64), (1, 8), (32, 32)]
    with pytest.raises(UsageError, match=message):
        parse_batch_range(text)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(UsageError) as caught:
        TuneOptions(model_path="m.py", trials=0, stall_penalty=1.5, workers=0,
                    global_batch=8, free_batch=(1, 4), max_grad_accum=0,
                    settings=MeasureSettings(window_steps=0, contention_threshold=2.0))
    message = str(caught.value)
    for part in ("--trials must be >= 1", "--stall-penalty must be in [0, 1)",
                 "--workers must be >= 1", "contradict each other",
                 "--max-grad-accum must be >= 1", "--window-steps must be >= 1",
                 "--contention-threshold must be in [0, 1]"):
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
    (["--device", "tpu"], "unknown device"),
])
def test_parallel_options_are_checked(args, message, capsys) -> None:
    assert main(["run", "--model", "models/mlp.py", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["profile", "--model", "models/mlp.py", "--steps", "0"], "--steps must be >= 1"),
    (["bench", "--model", "models/mlp.py", "--window-max-steps", "2", "--window-steps", "5"],
     "--window-max-steps and --window-max-seconds must be at least"),
    (["export", "s", "--format", "csv"], "invalid choice"),
])
def test_other_commands_check_their_flags_too(args, message, capsys) -> None:
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse refuses a choice itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_a_scripts_flag_is_named_for_its_batch_knobs() -> None:
    assert parse_script_flags(["micro_batch_size=--batch_size", "grad_accum_steps = --accum"]) \
        == {"micro_batch_size": "--batch_size", "grad_accum_steps": "--accum"}
    for bad in ("precision=--bf16", "micro_batch_size", "micro_batch_size=batch_size",
                "micro_batch_size=--"):
        with pytest.raises(UsageError, match="--arg expects KNOB=FLAG"):
            parse_script_flags([bad])
