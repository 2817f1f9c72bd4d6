"""The report's figures: real PNGs from full, partial and empty data, and data changes the image."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from dataclasses import replace

import matplotlib.image
import pytest

from autotune.config import TrainConfig
from autotune.show import plots
from autotune.study.records import FEASIBLE, INFEASIBLE, TrialRecord
from autotune.study.summary import CompileRow
from autotune.trial.protocol import Measurement, TrialStatus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GIB = 1024 ** 3


def record(number: int, status: str = "ok", *, mbs: int | None = 8, precision: str = "bf16",
           checkpointing: str = "none", sps: float | None = 100.0, score: float | None = None,
           peak: int | None = 4 * GIB, start: float | None = None, end: float | None = None,
           duplicate: bool = False) -> TrialRecord:
    """A trial record as the study reads one back; start/end default to one minute per trial.
    Without a micro-batch it has no configuration, without a rate no measurement."""
    begin = 1_700_000_000.0 + 60 * number if start is None else start
    status = TrialStatus(status)
    complete = status in FEASIBLE | INFEASIBLE
    return TrialRecord(
        number=number, status=status, state="COMPLETE" if complete else "FAIL",
        config=TrainConfig(micro_batch_size=mbs, grad_accum_steps=1, precision=precision,
                           activation_checkpointing=checkpointing, compile_mode="none")
        if mbs is not None else None,
        measurement=Measurement(samples_per_sec=sps, peak_memory_bytes=peak)
        if sps is not None else None,
        value=((sps if status == "ok" else 0.0) if score is None else score)
        if complete else None,
        constraint=(0.0 if status in FEASIBLE else 1.0) if complete else None,
        start=begin, end=begin + 50 if end is None else end,
        duplicate_of=number - 1 if duplicate else None)


def sweep() -> list[TrialRecord]:
    """Measured trials over micro-batch sizes and precisions, one over the memory limit."""
    rows = []
    for i, (mbs, precision) in enumerate([(m, p) for p in ("fp32", "bf16") for m in (2, 4, 8)]):
        rows.append(record(i, mbs=mbs, precision=precision, sps=50.0 * mbs * (i + 1) ** 0.5,
                           peak=mbs * GIB // 2, checkpointing=("none", "full")[i % 2]))
    rows.append(record(6, "over_memory", mbs=16, precision="bf16", sps=900.0, peak=20 * GIB))
    return rows


def failures() -> list[TrialRecord]:
    return [
        record(7, "oom", mbs=32, precision="bf16", sps=None, peak=None),
        record(8, "oom_predicted", mbs=64, precision="fp32", sps=None, peak=None),
        record(9, "unsupported", mbs=8, precision="fp16", sps=None, peak=None),
    ]


def assert_png(data: bytes) -> None:
    assert isinstance(data, bytes)
    assert data.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(io.BytesIO(data), format="png")
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_drawing_leaves_pyplot_unloaded():
    # In a fresh interpreter: other test modules may have loaded pyplot into this one.
    code = ("import sys; from autotune.show import plots; plots.compile_payoff([]); "
            "sys.exit('matplotlib.pyplot' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_throughput_is_a_png_and_shows_failed_trials():
    measured = plots.throughput_vs_micro_batch(sweep())
    with_failures = plots.throughput_vs_micro_batch(sweep() + failures())
    assert_png(measured)
    assert_png(with_failures)
    assert measured != with_failures


def test_throughput_skips_duplicates_and_other_statuses():
    base = plots.throughput_vs_micro_batch(sweep())
    noise = [record(20, "ok", mbs=128, sps=5000.0, duplicate=True),
             record(21, "error", mbs=128, sps=None), record(22, "timeout", mbs=256, sps=None)]
    assert plots.throughput_vs_micro_batch(sweep() + noise) == base


@pytest.mark.parametrize("records", [
    [],
    [record(0, "error", sps=None)],
    [record(0, "ok", sps=None, score=None)],
    [record(0, "ok", mbs=None)],
    failures(),  # nothing measured: only the strip
], ids=["empty", "only-error", "ok-without-rate", "no-micro-batch", "only-failures"])
def test_throughput_copes_with_partial_data(records):
    assert_png(plots.throughput_vs_micro_batch(records))


def test_memory_plot_draws_capacity_limit_and_oom():
    without = plots.memory_vs_micro_batch(sweep(), None, None)
    with_capacity = plots.memory_vs_micro_batch(sweep(), 24 * GIB, 22 * GIB)
    with_oom = plots.memory_vs_micro_batch(sweep() + failures(), 24 * GIB, 22 * GIB)
    for data in (without, with_capacity, with_oom):
        assert_png(data)
    assert len({without, with_capacity, with_oom}) == 3


@pytest.mark.parametrize("records,capacity", [
    ([], None),
    ([], 24 * GIB),
    ([record(0, "oom", sps=None, peak=None)], None),  # no height to put the OOM at
    ([record(0, "ok", peak=None)], 24 * GIB),
    ([record(0, "ok", peak=300 * 1024 ** 2)], None),  # below 1 GiB: MiB axis
], ids=["empty", "empty-with-capacity", "only-oom", "no-peak", "mib"])
def test_memory_plot_copes_with_partial_data(records, capacity):
    assert_png(plots.memory_vs_micro_batch(records, capacity, None))


def test_best_so_far_keeps_the_best_when_later_trials_are_worse():
    rows = [record(0, sps=100.0), record(1, sps=300.0), record(2, sps=150.0),
            record(3, "oom", sps=None), record(4, sps=120.0)]
    data = plots.best_so_far(rows)
    assert_png(data)
    # A later, worse trial leaves the step line alone; only its faint dot is new.
    assert plots.best_so_far(rows + [record(5, sps=50.0)]) != data


def test_best_so_far_orders_by_number_and_ignores_duplicates():
    rows = [record(0, sps=100.0), record(1, sps=300.0), record(2, sps=150.0)]
    shuffled = [rows[2], rows[0], rows[1]]
    assert plots.best_so_far(shuffled) == plots.best_so_far(rows)
    repeat = record(3, sps=300.0, duplicate=True)
    assert plots.best_so_far(rows + [repeat]) == plots.best_so_far(rows)


@pytest.mark.parametrize("records", [
    [],
    [record(0, "oom", sps=None), record(1, "error", sps=None)],
    [record(0, score=None, sps=None)],
    [replace(record(0), start=None, end=None)],
    [replace(record(0), start=None), replace(record(1, sps=200.0), start=None)],
], ids=["empty", "nothing-ok", "ok-without-score", "no-times", "no-starts"])
def test_best_so_far_copes_with_partial_data(records):
    assert_png(plots.best_so_far(records))


def test_importance_bars():
    importances = {"fANOVA": {"micro_batch_size": 0.6, "precision": 0.3, "compile_mode": 0.1},
                   "PED-ANOVA": {"micro_batch_size": 0.5, "precision": 0.4}}
    data = plots.importance_bars(importances)
    assert_png(data)
    assert plots.importance_bars({"fANOVA": importances["fANOVA"]}) != data


@pytest.mark.parametrize("importances", [
    {}, {"fANOVA": {}}, {"fANOVA": {"precision": float("nan")}},
], ids=["empty", "no-params", "nan"])
def test_importance_bars_copes_with_empty_data(importances):
    assert_png(plots.importance_bars(importances))


def test_compile_payoff_with_and_without_break_even():
    rows = [
        CompileRow(label="#1 default", trial=1, config="bf16 compile=default",
                   reference="#0 (same knobs, uncompiled)", compile_s=40.0, gain=0.25,
                   break_even_steps=1200.0),
        CompileRow(label="#2 max-autotune", trial=2, config="bf16 compile=max-autotune",
                   reference="#0 (same knobs, uncompiled)", compile_s=300.0, gain=-0.05,
                   break_even_steps=None),
    ]
    data = plots.compile_payoff(rows)
    assert_png(data)
    assert plots.compile_payoff(rows[:1]) != data
    assert_png(plots.compile_payoff(rows[1:]))


@pytest.mark.parametrize("rows", [
    [], [CompileRow(label="x", trial=0, config="", reference="", compile_s=math.nan,
                    gain=math.inf, break_even_steps=None)],
], ids=["empty", "no-finite-values"])
def test_compile_payoff_copes_with_empty_data(rows):
    assert_png(plots.compile_payoff(rows))


def test_memory_timeline_stacks_categories_and_skips_zero_ones():
    times = [i * 0.01 for i in range(50)]
    series = {"parameter": [2 * GIB] * 50, "activation": [i * GIB // 10 for i in range(50)],
              "gradient": [0] * 50}
    data = plots.memory_timeline(times, series, title="Step memory")
    assert_png(data)
    # An all-zero category draws nothing, not even a legend entry.
    without_zero = {k: v for k, v in series.items() if k != "gradient"}
    assert plots.memory_timeline(times, without_zero, title="Step memory") == data
    assert plots.memory_timeline(times, {"parameter": [2 * GIB] * 50}, title="Step memory") != data


@pytest.mark.parametrize("times,series", [
    ([], {}),
    ([0.0, 1.0], {"allocated": [0, 0]}),
    ([0.0], {"allocated": [512 * 1024 ** 2]}),
    ([0.0, 5.0, 10.0], {"allocated": [GIB, None, 2 * GIB], "activation": [GIB]}),
    ([0.0, None, 3.0], {"allocated": [GIB, GIB, GIB]}),
], ids=["empty", "all-zero", "single-sample", "ragged", "missing-time"])
def test_memory_timeline_copes_with_partial_data(times, series):
    assert_png(plots.memory_timeline(times, series))
