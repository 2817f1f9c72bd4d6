"""A loss run: fixed weights, fixed batches whatever the split into micro-batches, the loss read
on the same samples; and the worst batch's run, on the largest samples only."""

from __future__ import annotations

import pytest
import torch

from autotune.config import TrainConfig
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile
from autotune.trial.loss_run import held_indices, loss_run_job, rank_order, step_order
from autotune.trial.protocol import (
    LossRunSettings,
    TrialRequest,
    TrialResult,
    TrialStatus,
    WorstBatchSettings,
)
from autotune.trial.workload import load_workload
from autotune.trial.worst_batch import worst_batch_job

from ..conftest import TINY_SOURCE

CPU = torch.device("cpu")


def test_a_step_takes_the_same_samples_however_it_is_split_and_each_seed_its_own() -> None:
    order = step_order(100, 32, 5, seed=3)
    assert len(order) == 5 * 32
    steps = [order[i:i + 32] for i in range(0, len(order), 32)]
    assert all(len(set(step)) == 32 for step in steps)
    assert set(steps[0]) | set(steps[1]) | set(steps[2]) == set(order[:96])  # one epoch
    assert step_order(100, 32, 5, seed=3) == order
    assert step_order(100, 32, 5, seed=4) != order


def test_a_ranks_share_of_a_groups_step_is_its_own_slice_of_it() -> None:
    whole = step_order(100, 16, 3, seed=2)
    shares = [rank_order(100, 8, 3, seed=2, rank=r, ranks=2) for r in range(2)]
    assert shares[0][:8] + shares[1][:8] == whole[:16]
    assert sorted(shares[0] + shares[1]) == sorted(whole)


def test_the_loss_is_read_on_the_same_samples_in_every_run_of_one_effective_batch() -> None:
    held = held_indices(1000, 64)
    assert len(held) == 256 and held == held_indices(1000, 64)
    assert len(held_indices(1000, 100)) == 300  # whole steps, so whole micro-batches
    assert len(held_indices(100, 64)) == 64  # one step, where the dataset holds fewer


def test_a_loss_run_is_the_same_for_the_same_seed_and_split_and_learns(write_model) -> None:
    workload = load_workload(write_model(TINY_SOURCE))
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    first = loss_run_job(workload, config, CPU, LossRunSettings(0, 30), None, lambda p: None)
    again = loss_run_job(workload, config, CPU, LossRunSettings(0, 30), None, lambda p: None)
    split = loss_run_job(workload, config.replace(micro_batch_size=16, grad_accum_steps=1), CPU,
                         LossRunSettings(0, 30), None, lambda p: None)
    other = loss_run_job(workload, config, CPU, LossRunSettings(1, 30), None, lambda p: None)
    assert first.finite and first.steps == 30
    assert first.final_loss < first.initial_loss
    assert again.final_loss == first.final_loss and again.initial_loss == first.initial_loss
    assert abs(split.final_loss - first.final_loss) <= 1e-4 * abs(first.final_loss)
    assert other.initial_loss != first.initial_loss  # other weights


def test_the_worst_batch_trains_on_the_largest_samples_only(write_model) -> None:
    workload = load_workload(write_model(TINY_SOURCE))
    found = worst_batch_job(workload, TrainConfig(micro_batch_size=4, grad_accum_steps=2), CPU,
                            WorstBatchSettings((7, 3, 3, 1), 256, steps=2, steady=3, max_steps=12),
                            None, lambda p: None)
    assert found.samples == 4 and 4 <= found.steps <= 12 and found.loss_finite
    assert found.peak_memory_bytes > 0


def _group(path, config: TrainConfig, settings) -> TrialResult:
    """The job as two ranks of a gloo process group, as torchrun starts a study's trial."""
    result = run_isolated(TrialRequest(ModelFile(str(path)), device="cpu", nproc_per_node=2,
                                       config=config.to_dict(), settings=settings), 180)
    assert result.status == TrialStatus.OK, result.message
    return result


@pytest.mark.slow
def test_a_process_groups_loss_run_learns_as_one_process_at_the_groups_step(
        write_model) -> None:
    """Each rank takes its own share of the group's step: two DDP ranks of 8 samples a step
    learn as one process of 8 x 2 accumulated, from the same weights, on the same samples."""
    path = write_model(TINY_SOURCE)
    settings = LossRunSettings(0, 20)
    group = _group(path, TrainConfig(micro_batch_size=8, parallelism="ddp"), settings).loss_run
    alone = loss_run_job(load_workload(path), TrainConfig(micro_batch_size=8, grad_accum_steps=2),
                         CPU, settings, None, lambda p: None)
    assert group is not None and group.steps == 20 and group.finite
    assert group.initial_loss == pytest.approx(alone.initial_loss, rel=1e-5)
    assert group.final_loss == pytest.approx(alone.final_loss, rel=1e-4)


@pytest.mark.slow
def test_a_process_groups_worst_batch_gives_every_rank_the_largest_samples(write_model) -> None:
    """Every rank trains on the largest samples, and the ranks stop together (rank 0 decides
    when the peak is steady: a rank left stepping alone would hang its peers' collectives)."""
    found = _group(write_model(TINY_SOURCE), TrainConfig(micro_batch_size=4, parallelism="ddp"),
                   WorstBatchSettings((7, 3, 3, 1), 256, steps=2, steady=3, max_steps=12)
                   ).worst_batch
    assert found is not None and found.samples == 4 and 4 <= found.steps <= 12
    assert found.loss_finite and found.peak_memory_bytes > 0
