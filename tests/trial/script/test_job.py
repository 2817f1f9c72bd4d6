"""A script trial's job, in this process: the probe reads the script's own settings as the
baseline, and a measurement answers with the configuration in the script's own terms."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.target import Script
from autotune.trial.protocol import (
    SCANNED,
    JobSettings,
    LossRun,
    LossRunSettings,
    Measurement,
    ProbeReport,
    ProbeSettings,
    ProfileReport,
    ProfileSettings,
    TrialRequest,
    TrialStatus,
    WorstBatch,
    WorstBatchSettings,
)
from autotune.trial.script.job import script_job
from tests.conftest import need
from tests.trial.script.steps import SCRIPTS

FAST = MeasureSettings(window_steps=2, window_seconds=0.0, window_max_seconds=1.0,
                       warmup_max_seconds=1.0, screen_steps=0, profile_steps=0)


def _request(out: Path, settings: JobSettings, config: dict | None = None) -> TrialRequest:
    return TrialRequest(Script(str(SCRIPTS / "hf_argparser.py"),
                               ("--output_dir", str(out), "--per_device_train_batch_size", "4")),
                        config=config or {}, device="cpu", settings=settings)


def test_the_probe_reads_the_scripts_own_settings(tmp_path: Path) -> None:
    need("transformers", "examples")
    candidates = {"memory_format": ["channels_last"], "precision": ["bf16"]}
    request = _request(tmp_path / "out", ProbeSettings(candidates))
    config, report = script_job(request, request.target, torch.device("cpu"), 1,
                                lambda phase: None)
    assert isinstance(report, ProbeReport)
    assert report.baseline["micro_batch_size"] == 4 == config.micro_batch_size
    assert report.dataset_size == 64 and report.parameters > 0 and report.state_bytes > 0
    assert [item.describe().split(":")[0] for item in report.left_out] == \
        ["memory_format=channels_last"]
    assert not (tmp_path / "out").exists()


def _rare_long(out: Path, settings: JobSettings, config: dict | None = None) -> TrialRequest:
    return TrialRequest(Script(str(SCRIPTS / "hf_rare_long.py"), ("--out", str(out))),
                        config=config or {}, device="cpu", settings=settings)


def test_the_probe_sizes_a_hugging_face_scripts_samples_through_its_own_collator(
        tmp_path: Path) -> None:
    """8,000 sequences of 16 to 48 tokens and one of 768, padded by the script's own
    collator: the probe reads them all and finds the long one first."""
    need("transformers", "examples")
    request = _rare_long(tmp_path / "out", ProbeSettings({}))
    _, report = script_job(request, request.target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(report, ProbeReport) and report.sizes is not None
    sizes = report.sizes
    assert sizes.how == SCANNED and sizes.seen == sizes.total == 8_000
    assert sizes.largest[0] == 5_311  # the script's LONG_AT
    assert sizes.largest_bytes[0] > 20 * sizes.median_bytes


def test_a_hugging_face_scripts_worst_batch_trains_on_its_largest_samples_only(
        tmp_path: Path) -> None:
    """The worst batch's job runs the script with its training data cut to the samples asked
    for (the observer refuses a run whose data was not cut), until its peak is steady."""
    need("transformers", "examples")
    settings = WorstBatchSettings((5_311, 0, 1, 2), 8_000, steps=2, steady=1, max_steps=4)
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=2)
    request = _rare_long(tmp_path / "out", settings, config.to_dict())
    ran, found = script_job(request, request.target, torch.device("cpu"), 1, lambda phase: None)
    assert ran == config and isinstance(found, WorstBatch)
    assert found.samples == 4 and 2 <= found.steps <= 4 and found.loss_finite
    assert found.peak_memory_bytes > 0


def test_a_hand_written_loops_worst_batch_is_sized_and_cut_at_its_training_loader(
        tmp_path: Path) -> None:
    """A loop's training DataLoader (4,000 sequences, one of 2,048 tokens, padded by its own
    collate function) is sized by the probe; its worst batch cuts that loader's dataset to the
    largest samples as the script builds it, and leaves its held-out loader (200) alone."""
    probe = TrialRequest(Script(str(SCRIPTS / "loop_rare_long.py"), ()), config={},
                         device="cpu", settings=ProbeSettings({}))
    _, report = script_job(probe, probe.target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(report, ProbeReport) and report.sizes is not None
    assert report.sizes.total == 4_000 and report.sizes.largest[0] == 2_903
    settings = WorstBatchSettings(report.sizes.worst_indices(8), 4_000, steps=2, steady=1,
                                  max_steps=3)
    worst = TrialRequest(Script(str(SCRIPTS / "loop_rare_long.py"), ()),
                         config=TrainConfig(micro_batch_size=8).to_dict(), device="cpu",
                         settings=settings, script_baseline=report.script_baseline)
    _, found = script_job(worst, worst.target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(found, WorstBatch) and found.samples == 8 and 2 <= found.steps <= 3


def test_a_measurement_answers_in_the_scripts_flags(tmp_path: Path) -> None:
    need("transformers", "examples")
    config = TrainConfig(micro_batch_size=8, precision="bf16", optimizer_impl="fused")
    request = _request(tmp_path / "out", FAST, config.to_dict())
    ran, figures = script_job(request, request.target, torch.device("cpu"), 1,
                              lambda phase: None)
    assert isinstance(figures, Measurement) and ran == config
    assert figures.window_steps >= 2 and figures.samples_per_sec > 0 and figures.setup_s > 0
    answer = figures.script_answer
    assert answer is not None and answer.on_command_line
    # transformers 5 defaults to the fused AdamW from torch 2.8 on: before, the answer says it
    from transformers import TrainingArguments

    default = TrainingArguments(output_dir=str(tmp_path / "default"), use_cpu=True).optim
    optim = [] if default == "adamw_torch_fused" else ["--optim", "adamw_torch_fused"]
    assert answer.flags() == ["--per_device_train_batch_size", "8", "--bf16", *optim]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_profile_looks_at_the_scripts_own_steps(tmp_path: Path) -> None:
    """`autotune profile --script`: a few of the Trainer's own steps under the profiler, with
    the operator tables, the memory timeline and the trace; the user's output_dir untouched."""
    need("transformers", "examples")
    request = _request(tmp_path / "out", ProfileSettings(out=str(tmp_path / "profile"),
                                                         steps=2, top=5,
                                                         warmup_max_seconds=1.0))
    ran, report = script_job(request, request.target, torch.device("cpu"), 1,
                             lambda phase: None)
    assert isinstance(report, ProfileReport) and report.steps == 2
    assert ran.micro_batch_size == 4 == report.config.micro_batch_size
    assert report.samples_per_sec > 0 and report.window_s > 0
    assert report.tables and all(len(rows) <= 5 for rows in report.tables.values())
    times, categories = report.memory_timeline
    assert times and categories
    assert Path(report.files["trace"]).is_file()
    # its warm-up traced for the lines that read tensors back: the Trainer's own (a branch on
    # a tensor in its epoch loop) are not the user's
    assert not any("site-packages" in where for f in report.findings for where in f.where)
    assert not (tmp_path / "out").exists()


