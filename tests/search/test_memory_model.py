"""Peak memory against the micro-batch, per memory family: fits, predicted OOMs, walls."""

from __future__ import annotations

import pytest

from autotune.config import TrainConfig
from autotune.search.memory_model import MemoryModel, largest_fitting_micro
from autotune.study.records import TrialRecord, config_key
from autotune.trial.protocol import Measurement, TrialStatus

MIB = 2**20


def config(micro: int, precision: str = "fp32") -> TrainConfig:
    return TrainConfig(micro_batch_size=micro, precision=precision)


def trial(number: int, micro: int, status: str, peak_mib: float | None = None,
          precision: str = "fp32", predicted: float | None = None) -> TrialRecord:
    peak = peak_mib * MIB if peak_mib else None
    return TrialRecord(number=number, status=TrialStatus(status), config=config(micro, precision),
                       measurement=Measurement(samples_per_sec=1.0, peak_memory_bytes=peak)
                       if status in ("ok", "over_memory") else None,
                       predicted_peak_bytes=predicted)


def test_memory_model_fits_a_line_per_family_and_skips_what_cannot_fit() -> None:
    model = MemoryModel([trial(0, 8, "ok", 300), trial(1, 16, "ok", 400),
                         trial(2, 8, "ok", 250, precision="bf16")])
    big = config(64)
    assert model.predict(big) == pytest.approx(1000 * MIB)
    assert model.predict(config(64, "bf16")) is None  # one point
    verdict = model.verdict(big, limit_bytes=800 * MIB)
    assert verdict is not None and verdict.predicted_peak_bytes == pytest.approx(1000 * MIB)
    assert "0.98 GiB" in verdict.message and "2 measured trials" in verdict.message
    # Within the margin the trial is run: the line may be off by a few percent.
    assert model.verdict(big, limit_bytes=980 * MIB) is None
    assert model.verdict(config(32), limit_bytes=800 * MIB) is None


def test_memory_model_stops_at_an_out_of_memory_wall_once_memory_grows() -> None:
    model = MemoryModel([trial(0, 8, "ok", 300), trial(1, 16, "ok", 320), trial(3, 32, "oom")])
    wall = model.verdict(config(64), limit_bytes=None)
    assert wall is not None and wall.wall_trial == 3
    assert model.verdict(config(24), limit_bytes=None) is None
    # Without a fit that grows (one point, or a CPU peak falling with the micro-batch) an
    # out-of-memory trial says nothing about larger ones.
    alone = MemoryModel([trial(0, 8, "ok", 300), trial(3, 32, "oom")])
    assert alone.verdict(config(64), limit_bytes=None) is None
    falling = MemoryModel([trial(0, 8, "oom"), trial(1, 16, "ok", 320), trial(2, 32, "ok", 300)])
    assert falling.verdict(config(64), limit_bytes=None) is None


def test_one_measured_peak_bounds_the_first_micro_batch_tried() -> None:
    # 100 MiB of training state; the other 200 MiB at micro-batch 8 grow with it.
    def fits(limit_mib: int) -> int:
        return largest_fitting_micro([4, 8, 16, 32, 64], 300 * MIB, 8, 100 * MIB,
                                     limit_mib * MIB)
    assert fits(900) == 32 and fits(2000) == 64 and fits(500) == 16 and fits(120) == 4


def test_a_worst_batch_measured_raises_its_configurations_point_of_the_line() -> None:
    """A confirmation that measured micro-batch 16's worst batch at 600 MiB: the family's line
    goes through it, not through its random windows' 400 MiB."""
    records = [trial(0, 8, "ok", 300), trial(1, 16, "ok", 400)]
    worst = {config_key(config(16)): 600 * MIB}
    assert MemoryModel(records).predict(config(32)) == pytest.approx(600 * MIB)
    assert MemoryModel(records, worst).predict(config(32)) == pytest.approx(1200 * MIB)
