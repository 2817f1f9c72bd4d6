"""The optimizer a configuration asks for, built over the model file's own parameter groups.

`optimizer=adamw` is the file's optimizer (or AdamW) with the implementation `optimizer_impl`
picks (`foreach=`/`fused=`). A memory-saving optimizer (torch's Adafactor, bitsandbytes' 8-bit
AdamW) replaces it but keeps its parameter groups, learning rates and weight decay: what changes
is the update rule and the state it keeps, which is why it is searched only when the user
allows it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from autotune.config import TrainConfig

BuildOptimizer = Callable[..., torch.optim.Optimizer]
# What the default AdamW trains with when the model file has no `build_optimizer`.
DEFAULT_LR = 3e-4
DEFAULT_WEIGHT_DECAY = 0.01
# Where each memory-saving optimizer comes from: (module, class).
_REPLACEMENTS = {"adafactor": ("torch.optim", "Adafactor"),
                 "adamw_8bit": ("bitsandbytes.optim", "AdamW8bit")}


def make_optimizer(model: nn.Module, config: TrainConfig,
                   build_optimizer: BuildOptimizer | None = None) -> torch.optim.Optimizer:
    """The optimizer `config` names over `model`'s trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    flags = {"foreach": config.optimizer_impl == "foreach",
             "fused": config.optimizer_impl == "fused"}
    if config.optimizer == "adamw":
        if build_optimizer is not None:
            return build_optimizer(params, **flags)
        return torch.optim.AdamW(params, lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY,
                                 **flags)
    own = (build_optimizer(params) if build_optimizer is not None else
           torch.optim.AdamW(params, lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY))
    groups = [{"params": g["params"], "lr": float(g["lr"]),
               "weight_decay": g.get("weight_decay", 0.0)} for g in own.param_groups]
    return optimizer_class(config.optimizer)(groups)


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The class of a memory-saving optimizer (imported only when asked for)."""
    module, attr = _REPLACEMENTS[name]
    return getattr(importlib.import_module(module), attr)
