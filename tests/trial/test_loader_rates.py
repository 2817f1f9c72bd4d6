"""The DataLoader's own rates, measured on the real loader with no model."""

from __future__ import annotations

import time

from autotune.trial.loader_rates import measure_loader_rates
from autotune.trial.protocol import ProbeSettings
from autotune.trial.workload import load_workload

from ..conftest import ROOT


def test_loader_rates_are_measured_on_the_real_dataloader_for_the_seconds_asked() -> None:
    workload = load_workload(str(ROOT / "models" / "mlp.py"),
                             {"feature_dim": 32, "num_samples": 2048})
    start = time.perf_counter()
    rates = measure_loader_rates(workload.build_dataset(), None, 64, [(0, None), (1, 2)], 0.3)
    assert time.perf_counter() - start >= 2 * 0.3
    assert [(r.num_workers, r.prefetch_factor) for r in rates] == [(0, None), (1, 2)]
    assert all(r.samples_per_sec > 100 for r in rates)


def test_workers_far_ahead_of_the_training_are_timed_for_their_batches_not_their_seconds() -> None:
    """The training consumes 1 sample/sec: a worker's rate of thousands needs no seconds of
    timing; loading in the training process keeps its seconds (its CPU share is read)."""
    dataset = load_workload(str(ROOT / "models" / "mlp.py"),
                            {"feature_dim": 32, "num_samples": 2048}).build_dataset()
    start = time.perf_counter()
    worker, = measure_loader_rates(dataset, None, 64, [(1, 2)], 2.0, consumption=1.0)
    assert time.perf_counter() - start < 2.0 and worker.samples_per_sec > 100
    start = time.perf_counter()
    in_process, = measure_loader_rates(dataset, None, 64, [(0, None)], 0.5, consumption=1.0)
    assert time.perf_counter() - start >= 0.5 and in_process.cpu_share is not None


def test_a_study_of_short_windows_times_its_loaders_as_briefly() -> None:
    assert ProbeSettings.for_window({}, 0.2).loader_seconds == 0.2
    assert ProbeSettings.for_window({}, 3.0).loader_seconds == ProbeSettings({}).loader_seconds
