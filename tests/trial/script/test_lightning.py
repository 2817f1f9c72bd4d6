"""A Lightning training script run as a trial: its own settings read where Lightning's
batch-size finder reads them, the trial's applied through the Trainer and the DataModule, its
own loop measured and stopped, nothing it would write written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.trial.protocol import ScriptAnswer
from autotune.trial.script.errors import WrongDevice
from autotune.trial.training import Unsupported
from tests.conftest import ROOT, need
from tests.trial.script.steps import SCRIPTS, run

need("lightning", "export-check")


def test_the_baseline_is_read_and_the_run_ends_when_measured(tmp_path: Path) -> None:
    root = tmp_path / "user_root"
    result, observer = run("lightning_datamodule.py", ["--root", str(root)], tmp_path / "s")
    baseline = result.baseline
    assert baseline.knobs["micro_batch_size"] == 16 and baseline.knobs["grad_accum_steps"] == 2
    assert baseline.config("cpu").optimizer_impl == "for_loop"
    assert baseline.settings["Data"] == {"batch_size": 16, "num_workers": 0}
    assert baseline.settings["Trainer"] == {"precision": "32-true",
                                            "accumulate_grad_batches": 2}
    assert "pin_memory" in baseline.fixed and "micro_batch_size" not in baseline.fixed
    # 100 epochs asked for, a checkpoint callback, early stopping and a CSV logger under the
    # root: three steps of two micro-batches each, nothing written, nothing after fit() run
    assert observer.samples == [32, 32, 32] and result.stopped_by_observer and observer.ended
    assert not root.exists()


def test_a_configuration_reaches_the_trainer_and_the_datamodule(tmp_path: Path) -> None:
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=3, optimizer_impl="fused")
    result, observer = run("lightning_datamodule.py", ["--root", str(tmp_path / "r")],
                           tmp_path / "s", config=config)
    assert observer.samples == [24, 24, 24]
    assert observer.info.optimizer.defaults["fused"] is True
    assert observer.autocast == {None}
    assert result.settings["Data"]["batch_size"] == 8
    assert result.settings["torch.optim.AdamW"] == {"foreach": False, "fused": True}


@pytest.mark.slow
def test_a_compiled_trial_compiles_the_forward_of_a_module_that_logs(tmp_path: Path) -> None:
    """The script's training_step calls self.log: compiling the whole LightningModule fails in
    dynamo there (Lightning runs training_step through the compiled module), so the trial
    compiles its forward, and the answer says that line."""
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=1, compile_mode="default")
    result, observer = run("lightning_datamodule.py", ["--root", str(tmp_path / "r")],
                           tmp_path / "s", config=config)
    assert observer.samples == [8, 8, 8]
    assert result.settings["model.forward = torch.compile"] == {"mode": None}
    answer = ScriptAnswer("lightning", {"model.forward = torch.compile": {"mode": None}})
    assert answer.lines() == ["model.forward = torch.compile(model.forward, mode=None)"]


def test_workers_set_through_the_datamodule_leave_the_scripts_own_settings_its_own(
        tmp_path: Path) -> None:
    """The script's DataModule has a num_workers attribute (0) and none for prefetching: a
    trial with a worker gets the DataLoader's default prefetch, which is what it asked, and the
    script's own settings stay without workers (they were once read from the trial's loader,
    an invalid configuration that ended the whole study)."""
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=1, num_workers=1,
                         prefetch_factor=2)
    result, observer = run("lightning_datamodule.py", ["--root", str(tmp_path / "r")],
                           tmp_path / "s", config=config)
    assert observer.samples == [8, 8, 8] and result.settings["Data"]["num_workers"] == 1
    own = result.baseline.config("cpu")
    assert own.num_workers == 0 and own.prefetch_factor is None


def test_pytorch_lightning_scripts_take_mixed_precision(tmp_path: Path) -> None:
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=1, precision="bf16")
    result, observer = run("lightning_datamodule.py", ["--root", str(tmp_path / "r"),
                                                       "--flavour", "pytorch_lightning"],
                           tmp_path / "s", config=config)
    assert observer.samples == [4, 4, 4] and observer.autocast == {torch.bfloat16}
    assert result.settings["Trainer"]["precision"] == "bf16-mixed"


def test_each_measured_step_runs_lightnings_own_gradient_clipping(tmp_path: Path) -> None:
    observer = run("lightning_datamodule.py", ["--root", str(tmp_path / "r")], tmp_path / "s")[1]
    # the script's gradient_clip_val=1e-3, applied by Lightning before each optimizer step
    assert len(observer.grad_norms) == 3 and max(observer.grad_norms) <= 1e-3 * 1.01


LOADER_GIVEN = '''
import lightning.pytorch as pl
import torch
from torch import nn

class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(1), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64))
pl.Trainer(max_epochs=1).fit(Module(), torch.utils.data.DataLoader(data, batch_size=10))
'''


def test_a_batch_size_with_no_attribute_is_read_and_cannot_be_changed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LOADER_GIVEN))
    result, observer = run(script, [], tmp_path / "s")
    baseline = result.baseline
    assert baseline.knobs["micro_batch_size"] == 10 and observer.samples == [10, 10, 10]
    assert "batch_size` attribute" in baseline.fixed["micro_batch_size"]
    assert "SGD" in baseline.fixed["optimizer_impl"]
    with pytest.raises(Unsupported, match="micro_batch_size=4: no `batch_size` attribute"):
        run(script, [], tmp_path / "s2", config=baseline.config("cpu").replace(
            micro_batch_size=4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_script_that_trains_on_another_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WrongDevice, match="trains on cpu, but autotune was asked to measure "
                                          "on cuda"):
        run("lightning_datamodule.py", ["--root", str(tmp_path / "r"), "--accelerator", "cpu"],
            tmp_path / "s", device="cuda")


@pytest.mark.slow
def test_a_lightning_script_never_imports_transformers_trainer(tmp_path: Path) -> None:
    # lightning imports torchmetrics, which imports the top of transformers where it is
    # installed; the hooks import nothing more of it
    code = (f"import sys; from tests.trial.script.steps import run; "
            f"run({str(SCRIPTS / 'lightning_datamodule.py')!r}, ['--root', "
            f"{str(tmp_path / 'r')!r}], __import__('pathlib').Path({str(tmp_path)!r})); "
            "print(sorted(m for m in sys.modules if m in ('transformers.trainer', "
            "'transformers.training_args', 'transformers.hf_argparser', 'lightning.pytorch')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['lightning.pytorch']"


def test_the_answer_names_the_scripts_own_flag_and_the_trainers_line(tmp_path: Path) -> None:
    """The DataModule's batch size comes from `--batch-size` (`Data(options.batch_size)`): the
    trial sets that flag and the answer names it; the Trainer's arguments at its line."""
    from autotune.trial.script.session import ScriptBaseline
    from autotune.trial.script.terms import answer

    argv = ["--root", str(tmp_path / "root"), "--batch-size", "16"]
    probed, _ = run("lightning_datamodule.py", argv, tmp_path / "probe")
    own = ScriptBaseline.from_dict(probed.baseline.to_dict())
    config = own.config("cpu").replace(micro_batch_size=8, grad_accum_steps=4, precision="bf16")
    _, observer = run("lightning_datamodule.py", argv, tmp_path / "s", config=config, own=own)
    assert observer.samples == [32] * 3 and observer.autocast == {torch.bfloat16}
    assert answer(config, own, "cpu").lines() == [
        "--batch-size 8", "lightning_datamodule.py:61: pl.Trainer(..., precision='bf16-mixed', "
        "accumulate_grad_batches=4)"]
    assert not (tmp_path / "root").exists()
