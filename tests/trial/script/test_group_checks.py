"""A training script's checks in a process group of two gloo ranks, as torchrun starts a
study's trial: every rank's micro-batch made of the largest samples and the group's peak its
largest rank's; a loss run's ranks stopping together after the steps asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.config import from_baseline
from autotune.search.isolation import run_isolated
from autotune.target import Script
from autotune.trial.protocol import (
    JobSettings,
    LossRunSettings,
    ProbeReport,
    ProbeSettings,
    TrialRequest,
    TrialResult,
    TrialStatus,
    WorstBatchSettings,
)
from autotune.trial.script.job import script_job
from tests.conftest import need
from tests.trial.script.steps import SCRIPTS

RANKS = 2


def _probed(target: Script) -> ProbeReport:
    probe = TrialRequest(target, config={}, device="cpu", settings=ProbeSettings({}))
    _, report = script_job(probe, target, torch.device("cpu"), 1, lambda phase: None)
    assert isinstance(report, ProbeReport)
    return report


def _group(target: Script, report: ProbeReport, settings: JobSettings) -> TrialResult:
    config = from_baseline(report.baseline, "cpu", RANKS)
    result = run_isolated(TrialRequest(target, config=config.to_dict(), device="cpu",
                                       nproc_per_node=RANKS, settings=settings,
                                       script_baseline=report.script_baseline), 300)
    assert result.status == TrialStatus.OK, result.message
    return result


@pytest.mark.slow
def test_a_loops_worst_batch_in_a_process_group_is_the_largest_samples_on_every_rank() -> None:
    target = Script(str(SCRIPTS / "loop_rare_long.py"), ())
    report = _probed(target)
    assert report.sizes is not None
    settings = WorstBatchSettings(report.sizes.worst_indices(8), 4_000, steps=2, steady=1,
                                  max_steps=3)
    found = _group(target, report, settings).worst_batch
    assert found is not None and found.samples == 8 and 2 <= found.steps <= 3
    assert found.peak_memory_bytes > 0 and found.loss_finite


@pytest.mark.slow
def test_a_trainer_scripts_loss_run_in_a_process_group_stops_its_ranks_together(
        tmp_path: Path) -> None:
    need("transformers", "examples")
    target = Script(str(SCRIPTS / "hf_argparser.py"),
                    ("--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "4"))
    report = _probed(target)
    first = _group(target, report, LossRunSettings(0, 12)).loss_run
    again = _group(target, report, LossRunSettings(0, 12)).loss_run
    assert first is not None and again is not None
    assert first.steps == again.steps == 12 and first.finite
    assert first.final_loss == again.final_loss


@pytest.mark.slow
def test_a_lightning_scripts_ranks_train_as_one_group_not_each_alone(tmp_path: Path) -> None:
    """Lightning's CPU "auto" is one device: left so, each rank of a group trains alone, on
    all the data, and learns exactly as one process does. The trial gives it the group's
    devices, so its ranks shard the data and sync: the group's loss run is not one process's."""
    need("lightning", "examples")
    target = Script(str(SCRIPTS / "lightning_rare_long.py"), ("--root", str(tmp_path / "r")))
    report = _probed(target)
    settings = LossRunSettings(0, 12)
    group = _group(target, report, settings).loss_run
    request = TrialRequest(target, config=from_baseline(report.baseline, "cpu").to_dict(),
                           device="cpu", settings=settings,
                           script_baseline=report.script_baseline)
    _, alone = script_job(request, target, torch.device("cpu"), 1, lambda phase: None)
    assert group is not None and group.steps == 12 == alone.steps
    assert group.final_loss != alone.final_loss
