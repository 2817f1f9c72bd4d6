"""`autotune bench` as a user runs it: real subprocesses, real trials, tiny models; files the
commands write where they cannot."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from autotune.cli import _other_library, main, run_failure
from autotune.config import TrainConfig
from autotune.study.storage import open_storage
from autotune.study.summary import BaselineTrial
from autotune.target import ModelFile, Script
from autotune.trial.script.session import ScriptBaseline
from autotune.trial.script.terms import answer

from .conftest import FAST, ROOT, TEST_MODELS, run_cli
from .study.test_results import _told

BENCH_KEYS = {"status", "message", "device", "config", "samples_per_sec", "step_time_median_s",
              "step_time_p90_s", "step_time_cv", "time_to_first_step_s", "peak_memory_bytes",
              "data_wait_fraction", "host_syncs_per_step", "device_idle_fraction", "mfu"}
TINY_RGAT = ["--model-arg", "hidden=32", "--model-arg", "heads=2", "--model-arg", "text_layers=1",
             "--model-arg", "graph_layers=2", "--model-arg", "vocab_size=64",
             "--model-arg", "max_nodes=8", "--model-arg", "max_text_len=4",
             "--model-arg", "num_samples=512"]


@pytest.mark.slow
def test_bench_json_has_every_figure_and_knob(tmp_path) -> None:
    done = run_cli("bench", "--model", str(TEST_MODELS / "tiny_dict.py"), "--device", "cpu",
                   "--json", "--set", "precision=bf16", "--set", "micro_batch_size=4",
                   "--trace", str(tmp_path), *FAST)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert set(record) >= BENCH_KEYS
    assert record["status"] == "ok" and record["device"] == "cpu"
    assert record["config"]["precision"] == "bf16"
    assert record["config"]["micro_batch_size"] == 4
    assert record["config"]["grad_accum_steps"] == 2, "the rest comes from BASELINE"
    assert record["samples_per_sec"] > 0 and record["mfu"] is None
    trace = json.loads((tmp_path / "tiny_dict-trace.json").read_text())
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])


@pytest.mark.slow
def test_bench_rgat_prints_the_full_table() -> None:
    done = run_cli("bench", "--model", "models/rgat.py", "--device", "cpu", *TINY_RGAT, *FAST)
    assert done.returncode == 0, done.stderr
    for row in ("samples/sec", "step time p90", "time to first step", "peak memory",
                "data wait", "host syncs/step", "top operators", "micro_batch_size"):
        assert row in done.stdout


@pytest.mark.slow
def test_config_file_then_set_override(tmp_path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text("micro_batch_size: 32\nnum_workers: 1\nprefetch_factor: 2\n")
    done = run_cli("bench", "--model", str(TEST_MODELS / "tiny_tuple.py"), "--device", "cpu",
                   "--config", str(config), "--set", "micro_batch_size=64", "--json", *FAST)
    assert done.returncode == 0, done.stderr
    knobs = json.loads(done.stdout)["config"]
    assert (knobs["micro_batch_size"], knobs["num_workers"], knobs["prefetch_factor"]) == \
        (64, 1, 2)


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "micro_batch=3"], "unknown knob(s) micro_batch"),
    (["--set", "precision=fp8"], "precision must be one of fp32, tf32, bf16, fp16"),
    (["--set", "precision=fp16"], "fp16 needs a GradScaler path"),
    (["--set", "prefetch_factor=2"], "prefetch_factor needs num_workers > 0"),
    (["--memory-limit", "lots"], "cannot read 'lots' as a memory size"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--config", "missing.yaml"], "config file not found: missing.yaml"),
])
def test_bad_input_is_one_message_and_exit_2(args, message, capsys) -> None:
    code = main(["bench", "--model", str(TEST_MODELS / "tiny_tuple.py"), "--device", "cpu",
                 *args] if "--device" not in args else
                ["bench", "--model", str(TEST_MODELS / "tiny_tuple.py"), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split())
    assert "Traceback" not in err


def test_help_explains_and_module_entry_point_works() -> None:
    done = run_cli("bench", "--help")
    assert done.returncode == 0
    for option in ("--model-arg", "--memory-limit", "--set", "--json", "BASELINE"):
        assert option in done.stdout
    assert (ROOT / "pyproject.toml").read_text().count('autotune = "autotune.cli:main"') == 1
    run_help = run_cli("run", "--help").stdout
    assert "95% interval" in run_help and "Exit codes" in run_help
    assert "(default: None)" not in run_help and "(default: [])" not in run_help
    assert "(default: 3)" in run_help  # --confirm-repeats, a default worth showing


@pytest.mark.slow
def test_torch_compile_end_to_end() -> None:
    """The one test that pays for inductor (about 30 s cold; the cache makes reruns cheap)."""
    done = run_cli("bench", "--model", str(TEST_MODELS / "tiny_tuple.py"), "--device", "cpu",
                   "--set", "compile_mode=default", "--json", *FAST)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["status"] == "ok"
    assert record["config"]["compile_mode"] == "default"
    assert record["time_to_first_step_s"] > 5 * record["step_time_median_s"]
    names = {op["name"] for op in record["top_operators"]}
    # inductor's graph shows as CompiledFunction or as a "## Call CompiledFxGraph ... ##" range
    assert any("Compiled" in name for name in names), "the profiled steps ran the compiled graph"


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A folder no file can be created in: mode 0555, or, for root (whom modes do not stop),
    sysfs, which refuses new files to everyone."""
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o555)
    if os.geteuid() == 0:
        folder = Path("/sys/kernel")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pytest.skip(f"{folder} is writable here")
    except OSError:
        return folder


