"""How fast each DataLoader setting delivers batches on its own, with no model: measured once
per study by the capability probe, for every (num_workers, prefetch_factor) the space offers
(`autotune.search.loader_plan` decides from these rates).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import Dataset

from autotune.config import TrainConfig
from autotune.trial.protocol import LoaderRate
from autotune.trial.training import make_loader

PROBE_BATCHES = 20
PROBE_SECONDS = 1.0


def measure_loader_rates(dataset: Dataset, collate: Callable[[list[Any]], Any] | None,
                         micro_batch_size: int,
                         settings: Iterable[tuple[int, int | None]]) -> list[LoaderRate]:
    """Each setting's rate over at least PROBE_BATCHES batches and PROBE_SECONDS seconds."""
    rates = []
    for workers, prefetch in settings:
        # Not persistent: the workers must end with the probe, not live on in the tuner.
        config = TrainConfig(micro_batch_size=micro_batch_size, num_workers=workers,
                             prefetch_factor=prefetch)
        batches = _forever(make_loader(dataset, config, torch.device("cpu"), collate))
        next(batches)  # worker start-up is paid once per run, not per batch
        count, start = 0, time.perf_counter()
        while count < PROBE_BATCHES or time.perf_counter() - start < PROBE_SECONDS:
            next(batches)
            count += 1
        rates.append(LoaderRate(workers, prefetch,
                                count * micro_batch_size / (time.perf_counter() - start)))
        batches.close()
    return rates


def _forever(loader: torch.utils.data.DataLoader) -> Any:
    while True:
        yield from loader
