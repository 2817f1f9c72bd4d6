"""Shared helpers: run the real CLI in a subprocess, write throw-away model files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_MODELS = Path(__file__).resolve().parent / "models"
# Short windows: the tests check behaviour, not figures.
FAST = ["--window-steps", "3", "--window-seconds", "0.2", "--warmup-max-seconds", "5",
        "--profile-steps", "1"]

# torch.compile costs ~30 s per model on CI's cores; a cache that outlives the run pays it once.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      str(Path.home() / ".cache" / "autotune-tests" / "inductor"))


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m autotune ARGS` as a user would run it."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def write_model(tmp_path: Path):
    """Write a model file from source text; returns its path."""
    def write(source: str, name: str = "model.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


TINY_SOURCE = '''
import torch
from torch import nn

BASELINE = {"micro_batch_size": 8}


class Net(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))

    def forward(self, x, y):
        for block in self.blocks:
            x = torch.relu(block(x))
        return nn.functional.mse_loss(x.sum(dim=1), y)


def build_model(dim=8):
    return Net(dim)


def build_dataset(dim=8, size=256):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, dim, generator=g),
                                          torch.randn(size, generator=g))
'''
