"""Where a step's time goes, read off one measurement as an engineer reads a profile: the
shares, what each points to, and which one to fix first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.study.bottleneck import (
    DATA_WAIT,
    MEMORY,
    OPTIMIZER,
    OVERHEAD,
    Diagnosis,
    diagnose,
)
from autotune.trial.protocol import Finding, Measurement, WorkKind


def measured(wait: float = 0.0, optimizer: float = 0.0, sync_s: float = 0.0,
             launch: float | None = None, peak: int | None = None) -> Measurement:
    findings = (Finding("launch_bound", launch, "tiny ops", "compile", ()),) if launch else ()
    return Measurement(samples_per_sec=100.0, step_time_median_s=0.1, data_wait_fraction=wait,
                       optimizer_fraction=optimizer, host_syncs_per_step=2.0,
                       host_sync_s_per_step=sync_s, findings=findings,
                       peak_memory_bytes=peak)


def test_a_step_waiting_on_its_loader_is_diagnosed_as_such_first() -> None:
    """71% of the step waiting for data: the loader first, named in words with its share; the
    optimizer's share of the profiled rest is scaled to the whole step."""
    diagnosis = diagnose(measured(wait=0.71, optimizer=0.2), memory_limit_bytes=None)
    assert diagnosis is not None and diagnosis.dominant == DATA_WAIT
    assert diagnosis.share(OPTIMIZER) == pytest.approx(0.2 * 0.29)
    assert diagnosis.first_knobs()[0] == "num_workers"
    said = diagnosis.describe()
    assert said.startswith("waiting for data 71% (-> DataLoader workers)")
    assert said.endswith("Waiting for data first")


def test_an_optimizer_bound_step_points_to_the_adamw_implementation() -> None:
    diagnosis = diagnose(measured(wait=0.02, optimizer=0.6), memory_limit_bytes=None)
    assert diagnosis.dominant == OPTIMIZER
    assert diagnosis.first_knobs()[0] == "optimizer_impl"
    assert "the optimizer step 59% (-> a fused or foreach AdamW)" in diagnosis.describe()


def test_overhead_and_memory_point_to_the_micro_batch() -> None:
    """Tiny operators taking 60% of the step: a larger micro-batch, then compiling. No share
    dominant but the memory 90% free: a larger micro-batch. Neither: no single bottleneck."""
    launch = diagnose(measured(launch=0.6), memory_limit_bytes=None)
    assert launch.dominant == OVERHEAD
    assert launch.first_knobs()[:2] == ("micro_batch_size", "compile_mode")
    roomy = diagnose(measured(peak=10 * 2**20), memory_limit_bytes=100 * 2**20)
    assert roomy.dominant == MEMORY and roomy.memory_free == pytest.approx(0.9)
    assert "90% of the memory free at the peak (-> a larger micro-batch)" in roomy.describe()
    # a global batch of 16 x 1, fixed: the space holds no larger micro-batch to point to
    fixed = diagnose(measured(peak=3 * 2**20), memory_limit_bytes=100 * 2**20,
                     larger_batch=False)
    assert fixed.dominant is None and MEMORY not in fixed.to_fix()
    assert fixed.describe() == (
        "forward and backward 100% (-> bf16, torch.compile); 97% of the memory free at the peak "
        "(the space holds no larger micro-batch: --free-batch-size MIN:MAX lets your global "
        "batch change). No single bottleneck: the usual fast settings first")
    assert Diagnosis.from_json(fixed.to_json()) == fixed
    full = diagnose(measured(optimizer=0.1, peak=90 * 2**20), memory_limit_bytes=100 * 2**20)
    assert full.dominant is None
    assert full.describe().endswith("No single bottleneck: the usual fast settings first")


def test_a_measurement_without_a_profile_has_no_diagnosis_and_diagnoses_read_back() -> None:
    assert diagnose(Measurement(samples_per_sec=1.0, step_time_median_s=0.1), None) is None
    diagnosis = diagnose(replace(measured(wait=0.5, sync_s=0.01), device_idle_fraction=0.1,
                                 work_shares={WorkKind.MATMUL: 0.7, WorkKind.COPY: 0.3},
                                 kernels_per_step=420.0), memory_limit_bytes=None)
    assert Diagnosis.from_json(diagnosis.to_json()) == diagnosis
    assert diagnosis.describe_work() == "GPU time: matmuls and convolutions 70%, copies 30%; " \
        "420 kernels a step"
