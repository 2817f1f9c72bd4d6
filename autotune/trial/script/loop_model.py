"""The trial's knobs on a hand-written loop's model, where the loop watch finds it (the module
whose parameters its optimizer holds), and the probe's checks of those knobs on a copy of it,
on the loop's own first batch. The script's code is never changed: its model's forward is
wrapped, its repeated blocks checkpointed."""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from autotune.trial.script import own_switches
from autotune.trial.script.session import ScriptTrial
from autotune.trial.training import (
    apply_activation_checkpointing,
    checkpointing_problem,
    nonfinite_problem,
)


def apply_model_knobs(trial: ScriptTrial, module: nn.Module) -> None:
    """A hand-written loop's model, as the trial asks: its repeated blocks checkpointed, its
    forward under bf16 autocast and compiled (where no switch of the script's says them: the
    trial set that switch, and the script does it itself)."""
    config, own = trial.config, trial.own
    if config is None or own is None:
        return
    apply_checkpointing(trial, module)
    base = own.knobs
    autocast = config.precision == "bf16" and base.get("precision") != "bf16" and \
        not own_switches.expresses(own, "precision")
    compiled = config.compile_mode != base.get("compile_mode", "none") and \
        not own_switches.expresses(own, "compile_mode")
    if not autocast and not compiled:
        return
    inner = module.forward
    run = inner if not compiled else torch.compile(
        inner, mode=None if config.compile_mode == "default" else config.compile_mode)
    device = trial.device.type

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=torch.bfloat16) if autocast else \
                contextlib.nullcontext():
            return run(*args, **kwargs)

    module.forward = forward


def apply_checkpointing(trial: ScriptTrial, module: nn.Module) -> None:
    """The trial's activation checkpointing on the model's repeated blocks, where it differs
    from the script's own."""
    config, own = trial.config, trial.own
    if config is None or own is None or config.activation_checkpointing == \
            own.knobs.get("activation_checkpointing", "none"):
        return
    apply_activation_checkpointing(module, config.activation_checkpointing)


def probe_checks(trial: ScriptTrial, module: nn.Module, args: Any, kwargs: Any,
                 autocast: torch.dtype | None) -> None:
    """The probe's checks on the loop's own batch, on a copy of the model: checkpointing must
    leave the loss and every gradient as they were, and bf16 (where the script's forward is not
    under an autocast of its own) must leave them finite; a value that fails is refused in the
    trial's baseline, with why."""

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return scalar_loss(model(*batch[0], **batch[1]))

    def build() -> nn.Module:
        return copy.deepcopy(module)

    modes = [m for m in trial.candidates.get("activation_checkpointing", ()) if m != "none"]
    batch = (args, kwargs)
    try:
        for mode in modes:
            if problem := checkpointing_problem(build, batch, loss, mode, device=trial.device):
                _refuse(trial, "activation_checkpointing", mode, problem)
        bf16 = "bf16" in trial.candidates.get("precision", ()) and autocast is None
        if bf16 and (problem := nonfinite_problem(build, batch, loss, "bf16", trial.device)):
            _refuse(trial, "precision", "bf16", problem)
    except Exception as exc:  # noqa: BLE001 - a model a copy cannot run is left as it is
        for mode in modes:
            _refuse(trial, "activation_checkpointing", mode, "the probe could not check it on "
                    f"a copy of the model: {type(exc).__name__}: {exc}")


def _refuse(trial: ScriptTrial, knob: str, value: Any, reason: str) -> None:
    if trial.baseline is not None:
        trial.baseline.refused.setdefault(knob, {})[str(value)] = reason


def scalar_loss(output: Any) -> torch.Tensor:
    """A loss from what the model returned: its loss (a one-element tensor, `.loss`, a
    `loss` key, the first one-element tensor of a tuple), else the sum of its first tensor."""
    if isinstance(output, torch.Tensor):
        return output if output.numel() == 1 else output.float().sum()
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    items = list(output.values()) if isinstance(output, Mapping) else \
        list(output) if isinstance(output, (tuple, list)) else []
    tensors = [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]
    single = [t for t in tensors if t.numel() == 1]
    if single:
        return single[0]
    if tensors:
        return tensors[0].float().sum()
    raise TypeError(f"the model returned {type(output).__name__}, with no tensor to check")
