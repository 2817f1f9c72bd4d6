"""What a script trial's measurement sees of the library's own training loop: `StepObserver`,
told of every optimizer step the library takes and deciding when it stops, and `StepTally`,
which the adapters fill from the library's callbacks between two optimizer steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn


class TrainingDone(BaseException):
    """Raised out of the user's script once its training loop has ended, so that nothing after
    `Trainer.train()` or `Trainer.fit()` (saving, evaluation, a hub push) runs. A BaseException:
    a script's `except Exception:` does not swallow it."""


@dataclass(frozen=True)
class TrainInfo:
    """The training the library is about to run, with the trial's knobs applied."""

    library: str                    # its `Library`'s name (`libraries.LIBRARIES`)
    device: torch.device            # where the trainer trains
    model: nn.Module                # the model as the user built it (unwrapped)
    optimizer: torch.optim.Optimizer | None
    micro_batch_size: int
    grad_accum_steps: int
    startup_s: float                # the script's own start-up: start to Trainer.train/fit
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    dataset_size: int | None = None  # samples in the training data, where it has a length
    # The training data as the library's loader reads it, and the function that collates its
    # batches: what the probe sizes (`sample_sizes`), for the worst batch. None: not known for
    # this library yet.
    dataset: Any = None
    collate: Callable[[list[Any]], Any] | None = None


class StepObserver(Protocol):
    """The measurement's side of the library's loop. `on_step_end` is called after each
    optimizer step (every micro-batch of the accumulation done) with the samples that step
    consumed, its loss (on the device, unsynchronised; None where the library gives none) and
    the seconds it waited for data; True stops the loop there."""

    def on_train_start(self, info: TrainInfo) -> None: ...

    def on_step_end(self, samples: int, loss: torch.Tensor | None,
                    data_wait_s: float) -> bool: ...

    def on_train_end(self) -> None: ...


class StepTally:
    """One optimizer step's micro-batches, as the library's callbacks see them: samples counted
    from the real batches, losses summed on the device, data waits added up."""

    def __init__(self) -> None:
        self._samples, self._wait_s = 0, 0.0
        self._loss: torch.Tensor | None = None

    def add_batch(self, batch: Any, wait_s: float) -> None:
        self._samples += rows(batch)
        self._wait_s += wait_s

    def add_loss(self, loss: torch.Tensor | None) -> None:
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else self._loss + loss

    def report(self, observer: StepObserver) -> bool:
        """Tell `observer` of the step tallied so far and start the next; its answer."""
        samples, loss, wait = self._samples, self._loss, self._wait_s
        self._samples, self._loss, self._wait_s = 0, None, 0.0
        return observer.on_step_end(samples, loss, wait)


class Stopwatch:
    """Seconds since the last `mark`: the gap between one step's end and the next one's
    start, where the library fetches the next micro-batch."""

    def __init__(self) -> None:
        self._last = time.perf_counter()

    def mark(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> float:
        return time.perf_counter() - self._last


def dataset_size(dataset: Any) -> int | None:
    """The samples in a training dataset, or None for one without a length (a stream)."""
    try:
        return len(dataset)
    except TypeError:
        return None


def rows(batch: Any) -> int:
    """Samples in a collated batch: the first dimension of its first tensor (dicts, tuples,
    lists and dataclass-like objects with tensors as attributes searched in order)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (tuple, list)):
        values = list(batch)
    else:
        values = list(getattr(batch, "__dict__", {}).values())
    for value in values:
        found = rows(value) if isinstance(value, (torch.Tensor, Mapping, tuple, list)) else 0
        if found:
            return found
    return 0