LOGGING_LOOP = """
import torch
from torch import nn

from checks import check_finite

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(100000):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    running_loss = loss.item()
    check_finite(loss)
"""
CHECKS = """
def check_finite(loss):
    if not loss.isfinite():
        raise RuntimeError("the loss diverged")
"""


def test_a_trials_findings_name_the_scripts_own_lines_that_read_tensors_back(
        tmp_path: Path) -> None:
    """A hand-written loop's trial traces a step of its warm-up for the lines that read a
    tensor back to the host: its findings name the script's line and its own module's (the
    script run from its scratch folder), each once a step; torch's own reads (the optimizer's)
    are not the user's."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(LOGGING_LOOP)
    (folder / "checks.py").write_text(CHECKS)
    request = TrialRequest(Script(str(folder / "train.py")), config={"micro_batch_size": 16},
                           device="cpu", settings=replace(FAST, profile_steps=1))
    _, figures = script_job(request, request.target, torch.device("cpu"), 1,
                            lambda phase: None)
    syncs = [f for f in figures.findings if f.kind == "host_sync"]
    assert [f.title for f in syncs] == ["2 host syncs per step from your code"]
    checks, train = (os.path.relpath(folder / name) for name in ("checks.py", "train.py"))
    assert sorted(syncs[0].where) == [
        f"{checks}:3 in check_finite: if not loss.isfinite():  "
        "(bool(tensor) / if tensor, 1 per step)",
        f"{train}:14 in <module>: running_loss = loss.item()  (.item(), 1 per step)"]
    assert figures.phases.sync_tracing_s > 0


def test_knobs_the_library_refuses_together_end_the_trial_not_the_study(tmp_path: Path) -> None:
    """A configuration error inside a script's trial is that trial's outcome (unsupported), so
    the study goes on; in the probe it is the script's own settings, the user's to fix."""
    from autotune.trial.child import _run_job

    need("transformers", "examples")
    refused = {"micro_batch_size": 4, "num_workers": 0, "prefetch_factor": 4}
    result = _run_job(_request(tmp_path / "out", FAST, refused), lambda phase: None)
    assert result.status == TrialStatus.UNSUPPORTED and not result.bad_input, result
    assert "prefetch_factor" in result.message


def _loss_run(out: Path, seed: int, config: TrainConfig) -> LossRun:
    request = _request(out, LossRunSettings(seed, steps=12), config.to_dict())
    ran, found = script_job(request, request.target, torch.device("cpu"), 1, lambda phase: None)
    assert ran == config and isinstance(found, LossRun)
    return found


def test_a_scripts_loss_runs_of_one_seed_take_the_same_batches_and_another_seed_others(
        tmp_path: Path) -> None:
    """A loss run of a Trainer script stops after the steps asked for and reads its training
    loss: two runs of one seed learn alike to the last bit (the Trainer seeded with it: the
    same batches and dropout), another seed does not, and bf16 lands close by."""
    need("transformers", "examples")
    fp32 = TrainConfig(micro_batch_size=4)
    first, again = _loss_run(tmp_path / "a", 0, fp32), _loss_run(tmp_path / "b", 0, fp32)
    other = _loss_run(tmp_path / "c", 1, fp32)
    bf16 = _loss_run(tmp_path / "d", 0, fp32.replace(precision="bf16"))
    assert first.steps == again.steps == other.steps == bf16.steps == 12
    assert first.final_loss == again.final_loss and first.initial_loss == again.initial_loss
    assert other.final_loss != first.final_loss
    assert bf16.finite and abs(bf16.final_loss - first.final_loss) < 0.1 * first.final_loss
    assert not (tmp_path / "a").exists()


def test_a_lightning_scripts_samples_are_sized_and_its_worst_batch_cut_in_its_datamodule(
        tmp_path: Path) -> None:
    """A Lightning DataModule's training DataLoader (4,000 sequences, one of 2,048 tokens,
    padded by its own collate function) is sized by the probe; the worst batch cuts the dataset
    of the DataLoader its train_dataloader() builds inside fit to the largest samples."""
    need("lightning", "examples")
    target = Script(str(SCRIPTS / "lightning_rare_long.py"), ("--root", str(tmp_path / "r")))
    probe = TrialRequest(target, config={}, device="cpu", settings=ProbeSettings({}))
    _, report = script_job(probe, target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(report, ProbeReport) and report.sizes is not None
    assert report.sizes.total == 4_000 and report.sizes.largest[0] == 1_207
    settings = WorstBatchSettings(report.sizes.worst_indices(8), 4_000, steps=2, steady=1,
                                  max_steps=3)
    worst = TrialRequest(target, config=TrainConfig(micro_batch_size=8).to_dict(),
                         device="cpu", settings=settings, script_baseline=report.script_baseline)
    _, found = script_job(worst, target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(found, WorstBatch) and found.samples == 8 and 2 <= found.steps <= 3
    assert not (tmp_path / "r").exists()
