"""Trial statuses and records: one spelling in the storage, one record per trial."""

from __future__ import annotations

import json

import optuna

from autotune.study.records import (
    COUNTS_AGAINST_BUDGET,
    FEASIBLE,
    INFEASIBLE,
    RAN_OUT,
    TOO_BIG,
    TrialRecord,
    rankable,
    trial_records,
)
from autotune.study.storage import open_storage
from autotune.trial.protocol import TrialStatus


def test_statuses_compare_and_hash_as_the_strings_the_storage_holds() -> None:
    assert "oom" in RAN_OUT and TrialStatus.OOM in RAN_OUT
    assert {"ok": 1}.get(TrialStatus.OK) == 1
    assert f"{TrialStatus.OVER_MEMORY}" == "over_memory" == str(TrialStatus.OVER_MEMORY)
    assert json.dumps({TrialStatus.OK: TrialStatus.SCREENED}) == '{"ok": "screened"}'
    assert RAN_OUT | {"oom_predicted"} == TOO_BIG
    assert not FEASIBLE & INFEASIBLE
    assert "oom_predicted" not in COUNTS_AGAINST_BUDGET  # predicted, never run
    assert "skipped" not in COUNTS_AGAINST_BUDGET


def test_a_record_is_built_from_a_stored_trial(tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path),
                                direction="maximize")
    trial = study.ask()
    config = {"micro_batch_size": 8}
    for key, value in {"config": config, "status": "ok", "role": "baseline",
                       "samples_per_sec": 120.0, "constraint": 0.0, "mfu": 0.3}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 110.0)
    study.enqueue_trial({})
    record, waiting = trial_records(optuna.load_study(study_name="s",
                                                      storage=open_storage(None, tmp_path)))
    assert (record.number, record.status, record.role, record.config) == \
        (0, "ok", "baseline", config)
    assert record.feasible and record.score == 110.0 and record.get("mfu") == 0.3
    assert record.start is not None and record.end >= record.start
    assert not record.duplicate and record.to_dict()["score"] == 110.0
    assert waiting.status == "waiting" and waiting.under_way and waiting.score is None
    assert isinstance(waiting, TrialRecord) and waiting.config is None


def test_only_clean_trials_are_ranked_while_there_are_any() -> None:
    def record(number: int, value: float, disturbed: bool, constraint: float = 0.0):
        return TrialRecord(number=number, status="ok", value=value, constraint=constraint,
                           disturbed=disturbed)

    clean, noisy = record(0, 100.0, False), record(1, 300.0, True)
    too_big = record(2, 0.0, False, constraint=1.0)
    assert rankable([clean, noisy, too_big]) == [clean]
    assert rankable([noisy, too_big]) == [noisy]
    assert rankable([too_big]) == []
