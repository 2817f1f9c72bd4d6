"""The worst batch: a configuration trained a few steps on a micro-batch of the dataset's largest
samples, for the peak memory a long run reaches when its batches hold them.

A trial's window draws random batches, so its peak is the largest batch it happened to draw;
the answer must fit the largest the data holds (`sample_sizes` found which samples those are).
Run as a job of its own (`child.JOBS`), which the tuner starts as a fresh interpreter, as the
user's own run is one: on CPU the peak is the process's peak RSS, the build included, as a
trial's (and, unlike a trial forked from the fork server, with the libraries' pages it maps
counted, as in a run of the user's); on CUDA the allocator's peak from the end of the build, as
a trial's. A micro-batch that does not fit ends the job out of memory, which the tuner reads
as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import Subset

from autotune.config import TrainConfig
from autotune.trial.measure import peak_memory, synchronize
from autotune.trial.protocol import WorstBatch
from autotune.trial.training import setup_from_workload
from autotune.trial.workload import Workload


def worst_batch_job(workload: Workload, config: TrainConfig, device: torch.device,
                    settings: Mapping[str, Any], trace_path: str | None,
                    progress: Callable[[str], None]) -> WorstBatch:
    """A child process's job: `config` trained `settings["steps"]` optimizer steps with every
    micro-batch made of the samples `settings["indices"]` (the largest, one per sample of the
    micro-batch), and the process's peak memory."""
    start = time.perf_counter()
    indices, steps = [int(i) for i in settings["indices"]], int(settings["steps"])
    progress("building the model")
    model = workload.build_model()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    progress("building the dataset: its largest samples only")
    dataset = Subset(workload.build_dataset(), indices)
    setup = setup_from_workload(workload, config, device, model=model, dataset=dataset)
    batches = setup.batches()
    progress(f"{steps} optimizer steps on the worst batch ({len(indices)} largest samples)")
    finite = torch.ones((), dtype=torch.bool, device=device)
    for _ in range(steps):
        finite &= torch.isfinite(setup.step(batches).loss)
    synchronize(device)
    return WorstBatch(samples=len(indices), peak_memory_bytes=peak_memory(device).peak,
                      steps=steps, loss_finite=bool(finite),
                      seconds=time.perf_counter() - start)
