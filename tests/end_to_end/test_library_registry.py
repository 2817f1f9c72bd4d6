"""A fifth training library added from outside autotune through the registry alone: a tiny
trainer written here, its adapter (one module that registers a `Library`), and a script that
trains with it, tuned end to end as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import CONFIRM_ONCE, FAST, NO_COMPILE, ROOT

pytestmark = pytest.mark.slow

# The library: a trainer whose loop is its own, with a callback after each optimizer step.
TOY_TRAINER = '''
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, model, dataset, batch_size=8, lr=0.01, epochs=1):
        self.model, self.dataset, self.batch_size = model, dataset, batch_size
        self.lr, self.epochs = lr, epochs

    def on_step(self, batch, loss):
        pass

    def fit(self):
        loader = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(self.model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                self.on_step(x, loss)
'''

# Its adapter: the hook that recognises its loop and measures it, its terms (it can be told
# its batch size only), and the one line that registers it.
TOY_ADAPTER = '''
import functools

from autotune.config import knob_names
from autotune.trial.protocol import LeftOut
from autotune.trial.script.libraries import register
from autotune.trial.script.library import Library
from autotune.trial.script.observer import StepTally, TrainInfo, TrainingDone
from autotune.trial.script.session import ScriptBaseline, current

NAME = "toytrainer"
ONLY = "the toy Trainer is told its batch size only"


class _Stop(BaseException):
    pass


def patch(module, library):
    fit = module.Trainer.fit

    @functools.wraps(fit)
    def patched_fit(self):
        trial = current()
        if trial is None or trial.training:
            return fit(self)
        trial.library = library
        own = {"batch_size": self.batch_size}
        baseline = ScriptBaseline(NAME, knobs={"micro_batch_size": self.batch_size},
                                  fixed={k: ONLY for k in knob_names() if k != "micro_batch_size"},
                                  settings={"Trainer": dict(own)})
        if trial.config is not None:
            self.batch_size = trial.config.micro_batch_size
        startup_s = trial.training_called()
        trial.baseline, trial.settings = baseline, {"Trainer": {"batch_size": self.batch_size}}
        tally = StepTally()

        def on_step(batch, loss):
            tally.add_batch(batch, 0.0)
            tally.add_loss(loss)
            trial.steps += 1
            if tally.report(trial.observer):
                trial.stopped_by_observer = True
                raise _Stop

        self.on_step, self.epochs = on_step, 10**6
        trial.observer.on_train_start(TrainInfo(
            NAME, trial.device, self.model, None, self.batch_size, 1, startup_s,
            trial.settings, len(self.dataset), dataset=self.dataset))
        try:
            fit(self)
        except _Stop:
            pass
        trial.observer.on_train_end()
        raise TrainingDone

    module.Trainer.fit = patched_fit


def unexpressed(config, baseline, device_type, world_size=1):
    own = baseline.config(device_type, world_size).to_dict()
    return [LeftOut(knob, value, ONLY) for knob, value in config.to_dict().items()
            if knob != "micro_batch_size" and value != own[knob]]


def changes(config, baseline, device_type, world_size=1):
    size = config.micro_batch_size
    return {} if size == baseline.knobs["micro_batch_size"] else {"Trainer": {"batch_size": size}}


register(Library(NAME, "toy Trainer", "toy Trainer script", None, {"toytrainer": patch},
                 unexpressed, changes))
'''

SCRIPT = '''
import argparse

import torch
from toytrainer import Trainer

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()
torch.manual_seed(0)
features, targets = torch.randn(4096, 64), torch.randn(4096, 1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
Trainer(model, torch.utils.data.TensorDataset(features, targets), batch_size=args.batch_size).fit()
'''


def test_a_library_registered_from_outside_is_tuned_end_to_end(tmp_path: Path) -> None:
    """The script's loop is the toy Trainer's, not a hand-written one: its baseline is read
    by the adapter (batch size 8), every other knob is left out with the adapter's reason,
    the micro-batch is searched, and the answer is said in the trainer's terms."""
    (tmp_path / "toytrainer.py").write_text(TOY_TRAINER)
    (tmp_path / "toy_autotune.py").write_text(TOY_ADAPTER)
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "AUTOTUNE_LIBRARIES": "toy_autotune",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "run", "--script", "train.py", "--device", "cpu",
         "--trials", "3", "--studies-dir", str(tmp_path / "studies"), *NO_COMPILE, *FAST,
         *CONFIRM_ONCE, "--json", "--", "--batch-size", "8"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["baseline_config"]["micro_batch_size"] == 8
    assert "the toy Trainer is told its batch size only" in done.stderr
    best, size = summary["best_config"], summary["best_config"]["micro_batch_size"]
    assert {k: v for k, v in best.items() if k != "micro_batch_size"} == \
        {k: v for k, v in summary["baseline_config"].items() if k != "micro_batch_size"}
    assert summary["script_answer"]["library"] == "toytrainer"
    assert summary["script_answer"]["changes"] == \
        ({} if size == 8 else {"Trainer": {"batch_size": size}})
