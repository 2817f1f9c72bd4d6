"""The DataLoader's own rates, measured on the real loader with no model."""

from __future__ import annotations

from autotune.trial.loader_rates import measure_loader_rates
from autotune.trial.workload import load_workload

from ..conftest import ROOT


def test_loader_rates_are_measured_on_the_real_dataloader() -> None:
    workload = load_workload(str(ROOT / "models" / "mlp.py"),
                             {"feature_dim": 32, "num_samples": 2048})
    rates = measure_loader_rates(workload.build_dataset(), None, 64, [(0, None), (1, 2)])
    assert [(r.num_workers, r.prefetch_factor) for r in rates] == [(0, None), (1, 2)]
    assert all(r.samples_per_sec > 100 for r in rates)
