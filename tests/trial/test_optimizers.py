"""The optimizer a configuration names: AdamW's implementations, and the memory-saving
optimizers built over the model file's own parameter groups and learning rates."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.config import TrainConfig
from autotune.trial.optimizers import make_optimizer
from autotune.trial.training import setup_training

pytest.importorskip("bitsandbytes")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))


def two_groups(params, **flags) -> torch.optim.Optimizer:
    """A model file's optimizer: no weight decay on biases, its own learning rate."""
    params = list(params)
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim > 1],
                               "weight_decay": 0.1},
                              {"params": [p for p in params if p.ndim == 1],
                               "weight_decay": 0.0}], lr=2e-3, **flags)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


def one_step(net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    net(torch.randn(16, 256)).pow(2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize(("name", "kind"), [("adafactor", "Adafactor"),
                                             ("adamw_8bit", "AdamW8bit")])
def test_a_memory_saving_optimizer_keeps_the_files_groups_and_less_state(name, kind):
    net = model()
    optimizer = make_optimizer(net, TrainConfig(optimizer=name), two_groups)
    assert type(optimizer).__name__ == kind
    # the file's learning rate and weight decay per group, over the same parameters
    assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == \
        [(2e-3, 0.1, 2), (2e-3, 0.0, 2)]
    before = [p.detach().clone() for p in net.parameters()]
    one_step(net, optimizer)
    assert all(not torch.equal(b, p) for b, p in zip(before, net.parameters()))

    reference = model()
    adamw = make_optimizer(reference, TrainConfig(), two_groups)
    one_step(reference, adamw)
    # AdamW keeps two fp32 moments per weight; these keep factors or 8-bit moments
    assert state_bytes(optimizer) < 0.5 * state_bytes(adamw)


def test_a_study_trains_with_the_optimizer_it_names():
    data = TensorDataset(torch.randn(64, 256), torch.randn(64, 1))
    setup = setup_training(model(), data, TrainConfig(micro_batch_size=8, optimizer="adafactor"),
                           "cpu", loss_fn=lambda m, b: (m(b[0]) - b[1]).pow(2).mean())
    assert isinstance(setup.optimizer, torch.optim.Adafactor)
    batches = setup.batches()
    losses = [float(setup.step(batches).loss) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
