"""Inside Lightning's `Trainer.fit` in a script trial, through a Callback: the batch size and
DataLoader settings set where Lightning's batch-size finder sets them (before the DataLoader is
built), checked on the DataLoader the script really built; an AdamW's implementation set on the
optimizer configure_optimizers() built; the script's own values of each read first; and every
optimizer step told to the observer (accumulation counted), which can stop the loop."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.config import default_optimizer_impl
from autotune.trial.script.lightning_terms import (
    ATTRIBUTE_KNOBS,
    LIBRARY,
    refuse,
    settings,
)
from autotune.trial.script.observer import StepTally, Stopwatch, TrainInfo, dataset_size
from autotune.trial.script.session import ScriptBaseline, ScriptTrial
from autotune.trial.script.sources import Source, argument_flag
from autotune.trial.training import Unsupported

# DataLoader settings that mean nothing without worker processes.
_WITH_WORKERS = ("prefetch_factor", "persistent_workers")


@functools.cache
def callback_class(base: type) -> type:
    """The observer's Callback, made from the Lightning flavour's own Callback class."""

    class ObserverCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self, trial: ScriptTrial, baseline: ScriptBaseline,
                     parsing: ModuleType) -> None:
            self.trial, self.baseline, self.parsing = trial, baseline, parsing
            self.startup_s = 0.0
            self.tally, self.stopwatch, self.global_step = StepTally(), Stopwatch(), 0

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":
                set_attributes(self.trial, self.baseline, pl_module, self.parsing)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            trial, baseline = self.trial, self.baseline
            device = trainer.strategy.root_device
            loader = read_loader(trial, baseline, trainer.train_dataloader)
            optimizer = set_optimizer(trial, baseline, trainer)
            trial.settings = baseline.settings if trial.config is None else \
                settings(trial.config, baseline)
            self.global_step = trainer.global_step
            micro = loader.batch_size if loader is not None else None
            trial.observer.on_train_start(TrainInfo(
                LIBRARY, device, pl_module, optimizer, micro or 0,
                trainer.accumulate_grad_batches, self.startup_s, trial.settings,
                dataset_size(loader.dataset) if loader is not None else None,
                dataset=getattr(loader, "dataset", None),
                collate=getattr(loader, "collate_fn", None)))
            self.stopwatch.mark()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                 batch_idx: int) -> None:
            self.tally.add_batch(batch, self.stopwatch.lap())

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            self.tally.add_loss(outputs.get("loss") if isinstance(outputs, Mapping)
                                else outputs)
            if trainer.global_step != self.global_step:  # the optimizer stepped
                self.global_step = trainer.global_step
                self.trial.steps += 1
                if self.tally.report(self.trial.observer):
                    self.trial.stopped_by_observer = True
                    trainer.should_stop = True
            self.stopwatch.mark()

    return ObserverCallback


def set_attributes(trial: ScriptTrial, baseline: ScriptBaseline, pl_module: Any,
                   parsing: ModuleType) -> None:
    """Read, and set as the trial asks, each attribute Lightning's batch-size finder would find
    (`lightning_hasattr`: the LightningModule, its hparams, the DataModule, its hparams)."""
    found = {}
    for attribute, knob in ATTRIBUTE_KNOBS.items():
        if parsing.lightning_hasattr(pl_module, attribute):
            found[attribute] = parsing.lightning_getattr(pl_module, attribute)
            holder = _holder(pl_module, attribute)
            baseline.settings.setdefault(holder, {})[attribute] = found[attribute]
            source = _flag_of(trial, pl_module, holder, attribute, found[attribute])
            if source is not None:
                baseline.said(holder, attribute, source)
        else:
            baseline.fixed[knob] = (
                f"no `{attribute}` attribute on the LightningModule, its hparams or the "
                "DataModule, where Lightning's batch-size finder looks: the script sets it "
                "in its own code")
    baseline.knobs.update(_own(trial, {ATTRIBUTE_KNOBS[a]: v for a, v in found.items()}))
    if trial.config is not None:
        values = trial.config.to_dict()
        for attribute in found:
            parsing.lightning_setattr(pl_module, attribute, values[ATTRIBUTE_KNOBS[attribute]])


def read_loader(trial: ScriptTrial, baseline: ScriptBaseline,
                loaders: Any) -> DataLoader | None:
    """The DataLoader the script built: the script's own settings read from it where no
    attribute says them, and each attribute the trial set checked to have reached it (where one
    did not, the script does not read it)."""
    loader = _first_loader(loaders)
    if loader is None:  # an iterable of its own: what it says is the script's alone
        refuse(trial, baseline, ATTRIBUTE_KNOBS.values())
        return None
    workers = loader.num_workers
    real = {"micro_batch_size": loader.batch_size, "num_workers": workers,
            "prefetch_factor": loader.prefetch_factor if workers > 0 else None,
            "pin_memory": bool(loader.pin_memory),
            "persistent_workers": bool(loader.persistent_workers) and workers > 0}
    asked = trial.config.to_dict() if trial.config is not None else None
    # The script's own workers: a trial may have set the attribute, and then the loader's
    # prefetch and persistence are the DataLoader's defaults for the trial's workers, not its.
    own_workers = workers if asked is None else baseline.knobs.get("num_workers", workers)
    for attribute, knob in ATTRIBUTE_KNOBS.items():
        holder = _holder_of(baseline, attribute)
        if holder is not None and (workers > 0 or knob not in _WITH_WORKERS):
            expected = asked[knob] if asked is not None else baseline.settings[holder][attribute]
            if knob == "prefetch_factor" and expected is None:
                expected = 2  # the DataLoader's own default
            if real[knob] != expected:
                reason = (f"the script has a `{attribute}` attribute, but its DataLoader has "
                          f"{attribute}={real[knob]}: its train_dataloader() does not read it")
                if asked is not None:
                    raise Unsupported(f"{knob}={expected}: {reason}", knob, expected)
                baseline.fixed[knob] = reason
        if asked is None or holder is None:  # the script's own value, as it reaches the loader
            baseline.knobs.update(_own(trial, {knob: real[knob]}, own_workers))
    # a setting the script cannot be told is refused, unless its loader has it anyway
    differ = [k for k in ATTRIBUTE_KNOBS.values()
              if asked is None or _own(trial, real, workers)[k] != asked[k]]
    if differ:  # (no knobs at all would be every knob)
        refuse(trial, baseline, differ)
    return loader


def set_optimizer(trial: ScriptTrial, baseline: ScriptBaseline,
                  trainer: Any) -> torch.optim.Optimizer | None:
    """Read the optimizer configure_optimizers() built and, for a torch.optim.AdamW, set the
    implementation the trial asks for (its flags, as its constructor would: no state yet)."""
    optimizers = trainer.optimizers
    optimizer = optimizers[0] if len(optimizers) == 1 else None
    if type(optimizer) is not torch.optim.AdamW:
        what = type(optimizer).__qualname__ if optimizer is not None else \
            f"{len(optimizers)} optimizers"
        reason = (f"configure_optimizers() returns {what}; autotune sets the implementation "
                  "(foreach/fused) of a torch.optim.AdamW only")
        baseline.fixed.update(optimizer=reason, optimizer_impl=reason)
        refuse(trial, baseline, ("optimizer", "optimizer_impl"))
        return optimizer
    flags = optimizer.defaults
    own = "fused" if flags.get("fused") else "foreach" if flags.get("foreach") else \
        "for_loop" if flags.get("foreach") is False else \
        default_optimizer_impl(trainer.strategy.root_device.type)
    baseline.knobs.update(optimizer="adamw", optimizer_impl=own)
    baseline.settings["torch.optim.AdamW"] = {"foreach": own == "foreach",
                                              "fused": own == "fused"}
    refuse(trial, baseline, ("optimizer", "optimizer_impl"))
    impl = trial.config.optimizer_impl if trial.config is not None else own
    if impl != own:
        if optimizer.state or flags.get("differentiable"):
            raise Unsupported(f"optimizer_impl={impl}: the script's AdamW already has state "
                              "or is differentiable", "optimizer_impl", impl)
        if impl == "fused" and trainer.gradient_clip_val and "mixed" in str(trainer.precision):
            precision = trial.config.precision if trial.config is not None else None
            raise Unsupported("optimizer_impl=fused with mixed precision and gradient clipping: "
                              "Lightning refuses to clip the gradients of an optimizer that "
                              "unscales them itself (a fused AdamW)", "optimizer_impl", "fused",
                              together={"precision": precision})
        for group in (*optimizer.param_groups, flags):
            group["foreach"], group["fused"] = impl == "foreach", impl == "fused"
        optimizer._step_supports_amp_scaling = impl == "fused"
    return optimizer


def _own(trial: ScriptTrial, values: Mapping[str, Any], workers: int | None = None,
         ) -> dict[str, Any]:
    """DataLoader settings as the knobs say them: pinned memory only on CUDA, the settings of
    worker processes only with workers, no batch size where the loader has none."""
    workers = values.get("num_workers", 1) if workers is None else workers
    out = dict(values)
    if "pin_memory" in out:
        out["pin_memory"] = bool(out["pin_memory"]) and trial.device.type == "cuda"
    if not workers:
        out.update({k: None if k == "prefetch_factor" else False
                    for k in _WITH_WORKERS if k in out})
    if out.get("micro_batch_size", 0) is None:
        del out["micro_batch_size"]
    return out


def _holder(pl_module: Any, attribute: str) -> str:
    """Where Lightning reads `attribute` (the last of the places it looks that has it): the
    class of the DataModule or LightningModule, or its hparams."""
    trainer = pl_module._trainer
    datamodule = trainer.datamodule if trainer is not None else None
    for owner in (o for o in (datamodule, pl_module) if o is not None):
        if attribute in getattr(owner, "hparams", {}):
            return f"{type(owner).__name__}.hparams"
        if hasattr(owner, attribute):
            return type(owner).__name__
    return type(pl_module).__name__


def _flag_of(trial: ScriptTrial, pl_module: Any, holder: str, attribute: str,
             value: Any) -> Source | None:
    """The script's own flag its code builds the holder of `attribute` with, where it does."""
    if trial.folder is None:
        return None
    trainer = pl_module._trainer
    datamodule = trainer.datamodule if trainer is not None else None
    owner = next((o for o in (datamodule, pl_module) if o is not None and
                  type(o).__name__ == holder.split(".")[0]), None)
    if owner is None:
        return None
    return argument_flag(trial.folder / trial.script, type(owner), attribute, value, trial.flags)


def _holder_of(baseline: ScriptBaseline, attribute: str) -> str | None:
    """Where the script's `attribute` was found, if it was."""
    return next((h for h, values in baseline.settings.items() if attribute in values and
                 h not in ("Trainer", "torch.optim.AdamW")), None)


def _first_loader(loaders: Any) -> DataLoader | None:
    if isinstance(loaders, DataLoader):
        return loaders
    items = loaders.values() if isinstance(loaders, Mapping) else \
        loaders if isinstance(loaders, (list, tuple)) else ()
    return next((found for item in items if (found := _first_loader(item)) is not None), None)
