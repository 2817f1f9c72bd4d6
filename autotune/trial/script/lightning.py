"""Lightning's `Trainer` (`lightning.pytorch` and `pytorch_lightning`) in a script trial: the
trial's knobs applied through the Trainer's own arguments (precision, accumulation), the batch
size and DataLoader settings through the attributes Lightning's own batch-size finder sets
(`lightning_setattr` on the LightningModule, its hparams or the DataModule), torch.compile on
the LightningModule, an AdamW's implementation on the optimizer it built; the script's own
settings read from the same places; its side effects turned off; its own loop measured by a
Callback. Lightning is never imported here: the patch is installed when the script imports it."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch

from autotune.config import knob_names
from autotune.hardware import tf32_matmuls
from autotune.trial.script import lightning_terms
from autotune.trial.script.errors import check_device
from autotune.trial.script.library import Library
from autotune.trial.script.lightning_loop import callback_class
from autotune.trial.script.lightning_terms import (
    LATE_KNOBS,
    LIBRARY,
    PRECISIONS,
    refuse,
    settings,
)
from autotune.trial.script.observer import TrainingDone
from autotune.trial.script.session import ScriptBaseline, ScriptTrial, current
from autotune.trial.script.sources import call_site
from autotune.trial.training import set_matmul_precision

_ALIASES = {"None": "32-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed",
            "64": "64-true"}
# The callbacks that would write, log, evaluate or stop the run on their own.
_DROPPED = ("Checkpoint", "EarlyStopping", "ProgressBar", "LearningRateMonitor",
            "DeviceStatsMonitor", "BatchSizeFinder", "LearningRateFinder", "ModelSummary",
            "Timer")


def patch_trainer(module: ModuleType, library: Library) -> None:
    """`lightning.pytorch.trainer.trainer` (or pytorch_lightning's): Trainer.__init__ takes the
    trial's arguments, and Trainer.fit runs measured and then ends the script."""
    trainer_cls = module.Trainer
    if getattr(trainer_cls, "_autotune_patched", False):
        return
    root = module.__name__.removesuffix(".trainer.trainer")
    callbacks = importlib.import_module(f"{root}.callbacks")
    parsing = importlib.import_module(f"{root}.utilities.parsing")
    dropped = tuple(getattr(callbacks, name) for name in _DROPPED if hasattr(callbacks, name))
    callback_cls = callback_class(callbacks.Callback)
    init, fit = trainer_cls.__init__, trainer_cls.fit
    fit_signature = inspect.signature(fit)

    @functools.wraps(init)
    def patched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        if trial is None or trial.training:
            init(self, *args, **kwargs)
            return
        trial.library = library  # its optimizer and DataLoaders are its LightningModule's
        baseline = _read_trainer(kwargs)
        site = call_site(sys._getframe(1), self)
        if site is not None:  # where the script says the Trainer's arguments
            baseline.said("Trainer", "", site.code(trial.folder))
            for name in baseline.settings["Trainer"]:
                if site.passes(name):
                    baseline.said("Trainer", name, site.source(name, trial.flags, trial.folder))
        refuse(trial, baseline, [k for k in knob_names() if k not in LATE_KNOBS])
        if trial.config is not None:
            kwargs.update(settings(trial.config, baseline)["Trainer"])
        callback = callback_cls(trial, baseline, parsing)
        init(self, *args, **_quiet(trial, kwargs, dropped, callback))
        device = self.strategy.root_device
        check_device(trial.script, device, trial.device,
                     "the script's Trainer(accelerator=...) decides")
        self._autotune_trial = (baseline, callback)

    @functools.wraps(fit)
    def patched_fit(self: Any, *args: Any, **kwargs: Any) -> None:
        trial = current()
        prepared = getattr(self, "_autotune_trial", None)
        if trial is None or trial.training or prepared is None:
            fit(self, *args, **kwargs)
            return
        baseline, callback = prepared
        callback.startup_s = trial.training_called()
        trial.baseline = baseline
        bound = fit_signature.bind(self, *args, **kwargs)
        bound.arguments.pop("ckpt_path", None)  # a trial never loads the user's checkpoint
        bound.arguments["model"] = _compiled(trial, baseline, bound.arguments["model"],
                                             self.strategy.root_device)
        fit(*bound.args, **bound.kwargs)
        trial.observer.on_train_end()
        raise TrainingDone

    trainer_cls.__init__, trainer_cls.fit = patched_init, patched_fit
    trainer_cls._autotune_patched = True


def _read_trainer(kwargs: Mapping[str, Any]) -> ScriptBaseline:
    """The script's own precision and accumulation, from the Trainer's arguments."""
    baseline = ScriptBaseline(LIBRARY)
    precision = str(kwargs.get("precision"))
    precision = _ALIASES.get(precision, precision)
    accumulation = kwargs.get("accumulate_grad_batches", 1)
    if precision in PRECISIONS:
        baseline.knobs["precision"] = PRECISIONS[precision]
    else:
        baseline.fixed["precision"] = (
            f"the script's precision {precision!r} is none of autotune's (32-true, "
            "bf16-mixed, 16-mixed: fp32 weights, with or without mixed precision)")
    baseline.knobs["grad_accum_steps"] = accumulation
    baseline.settings["Trainer"] = {"precision": precision,
                                    "accumulate_grad_batches": accumulation}
    return baseline


def _quiet(trial: ScriptTrial, kwargs: dict[str, Any], dropped: tuple[type, ...],
           callback: Any) -> dict[str, Any]:
    """The Trainer's arguments with nothing written, logged or evaluated, no sanity check, no
    end but the observer's, on the trial's device, and the observer's callback added."""
    own = kwargs.get("callbacks") or []
    own = [own] if not isinstance(own, list) else own
    out = {**kwargs, "logger": False, "enable_checkpointing": False,
           "default_root_dir": str(trial.scratch_dir / "lightning"), "num_sanity_val_steps": 0,
           "limit_val_batches": 0, "enable_progress_bar": False, "enable_model_summary": False,
           "max_steps": max(kwargs.get("max_steps", -1), trial.max_steps), "max_epochs": -1,
           "min_epochs": None, "min_steps": None, "max_time": None, "fast_dev_run": False,
           "callbacks": [*(c for c in own if not isinstance(c, dropped)), callback]}
    if kwargs.get("accelerator", "auto") == "auto":
        out["accelerator"] = "gpu" if trial.device.type == "cuda" else trial.device.type
    if kwargs.get("devices", "auto") == "auto":
        # one process: one device, never every GPU it can see; a rank of a process group: the
        # group's ranks on this node (Lightning's "auto" on CPU is one device, with which each
        # rank would train alone, unsharded, never syncing its gradients)
        out["devices"] = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) \
            if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 1
    return out


