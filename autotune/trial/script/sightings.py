"""What a probe saw a script do before its training started (`Sightings`): the DataLoaders it
built, its forward and backward passes with gradients on, and the steps of optimizers the loop
watch could not attach to. A script stopped before its training started is told by it whether
it trained at all, so "never reached" is said only of one that never did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# The most DataLoader lines a message names.
SHOWN_LOADERS = 3


@dataclass
class Sightings:
    """A script's training work seen before the loop watch attached to it: the lines that
    built DataLoaders (with their batch size), the outermost forward passes of any module with
    gradients on, the backward passes, and the optimizer steps of optimizers it could not
    attach to (by class: no line of the script's own built it)."""

    loaders: list[str] = field(default_factory=list)
    forwards: int = 0
    backwards: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    _depth: int = 0
    _handles: list[Any] = field(default_factory=list)
    _until: Callable[[], bool] = lambda: False

    def watch_forwards(self, until: Callable[[], bool]) -> None:
        """Count the outermost forward passes with gradients on, until `stop`, or until
        `until()` holds (a library's training started: no module call pays for it after)."""
        self._until = until
        self._handles = [nn.modules.module.register_module_forward_pre_hook(self._entered),
                         nn.modules.module.register_module_forward_hook(self._left)]

    def stop(self) -> None:
        """The forward hooks removed (the training started, or the run ended)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _entered(self, module: nn.Module, args: Any) -> None:
        if self._until():
            self.stop()
            return
        if self._depth == 0 and torch.is_grad_enabled():
            self.forwards += 1
        self._depth += 1

    def _left(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    @property
    def trained(self) -> bool:
        """Whether the script ran backward passes or optimizer steps: it was training."""
        return bool(self.backwards or self.steps)

    def describe(self) -> str:
        """What was seen, in one clause ("" where nothing was)."""
        parts = []
        if self.loaders:
            shown = ", ".join(self.loaders[:SHOWN_LOADERS])
            more = len(self.loaders) - SHOWN_LOADERS
            parts.append(f"{_count(len(self.loaders), 'DataLoader')} built ({shown}"
                         f"{f' and {more} more' if more > 0 else ''})")
        if self.forwards:
            parts.append(f"{_count(self.forwards, 'forward pass', 'es')} with gradients on")
        if self.backwards:
            parts.append(_count(self.backwards, "backward pass", "es"))
        for name, steps in self.steps.items():
            parts.append(f"{_count(steps, 'optimizer step')} of a torch.optim.{name} that "
                         "no line of the script's own built")
        return "it saw " + "; ".join(parts) if parts else ""


def _count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n:,} {noun}{'' if n == 1 else plural}"
