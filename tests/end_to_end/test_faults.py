"""Trials that crash, hang or are killed: the study records each outcome and goes on."""

from __future__ import annotations

import pytest

from autotune.study.results import load_study

from ..conftest import CONFIRM_ONCE, FAST, run_cli

FAULTY_SOURCE = '''
import ctypes
import os
import signal
import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 2}


def build_model():
    return nn.Linear(4, 1)


def build_dataset():
    return torch.utils.data.TensorDataset(torch.randn(240, 4), torch.randn(240, 1))


def loss_fn(model, batch):
    x, y = batch
    if len(x) == 3:
        ctypes.string_at(0)  # segfault
    if len(x) == 5:
        time.sleep(3600)  # hang
    if len(x) == 6:
        os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer does
    return nn.functional.mse_loss(model(x), y)
'''


@pytest.mark.slow
def test_a_study_survives_crashing_hanging_and_killed_trials(write_model, tmp_path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [2, 3, 5, 6]\n")
    fixed = ["grad_accum_steps=1", "precision=fp32", "activation_checkpointing=none",
             "optimizer_impl=for_loop", "num_workers=0", "compile_mode=none"]
    done = run_cli("run", "--model", str(write_model(FAULTY_SOURCE, "faulty.py")), "--device",
                   "cpu", "--studies-dir", str(tmp_path), "--space", str(space),
                   "--free-batch-size", "1:64", *[a for k in fixed for a in ("--fix", k)],
                   *FAST, "--trials", "4", "--trial-time-limit", "8", *CONFIRM_ONCE,
                   "--seed", "0", timeout=600)
    assert done.returncode == 0, done.stderr
    trials = load_study("faulty", tmp_path).get_trials(deepcopy=False)
    by_size = {t.user_attrs["config"]["micro_batch_size"]: t for t in trials
               if "duplicate_of" not in t.user_attrs and t.user_attrs.get("status") != "skipped"}
    assert by_size[2].user_attrs["status"] == "ok"
    assert by_size[3].user_attrs["status"] == "crash"
    assert "SIGSEGV" in by_size[3].user_attrs["message"]
    assert by_size[5].user_attrs["status"] == "timeout"
    assert by_size[6].user_attrs["status"] == "crash"
    assert "SIGKILL" in by_size[6].user_attrs["message"]
    summary = run_cli("show", "faulty", "--studies-dir", str(tmp_path), "--json")
    assert '"micro_batch_size": 2' in summary.stdout
