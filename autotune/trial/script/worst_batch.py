"""A training script's worst batch (`trial/worst_batch`'s, through the library's own loop): the
script run with the trial's knobs and its training data cut to the dataset's largest samples,
so every micro-batch is made of them (a Trainer's `train_dataset` as it starts training; any
other script's DataLoader on a dataset of the sized length as it is built, `loaders_cut`: a
hand-written loop's, Accelerate's, the one a Lightning module's `train_dataloader()` builds);
stopped once its peak memory is steady, and that peak read as a model file's worst batch reads
it (on CPU the process's peak RSS, the tuner starting the job as a fresh interpreter; on CUDA
the allocator's peak from the start of training)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Subset

from autotune.trial import distributed
from autotune.trial.measure import peak_memory
from autotune.trial.protocol import WorstBatch, WorstBatchSettings
from autotune.trial.script.observer import TrainInfo, dataset_size
from autotune.trial.window import synchronize
from autotune.trial.worst_batch import steady_peak


def only(dataset: Any, worst: WorstBatchSettings) -> Any:
    """The samples of `dataset` at `worst.indices`, in that order (once for each rank of a
    process group: its library's sampler shards them, so each rank's micro-batch is made of the
    largest samples): a `datasets.Dataset` selects its rows (so the Hugging Face Trainer still
    drops the columns the model does not take), any other is a `Subset`."""
    indices = list(worst.indices) * distributed.launched_world_size()
    if callable(getattr(dataset, "select", None)):
        return dataset.select(indices)
    return Subset(dataset, indices)



@contextlib.contextmanager
def loaders_cut(worst: WorstBatchSettings | None) -> Iterator[None]:
    """While inside, a DataLoader built on a dataset of the length the probe sized
    (`worst.total`: the training data) is built on its largest samples only (`worst.indices`);
    nothing changes where `worst` is None."""
    if worst is None:
        yield
        return
    init = DataLoader.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def cut_init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        if dataset_size(bound.arguments["dataset"]) == worst.total:
            bound.arguments["dataset"] = only(bound.arguments["dataset"], worst)
        init(*bound.args, **bound.kwargs)

    DataLoader.__init__ = cut_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        DataLoader.__init__ = init  # type: ignore[method-assign]


class WorstBatchObserver:
    """The library's loop told of each optimizer step: the peak memory read after it, the loop
    stopped once the peak is steady (`steady_peak`: at least `settings.steps` steps, then until
    `settings.steady` in a row raise it by under 1%, at most `settings.max_steps`)."""

    def __init__(self, settings: WorstBatchSettings, device: torch.device) -> None:
        self.settings, self.device = settings, device
        self.peaks: list[int] = []
        self._finite = torch.ones((), dtype=torch.bool, device=device)
        self._start = time.perf_counter()

    def on_train_start(self, info: TrainInfo) -> None:
        kept = len(self.settings.indices) * distributed.launched_world_size()
        if info.dataset_size != kept:
            raise RuntimeError(f"the worst batch of a {info.library} script is not checked yet: "
                               f"its training data holds {info.dataset_size} samples, not the "
                               f"{kept} largest")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        if loss is not None:
            self._finite &= torch.isfinite(loss.to(self.device)).all()
        synchronize(self.device)
        self.peaks.append(peak_memory(self.device).peak)
        s = self.settings
        # a group's ranks step together: rank 0 decides when the peak is steady
        return distributed.decided(len(self.peaks) >= s.max_steps or
                                   steady_peak(self.peaks, s.steps, s.steady))

    def on_train_end(self) -> None:
        pass

    def result(self) -> WorstBatch:
        if not self.peaks:
            raise RuntimeError("the script's training ended before its first optimizer step on "
                               "the worst batch")
        peak, finite = self.peaks[-1], bool(self._finite)
        world = distributed.current()
        if world is not None:  # the group's: the largest rank's peak, finite on every rank
            gathered = world.gather((peak, finite))
            peak, finite = max(p for p, _ in gathered), all(f for _, f in gathered)
        return WorstBatch(samples=len(self.settings.indices), peak_memory_bytes=peak,
                          steps=len(self.peaks), loss_finite=finite,
                          seconds=time.perf_counter() - self._start)
