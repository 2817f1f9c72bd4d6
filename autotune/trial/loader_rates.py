"""How fast each DataLoader setting delivers batches on its own, with no model: measured once
per study by the capability probe, for every (num_workers, prefetch_factor) the space offers
(`autotune.search.loader_plan` decides from these rates).

Loading in the training process is timed on the CPU clock too: a loader that spends most of its
wall time off the CPU waits (on storage, a network, a remote service), and its workers sleep
rather than compute while they wait, so more of them than there are cores still help
(`waiting_worker_counts`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import Dataset

from autotune.config import TrainConfig
from autotune.trial.protocol import LoaderRate
from autotune.trial.training import make_loader

# Batches timed at least, besides the seconds asked for: a slow loader's rate is still a rate.
TIMED_BATCHES = 5
# The most workers a waiting loader is timed with: each is a process with a copy of the dataset.
MAX_WAITING_WORKERS = 32
# A setting this many times faster than the training consumes at the probe's reference step is
# far ahead: whether it feeds what the search finds (workers must outrun the step 1.5x,
# `loader_plan.LOADER_MARGIN`; the answers of models fed in time are at most about 10x their
# baseline) does not hang on its precise rate, so its timing ends with its first batches, not
# its seconds (GPT-2 small on an H200: 11 settings took 13 s of a 4-minute study, for a loader
# 257x ahead of the step).
FAR_AHEAD = 100.0


def measure_loader_rates(dataset: Dataset, collate: Callable[[list[Any]], Any] | None,
                         micro_batch_size: int,
                         settings: Iterable[tuple[int, int | None]],
                         seconds: float, consumption: float | None = None) -> list[LoaderRate]:
    """Each setting's rate over at least TIMED_BATCHES batches and `seconds` seconds; where the
    training consumes `consumption` samples/sec, a setting with workers `FAR_AHEAD` of it ends
    at its batches (and those its workers had ready), not its seconds. Loading in the training
    process keeps its seconds: its CPU share says whether the loader waits."""
    enough = FAR_AHEAD * consumption if consumption else math.inf
    rates = []
    for workers, prefetch in settings:
        # Not persistent: the workers must end with the probe, not live on in the tuner.
        config = TrainConfig(micro_batch_size=micro_batch_size, num_workers=workers,
                             prefetch_factor=prefetch)
        batches = _forever(make_loader(dataset, config, torch.device("cpu"), collate))
        # Worker start-up is paid once per run, not per batch; by the first batch each worker
        # has one almost ready, loaded while nothing was timed: those are not timed either.
        for _ in range(max(1, workers)):
            next(batches)
        least = TIMED_BATCHES + workers * (prefetch or 2)
        count, start, cpu = 0, time.perf_counter(), time.process_time()
        while count < TIMED_BATCHES or time.perf_counter() - start < seconds:
            next(batches)
            count += 1
            if workers and count >= least and \
                    count * micro_batch_size / (time.perf_counter() - start) >= enough:
                break
        wall = time.perf_counter() - start
        # the workers' CPU time is their own processes': only in-process loading is read
        share = min(1.0, (time.process_time() - cpu) / wall) if workers == 0 else None
        rates.append(LoaderRate(workers, prefetch, count * micro_batch_size / wall, share))
        batches.close()
    return rates


def waiting_worker_counts(rates: Iterable[LoaderRate], cores: int) -> list[int]:
    """Worker counts beyond those timed that a waiting loader is worth timing with: powers of
    two up to the cores over the CPU share of in-process loading (the workers that keep the
    cores as busy as in-process loading would, were it not waiting), at most
    `MAX_WAITING_WORKERS`; none for a loader that computes."""
    rates = list(rates)
    waiting = [r.cpu_share for r in rates if r.waits and r.cpu_share is not None]
    if not waiting:
        return []
    share = min(waiting)
    most = min(MAX_WAITING_WORKERS, math.ceil(cores / max(share, 1e-3)))
    timed = max(r.num_workers for r in rates)
    return [n for n in (2**i for i in range(most.bit_length())) if timed < n <= most]


def _forever(loader: torch.utils.data.DataLoader) -> Any:
    while True:
        yield from loader
