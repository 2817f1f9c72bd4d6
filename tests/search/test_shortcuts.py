"""The search's shortcuts as functions of the trials so far: the fast corner's micro-batch
steps down until one fits, screening takes a share of the best full rate, and the DataLoader
plan follows the fastest model measured."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.hardware import DeviceInfo
from autotune.search.shortcuts import (
    SCREEN_FRACTION,
    next_corner,
    planned_loader,
    screen_below,
    screen_load,
)
from autotune.search.space import build_space
from autotune.study.records import Role, TrialRecord
from autotune.trial.protocol import LoaderRate, Measurement, TrialStatus

MIB = 2**20
CPU = DeviceInfo(type="cpu", index=None, name="test CPU", total_memory_bytes=2**34, cpu_count=2,
                 bf16=True, tf32=False, fused_adamw=True, cuda_graphs=False)
BASELINE = TrainConfig(micro_batch_size=1024)
SPACE = build_space(BASELINE, CPU, 4096, fixes={"compile_mode": "none"})


def record(number: int, config: TrainConfig, status: str, role: str = Role.SEARCH,
           peak_mib: float | None = None, rate: float | None = None,
           state: str = "COMPLETE") -> TrialRecord:
    measured = rate is not None or peak_mib is not None
    return TrialRecord(number=number, status=None if state in ("WAITING", "RUNNING") else
                       TrialStatus(status),
                       config=config, role=role, state=state,
                       value=rate if status == "ok" else 0.0,
                       constraint=0.0 if status == "ok" else 1.0,
                       measurement=Measurement(samples_per_sec=rate or 0.0,
                                               peak_memory_bytes=peak_mib * MIB if peak_mib
                                               else None) if measured else None)


def corner_of(params: dict) -> TrainConfig:
    return SPACE.fast_corner(params["micro_batch_size"])


def test_the_fast_corner_waits_for_the_baseline_then_steps_down_until_one_fits() -> None:
    asked: list[bool] = []

    def state_bytes() -> int:
        asked.append(True)
        return 10 * MIB

    limit = 1000 * MIB
    waiting = [record(0, BASELINE, "waiting", Role.BASELINE, state="WAITING")]
    assert next_corner(waiting, SPACE, limit, state_bytes) is None
    # The baseline's 1100 MiB at 1024 samples: all but the training state grows with them.
    trials = [record(0, BASELINE, "over_memory", Role.BASELINE, peak_mib=1100)]
    sizes = []
    for outcome in ("over_memory", "oom", "ok"):
        params = next_corner(trials, SPACE, limit, state_bytes)
        corner = corner_of(params)
        sizes.append(corner.micro_batch_size)
        assert (corner.precision, corner.activation_checkpointing, corner.optimizer_impl) == \
            ("bf16", "none", "fused")
        trials.append(record(len(trials), corner, outcome, Role.FAST_CORNER, peak_mib=1100))
    assert sizes == [512, 256, 128]
    assert next_corner(trials, SPACE, limit, state_bytes) is None  # one fitted: TPE goes on
    assert asked, "the training state is asked for once a baseline peak is known"


def test_without_a_memory_limit_the_corner_starts_at_the_largest_micro_batch() -> None:
    trials = [record(0, BASELINE, "ok", Role.BASELINE, rate=100.0)]
    assert corner_of(next_corner(trials, SPACE, None, lambda: 0)).micro_batch_size == 1024
    under_way = [*trials, record(1, BASELINE, "running", Role.FAST_CORNER, state="RUNNING")]
    assert next_corner(under_way, SPACE, None, lambda: 0) is None


def test_screening_threshold_is_a_share_of_the_best_full_rate_at_its_load() -> None:
    assert screen_below([]) is None
    trials = [record(0, BASELINE, "ok", rate=100.0), record(1, BASELINE, "ok", rate=300.0),
              record(2, BASELINE, "screened", rate=900.0), record(3, BASELINE, "oom")]
    assert screen_below(trials) == SCREEN_FRACTION * 300.0
    # and the load it was measured beside: none where its window was quiet, else that share
    assert screen_load([]) == 0.0 == screen_load(trials)
    busy = Measurement(samples_per_sec=300.0, other_cpu_share=0.17, disturbed=True)
    trials[1] = TrialRecord(**{**vars(trials[1]), "measurement": busy})
    assert screen_load(trials) == 0.17
    # an expert's first move is screened out by a quiet window only
    assert screen_load(trials, Role.BOTTLENECK) == 0.0 == screen_load(trials, Role.FAST_CORNER)


def test_the_loader_plan_follows_the_fastest_model_measured() -> None:
    rates = [LoaderRate(0, None, 10_000.0), LoaderRate(2, 2, 30_000.0)]
    slow = [record(0, BASELINE, "ok", rate=400.0)]
    chosen, consumption = planned_loader(slow, rates, workers_share_cores=False)
    assert chosen == rates[0] and consumption == 400.0
    fast = [*slow, record(1, BASELINE, "ok", rate=15_000.0)]
    assert planned_loader(fast, rates, workers_share_cores=False)[0] == rates[1]
    assert planned_loader(fast, rates, workers_share_cores=True) is None
