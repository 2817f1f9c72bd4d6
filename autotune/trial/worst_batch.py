"""The worst batch: a configuration trained a few steps on a micro-batch of the dataset's largest
samples, for the peak memory a long run reaches when its batches hold them.

A trial's window draws random batches, so its peak is the largest batch it happened to draw;
the answer must fit the largest the data holds (`sample_sizes` found which samples those are).
Run as a job of its own (`child.JOBS`), which the tuner starts as a fresh interpreter, as the
user's own run is one: on CPU the peak is the process's peak RSS, the build included, as a
trial's (and, unlike a trial forked from the fork server, with the libraries' pages it maps
counted, as in a run of the user's); on CUDA the allocator's peak from the end of the build, as
a trial's. A micro-batch that does not fit ends the job out of memory, which the tuner reads
as such. In a process group every rank's micro-batch is made of the largest samples (the rank
that draws them in the user's run is the one that must fit), and the group's peak is its
largest rank's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Subset

from autotune.config import TrainConfig
from autotune.trial import distributed
from autotune.trial.measure import peak_memory
from autotune.trial.protocol import WorstBatch, WorstBatchSettings
from autotune.trial.training import setup_from_workload
from autotune.trial.window import synchronize
from autotune.trial.workload import Workload

# A peak that grows by less than this share over the steady steps is steady.
STEADY_GROWTH = 0.01


def worst_batch_job(workload: Workload, config: TrainConfig, device: torch.device,
                    settings: WorstBatchSettings, trace_path: str | None,
                    progress: Callable[[str], None]) -> WorstBatch:
    """A child process's job: `config` trained with every micro-batch made of the samples
    `settings.indices` (the largest, one per sample of the micro-batch) until its peak
    memory is steady, and that peak. Steady: at least `settings.steps` optimizer steps,
    then until `settings.steady` steps in a row raise it by under `STEADY_GROWTH` (at most
    `settings.max_steps`): on CPU the heap a step leaves fragmented can raise the next
    step's peak for several steps, most under accumulation."""
    start = time.perf_counter()
    indices = list(settings.indices)
    least, steady, most = settings.steps, settings.steady, settings.max_steps
    progress("building the model")
    model = workload.build_model()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    progress("building the dataset: its largest samples only")
    data = workload.build_dataset()
    if len(data) != settings.total:
        raise RuntimeError(f"build_dataset built {len(data)} samples, not the {settings.total} "
                           "the probe sized: the largest samples' indices mean nothing here")
    world = distributed.current()
    ranks = distributed.launched_world_size()
    # (a group's sampler shards what it is given: as many samples as it needs, for the setup)
    setup = setup_from_workload(workload, config, device, model=model,
                                dataset=Subset(data, indices * ranks))
    if world is not None:  # every rank's micro-batch the largest: the rank that draws them
        setup.loader = DataLoader(Subset(data, indices), batch_size=len(indices),
                                  collate_fn=setup.loader.collate_fn)
    batches = setup.batches()
    progress(f"optimizer steps on the worst batch ({len(indices)} largest samples) until its "
             "peak memory is steady")
    finite = torch.ones((), dtype=torch.bool, device=device)
    peaks: list[int] = []
    # a group's ranks step together: rank 0 decides when the peak is steady
    while not setup.decide(len(peaks) >= most or steady_peak(peaks, least, steady)):
        finite &= torch.isfinite(setup.step(batches).loss)
        synchronize(device)
        peaks.append(peak_memory(device).peak)
    peak, all_finite = peaks[-1], bool(finite)
    if world is not None:  # the group's: the largest rank's peak, finite on every rank
        gathered = world.gather((peak, all_finite))
        peak, all_finite = max(p for p, _ in gathered), all(f for _, f in gathered)
    return WorstBatch(samples=len(indices), peak_memory_bytes=peak, steps=len(peaks),
                      loss_finite=all_finite, seconds=time.perf_counter() - start)


def steady_peak(peaks: list[int], least: int, steady: int) -> bool:
    """At least `least` steps, and the last `steady` of them raised the peak by under
    `STEADY_GROWTH` in all."""
    return len(peaks) >= max(least, steady + 1) and \
        peaks[-1] <= peaks[-1 - steady] * (1 + STEADY_GROWTH)