def _compiled(trial: ScriptTrial, baseline: ScriptBaseline, model: Any,
              device: torch.device) -> Any:
    """The LightningModule to fit: its forward compiled where the trial asks
    (`lightning_terms.COMPILED_FORWARD`); the script's own compile and TF32 setting read first,
    TF32 set as asked."""
    compiled = hasattr(model, "_orig_mod")  # torch.compile's OptimizedModule
    baseline.knobs["compile_mode"] = "default" if compiled else "none"
    if compiled:
        baseline.fixed["compile_mode"] = ("the script compiles its LightningModule itself "
                                          "(torch.compile), with options autotune cannot read")
    if device.type == "cuda" and baseline.knobs.get("precision") == "fp32" and tf32_matmuls():
        baseline.knobs["precision"] = "tf32"
    config = trial.config
    if config is None:
        return model
    refuse(trial, baseline, ["compile_mode"])
    if "precision" not in baseline.fixed:
        set_matmul_precision(config.precision, device)
    if config.compile_mode == "none" or compiled:
        return model
    # Its forward, not the whole module: Lightning runs training_step through a compiled
    # module's forward, and dynamo fails on the `self.log` in it (torch 2.13, Lightning 2.6).
    model.forward = torch.compile(model.forward, mode=None if config.compile_mode == "default"
                                  else config.compile_mode)
    return model


LIGHTNING = Library(
    LIBRARY, "lightning Trainer", "Lightning Trainer script", "lightning",
    {"lightning.pytorch.trainer.trainer": patch_trainer,
     "pytorch_lightning.trainer.trainer": patch_trainer},
    lightning_terms.unexpressed, lightning_terms.changes)
