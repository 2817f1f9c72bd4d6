"""A short training run whose loss can be compared across configurations: fixed weights, fixed
batches, a fixed set of samples to read the loss on.

A change that alters the numerics (bf16, fp16, float8, another optimizer, an attention kernel,
compile) can step faster and learn worse without ever going NaN. The tuner compares such a
configuration's run with the user's settings' runs (`search/checks`); this job is one run:

- the weights: `torch.manual_seed(seed)` (and Python's and NumPy's) before `build_model`
  (and one fixed seed before `build_dataset`, so that a dataset drawn from the global
  generator is the same in every run);
- the batches: optimizer step k takes the same `effective_batch_size` samples in every run of
  a seed, whatever the micro-batch and accumulation (each epoch a permutation drawn from the
  seed, cut into steps, the last partial step of an epoch dropped), loaded in the process; in a
  process group each rank its own share of the group's step (`rank_order`);
- the loss: on a fixed set of samples (`HELD_SEED`: the same for every run and seed of one
  effective batch), through the configuration's own forward (its precision, kernels,
  compile), before training and after `steps` optimizer steps; and the mean training loss of
  the last `TAIL` of the steps.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.config import TrainConfig
from autotune.trial import distributed
from autotune.trial.protocol import LossRun, LossRunSettings
from autotune.trial.training import TrainingSetup, setup_from_workload
from autotune.trial.workload import Workload

# The samples the loss is read on: drawn with this seed, at least `HELD_SAMPLES` of them (a
# whole number of optimizer steps' samples, so that every split into micro-batches reads the
# same ones in whole micro-batches: a compiled model keeps its shapes).
HELD_SEED = 20240
HELD_SAMPLES = 256
# The share of the steps whose training loss is averaged (`LossRun.train_loss`).
TAIL = 0.1


def loss_run_job(workload: Workload, config: TrainConfig, device: torch.device,
                 settings: LossRunSettings, trace_path: str | None,
                 progress: Callable[[str], None]) -> LossRun:
    """A child process's job: `settings.steps` optimizer steps of `config` from the weights and
    batches of `settings.seed`, and the losses (`LossRun`)."""
    start = time.perf_counter()
    seed, steps = settings.seed, settings.steps
    seed_everything(HELD_SEED)  # a dataset drawn from the global generator: one for every run
    dataset = workload.build_dataset()
    seed_everything(seed)
    progress("building the model from a fixed seed")
    model = workload.build_model()
    setup = setup_from_workload(workload, config, device, model=model, dataset=dataset, seed=seed)
    collate, micro = workload.hook("collate_fn"), config.micro_batch_size
    world = distributed.current()
    order = rank_order(len(dataset), config.effective_batch_size, steps, seed,
                       world.rank if world is not None else 0,
                       distributed.launched_world_size())
    train = iter(DataLoader(dataset, batch_sampler=list(chunks(order, micro)),
                            collate_fn=collate))
    held = DataLoader(dataset, batch_sampler=list(chunks(held_indices(
        len(dataset), config.effective_batch_size), micro)), collate_fn=collate)
    progress("the loss before training")
    initial = held_loss(setup, held)
    progress(f"{steps} optimizer steps on fixed batches")
    losses = [setup.step(train).loss for _ in range(steps)]
    progress("the loss after training")
    final = held_loss(setup, held)
    tail = torch.stack(losses[-max(1, round(steps * TAIL)):])
    finite = bool(torch.isfinite(torch.stack(losses)).all())
    return LossRun(seed=seed, steps=steps, initial_loss=initial, final_loss=final,
                   train_loss=float(tail.mean()),
                   finite=finite and math.isfinite(initial) and math.isfinite(final),
                   seconds=time.perf_counter() - start)


def seed_everything(seed: int) -> None:
    """torch's generators (CUDA's too), Python's and NumPy's, as a training script seeds."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


def step_order(size: int, effective_batch: int, steps: int, seed: int) -> list[int]:
    """The sample indices of `steps` optimizer steps of `effective_batch` samples each: epoch
    after epoch a permutation drawn from `seed`, each cut into whole steps (the remainder of
    an epoch dropped), so that a step's samples do not depend on how it is split into
    micro-batches."""
    if effective_batch > size:
        raise ValueError(f"an optimizer step of {effective_batch} samples is larger than the "
                         f"dataset ({size} samples)")
    generator = torch.Generator().manual_seed(seed)
    per_epoch = size // effective_batch
    order: list[int] = []
    while len(order) < steps * effective_batch:
        epoch = torch.randperm(size, generator=generator).tolist()
        order += epoch[:per_epoch * effective_batch]
    return order[:steps * effective_batch]


def rank_order(size: int, effective_batch: int, steps: int, seed: int, rank: int,
               ranks: int) -> list[int]:
    """This rank's share of `step_order` for a group of `ranks`: each optimizer step takes
    `effective_batch` samples on every rank, the group's step `ranks` times that, so a step's
    samples are the same whatever the split of each rank's share into micro-batches."""
    order = step_order(size, effective_batch * ranks, steps, seed)
    group = effective_batch * ranks
    return [i for start in range(0, len(order), group)
            for i in order[start + rank * effective_batch:start + (rank + 1) * effective_batch]]


def held_indices(size: int, effective_batch: int) -> list[int]:
    """The samples the loss is read on: the same for every run of one effective batch, whole
    multiples of it (so of every micro-batch it is split into), `HELD_SAMPLES` at least where
    the dataset holds them (one effective batch at least)."""
    steps = max(1, min(-(-HELD_SAMPLES // effective_batch), size // effective_batch))
    generator = torch.Generator().manual_seed(HELD_SEED)
    return torch.randperm(size, generator=generator)[:steps * effective_batch].tolist()


def chunks(indices: list[int], size: int) -> Iterable[list[int]]:
    """`indices` cut into lists of `size` (a DataLoader's `batch_sampler`)."""
    return (indices[i:i + size] for i in range(0, len(indices), size))


def held_loss(setup: TrainingSetup, held: Iterable[Any]) -> float:
    """The mean loss over the held micro-batches through the configuration's own forward (its
    autocast, attention kernel and compiled graph: a training forward, whose graph is then
    dropped, so that a compiled model compiles nothing more), with the random state (dropout)
    the same in every run and given back after."""
    device = setup.device
    devices = [device.index or 0] if device.type == "cuda" else []
    total, count = torch.zeros((), device=device), 0
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(HELD_SEED)
        for batch in _moved(held, setup):
            if setup.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with setup.attention(), setup.autocast():
                loss = setup.loss_fn(setup.model, batch)
            total += loss.detach().float().reshape(())
            count += 1
    return float(total / count)


def _moved(batches: Iterable[Any], setup: TrainingSetup) -> Iterator[Any]:
    for batch in batches:
        yield setup.to_device(batch, setup.device)
