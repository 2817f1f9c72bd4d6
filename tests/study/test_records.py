"""Trial statuses and records: one spelling in the storage, one record per trial."""

from __future__ import annotations

import json

import optuna

from autotune.config import TrainConfig
from autotune.study.records import (
    COUNTS_AGAINST_BUDGET,
    FEASIBLE,
    INFEASIBLE,
    MEMORY_CONSTRAINT,
    RAN_OUT,
    TOO_BIG,
    TrialKey,
    TrialRecord,
    rankable,
    trial_records,
)
from autotune.study.storage import open_storage
from autotune.trial.protocol import Measurement, TrialStatus


def test_statuses_compare_and_hash_as_the_strings_the_storage_holds() -> None:
    assert "oom" in RAN_OUT and TrialStatus.OOM in RAN_OUT
    assert {"ok": 1}.get(TrialStatus.OK) == 1
    assert f"{TrialStatus.OVER_MEMORY}" == "over_memory" == str(TrialStatus.OVER_MEMORY)
    assert json.dumps({TrialStatus.OK: TrialStatus.SCREENED}) == '{"ok": "screened"}'
    assert RAN_OUT | {"oom_predicted"} == TOO_BIG
    assert not FEASIBLE & INFEASIBLE
    assert "oom_predicted" not in COUNTS_AGAINST_BUDGET  # predicted, never run
    assert "skipped" not in COUNTS_AGAINST_BUDGET


def _stored_study(tmp_path) -> optuna.Study:
    return optuna.create_study(study_name="s", storage=open_storage(None, tmp_path),
                               direction="maximize")


def _read_back(tmp_path) -> list[TrialRecord]:
    return trial_records(optuna.load_study(study_name="s", storage=open_storage(None, tmp_path)))


def test_a_record_is_built_from_a_stored_trial(tmp_path) -> None:
    study = _stored_study(tmp_path)
    trial = study.ask()
    config = TrainConfig(micro_batch_size=8)
    measurement = Measurement(samples_per_sec=120.0, mfu=0.3, peak_memory_bytes=2**20)
    for key, value in {TrialKey.CONFIG: config.to_dict(), TrialKey.STATUS: "ok",
                       TrialKey.ROLE: "baseline", TrialKey.MEASUREMENT: measurement.to_json(),
                       TrialKey.CONSTRAINT: 0.0}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 110.0)
    study.enqueue_trial({})
    record, waiting = _read_back(tmp_path)
    assert (record.number, record.status, record.role, record.config) == \
        (0, TrialStatus.OK, "baseline", config)
    assert record.measurement == measurement and record.label == "ok"
    assert record.samples_per_sec == 120.0 and record.peak_memory_bytes == 2**20
    assert record.feasible and record.score == 110.0 and record.measurement.mfu == 0.3
    assert record.start is not None and record.end >= record.start
    assert not record.duplicate and not record.disturbed
    assert waiting.status is None and waiting.label == "queued" and waiting.under_way
    assert waiting.score is None and waiting.measurement is None and waiting.samples_per_sec is None
    assert isinstance(waiting, TrialRecord) and waiting.config is None


def test_a_trial_stored_with_its_figures_as_attributes_of_their_own_still_reads(
        tmp_path) -> None:
    """Studies written before the measurement was one record kept each figure as a trial
    attribute beside the bookkeeping; they read into the same measurement."""
    study = _stored_study(tmp_path)
    for rate, share in ((100.0, 0.01), (300.0, 0.4)):
        trial = study.ask()
        for key, value in {"config": {"micro_batch_size": 8}, "status": "ok",
                           "role": "search", "constraint": 0.0, "stall_fraction": 0.1,
                           "samples_per_sec": rate, "peak_memory_bytes": 3 * 2**20,
                           "time_to_first_step_s": 1.5, "cpu_affinity": [0, 1],
                           "other_cpu_share": share, "disturbed": share > 0.05}.items():
            trial.set_user_attr(key, value)
        trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
        study.tell(trial, rate)
    clean, noisy = _read_back(tmp_path)
    assert clean.measurement == Measurement(
        samples_per_sec=100.0, peak_memory_bytes=3 * 2**20, time_to_first_step_s=1.5,
        cpu_affinity=(0, 1), other_cpu_share=0.01, disturbed=False)
    assert clean.config == TrainConfig(micro_batch_size=8) and clean.status == TrialStatus.OK
    assert noisy.disturbed and noisy.measurement.other_cpu_share == 0.4
    assert rankable([clean, noisy]) == [clean]


def test_only_clean_trials_are_ranked_while_there_are_any() -> None:
    def record(number: int, value: float, disturbed: bool, constraint: float = 0.0):
        return TrialRecord(number=number, status=TrialStatus.OK, value=value,
                           constraint=constraint,
                           measurement=Measurement(samples_per_sec=value, disturbed=disturbed))

    clean, noisy = record(0, 100.0, False), record(1, 300.0, True)
    too_big = record(2, 0.0, False, constraint=1.0)
    assert rankable([clean, noisy, too_big]) == [clean]
    assert rankable([noisy, too_big]) == [noisy]
    assert rankable([too_big]) == []
