"""A trial whose tuner is gone is failed as orphaned and re-queued once; a live one is not."""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState

from autotune.search.heartbeat import alive, lost, recover_orphans, tuner_name
from autotune.study.storage import open_storage


def _running(study: optuna.Study, owner: str, retry: int = 0) -> int:
    study.enqueue_trial({"x": 1}, user_attrs={"retry": retry} if retry else None)
    trial = study.ask({"x": optuna.distributions.IntDistribution(0, 2)})
    trial.set_user_attr("owner", owner)
    trial.set_user_attr("heartbeat_s", 10.0)
    return trial.number


def test_a_dead_tuners_trial_is_failed_and_requeued_once(tmp_path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    assert not alive(int(gone))
    storage = open_storage(None, tmp_path)
    study = optuna.create_study(study_name="s", storage=storage)
    first = _running(study, f"{tuner_name().rpartition(':')[0]}:{gone}")
    retried = _running(study, f"{tuner_name().rpartition(':')[0]}:{gone}", retry=1)
    mine = _running(study, tuner_name())
    notes: list[str] = []
    recover_orphans(study, storage, tuner_name(), notes.append)
    trials = study.get_trials(deepcopy=False)
    for number in (first, retried):
        assert trials[number].state == TrialState.FAIL
        assert trials[number].user_attrs["status"] == "orphaned"
    assert trials[mine].state == TrialState.RUNNING
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert [t.user_attrs["requeued_from"] for t in queued] == [first]  # a retry is not re-run
    assert notes == [f"trial {first} lost its tuner (its process exited): re-queued",
                     f"trial {retried} lost its tuner (its process exited)"]


def test_a_trial_is_lost_when_its_heartbeat_is_three_intervals_old(tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path))
    number = _running(study, "another-host:1")
    trial = study.trials[number]
    now = time.time()
    assert lost(trial, tuner_name(), now) is None
    assert "no heartbeat for" in lost(trial, tuner_name(), now + 31)
