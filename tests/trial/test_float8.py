"""float8 training's GPU-only path run dry on CPU: which layers torchao converts, and that the
converted model trains (torchao's emulation: float8 casts and scales, matmuls in higher
precision). The real float8 matmuls need a GPU of compute capability 8.9+ (gpu_suite)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.config import TrainConfig
from autotune.trial.float8 import convert_to_float8
from autotune.trial.training import Unsupported, setup_training

pytest.importorskip("torchao")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1024), nn.GELU(),
                         nn.Linear(1024, 1032), nn.GELU(), nn.Linear(1032, 8))


def loss(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return net(x).float().pow(2).mean()


@pytest.mark.parametrize("precision", ["fp8_tensorwise", "fp8_rowwise"])
def test_the_large_linears_train_in_float8_and_the_small_ones_stay(precision):
    reference, converted = model(), model()
    assert convert_to_float8(converted, precision, emulate=True) == 2
    kinds = [type(m).__name__ for m in converted if not isinstance(m, nn.GELU)]
    # both sides >= 1024 and divisible by 16; 1032 outputs are not, the 8-wide head is small
    assert kinds == ["Float8Linear", "Float8Linear", "Linear", "Linear"]
    x = torch.randn(32, 1024)
    expected, got = loss(reference, x), loss(converted, x)
    got.backward()
    # float8's rounding moves the loss a little, never far
    assert torch.isfinite(got) and abs(float(got) / float(expected) - 1) < 0.1
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in converted.parameters())


def test_a_model_with_no_large_linear_converts_nothing():
    small = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    assert convert_to_float8(small, "fp8_rowwise", emulate=True) == 0
    assert [type(m) for m in small] == [nn.Linear, nn.Linear]


def test_float8_is_refused_on_cpu_with_its_reason():
    data = TensorDataset(torch.randn(16, 1024), torch.randn(16, 8))
    config = TrainConfig(micro_batch_size=8, precision="fp8_rowwise", compile_mode="default")
    with pytest.raises(Unsupported, match="compute capability 8.9"):
        setup_training(model(), data, config, "cpu")