def test_outputs_that_cannot_be_written_are_one_message_and_exit_2(tmp_path, read_only,
                                                                    capsys) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    _told(study, TrainConfig(micro_batch_size=8), "ok", 100.0, role="baseline")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    study_args = ["--studies-dir", str(tmp_path)]
    profile = ["profile", "--model", str(TEST_MODELS / "tiny_tuple.py"), "--device", "cpu"]
    for command, target in [
            (["export", "s", *study_args, "-o"], tmp_path),
            (["export", "s", *study_args, "-o"], read_only / "best.yaml"),
            (["report", "s", *study_args, "-o"], tmp_path),
            (["report", "s", *study_args, "-o"], read_only / "report.html"),
            ([*profile, "--out"], a_file),
            ([*profile, "--out"], read_only)]:
        assert main([*command, str(target)]) == 2, command
        err = capsys.readouterr().err
        [line] = err.strip().splitlines()
        into = "to " if command[0] == "profile" else ""
        assert line.startswith(f"autotune: error: cannot write {into}{target}: "), line


@pytest.mark.parametrize(("target", "baseline"), [
    (ModelFile("m.py"), "the model file's BASELINE"),
    (Script("t.py"), "the script's own settings")])
def test_a_failed_baseline_is_named_as_the_studys_own(target, baseline) -> None:
    """A script study's baseline is the script's own settings, not a model file's BASELINE."""
    summary = SimpleNamespace(baseline_trial=BaselineTrial(0, "error", "ValueError: boom\nmore"),
                              target=target)
    assert run_failure(summary) == (f"the baseline ({baseline}) failed as error: ValueError: "
                                    "boom; nothing can be compared")


def test_a_script_study_refuses_the_other_librarys_export_format() -> None:
    def study(name: str | None) -> SimpleNamespace:
        """A study whose answer was made in the terms of the registered library `name`."""
        if name is None:
            return SimpleNamespace(script_answer=None)
        config = TrainConfig(micro_batch_size=8)
        own = {"TrainingArguments": {}} if name == "transformers" else {}
        baseline = ScriptBaseline(name, knobs=config.to_dict(), settings=own)
        return SimpleNamespace(script_answer=answer(config, baseline, "cpu"))

    assert _other_library(study("transformers"), "lightning") == "Hugging Face Trainer script"
    assert _other_library(study("lightning"), "hf") == "Lightning Trainer script"
    assert [_other_library(study("transformers"), f) for f in ("hf", "args", "yaml")] == \
        [None] * 3
    assert _other_library(study("accelerate"), "hf") == "Accelerate script"
    assert _other_library(study(None), "lightning") is None  # a model file's study
