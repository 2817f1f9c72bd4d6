"""A rank of a process group: the model wrapped as users wrap it, trained exactly as one
process trains it at the same global batch (real torchrun, 2 gloo ranks on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.trial.child import rank_cpus
from autotune.trial.distributed import callable_blocks, gradient_sync
from autotune.trial.training import setup_training

SCRIPT = Path(__file__).with_name("group_losses.py")


def _losses(tmp_path: Path, parallelism: str, accum: int, ranks: int) -> list[float]:
    out = tmp_path / f"{parallelism}-{ranks}.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              f"--nproc-per-node={ranks}"] if ranks > 1 else [sys.executable]
    subprocess.run([*launch, str(SCRIPT), str(out), parallelism, str(accum)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                   timeout=300)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_ranks_train_as_one_process_at_the_same_global_batch(tmp_path, parallelism):
    # accumulation 2: the first micro-step of each optimizer step skips the gradient sync
    alone = _losses(tmp_path, "none", 2, 1)
    group = _losses(tmp_path, parallelism, 2, 2)
    assert len(group) == len(alone) == 4
    assert group == pytest.approx(alone, rel=1e-5, abs=1e-6)
    assert len(set(alone)) == 4  # the weights moved: each step's loss is its own


def test_several_ranks_need_ddp_or_fsdp_and_one_process_needs_neither():
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    with pytest.raises(ConfigError, match="parallelism=ddp cannot train 1 rank"):
        setup_training(nn.Linear(4, 1), data, TrainConfig(micro_batch_size=2,
                                                          parallelism="ddp"), "cpu")


def test_one_process_syncs_nothing_around_a_micro_step():
    model = nn.Linear(4, 1)
    with gradient_sync(model, TrainConfig(grad_accum_steps=2), last=False):
        model(torch.randn(2, 4)).sum().backward()
    assert model.weight.grad is not None


@pytest.mark.parametrize(("cpus", "rank", "ranks", "mine"), [
    ([0, 1], 0, 2, [0]), ([0, 1], 1, 2, [1]),     # a core each
    ([0, 1, 2, 3, 4], 1, 2, [2, 3]),               # an even share, the odd core left over
    ([5], 1, 2, [5]),                              # fewer cores than ranks: shared
])
def test_each_rank_runs_on_its_own_share_of_the_cores(cpus, rank, ranks, mine):
    assert rank_cpus(cpus, rank, ranks) == mine


def test_fsdp_shards_the_called_modules_inside_a_block_that_is_a_container():
    norm, attention, mlp = nn.LayerNorm(4), nn.Linear(4, 4), nn.Linear(4, 4)
    block = nn.ModuleList([nn.ModuleList([norm, None]), attention, nn.ReLU()])
    assert callable_blocks([block, mlp]) == [norm, attention, mlp]
