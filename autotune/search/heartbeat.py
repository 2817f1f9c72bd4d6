"""Telling a dead tuner's trials from slow ones: every running trial is stamped with the time
at an interval, and any tuner fails (and re-queues once) a RUNNING trial whose tuner is gone."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autotune.options import DEFAULT_HEARTBEAT_S
from autotune.study.records import TrialKey
from autotune.study.storage import trial_id
from autotune.trial.protocol import TrialStatus

# A trial whose heartbeat is this many of its intervals old has lost its tuner.
STALE_HEARTBEATS = 3
# A trial whose tuner died is run again this many times at most (a configuration that kills
# its tuner, say by exhausting the node's memory, must not do so forever).
MAX_RETRIES = 1


def tuner_name() -> str:
    """This tuner process, as written in its trials' `owner`."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """Stamps this tuner's running trials with the time every `interval_s`, so that tuners on
    any host can tell a trial whose tuner died (or whose node was lost) from a slow one."""

    def __init__(self, storage: Any, interval_s: float) -> None:
        self.storage, self.interval_s = storage, interval_s
        self._trials: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autotune-heartbeat",
                                        daemon=True)
        self._thread.start()

    def add(self, tid: int) -> None:
        with self._lock:
            self._trials.add(tid)
        self._beat(tid)

    def discard(self, tid: int) -> None:
        with self._lock:
            self._trials.discard(tid)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _beat(self, tid: int) -> None:
        # A missed beat is retried at the next interval; a finished trial needs none.
        with contextlib.suppress(Exception):
            self.storage.set_trial_user_attr(tid, TrialKey.HEARTBEAT, time.time())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                trials = list(self._trials)
            for tid in trials:
                self._beat(tid)


def recover_orphans(study: optuna.Study, storage: Any, owner: str,
                    note: Callable[[str], None]) -> None:
    """RUNNING trials whose tuner is gone (its process on this host exited, or, on any host,
    its heartbeat stopped): failed as `orphaned`, and their configuration queued again once."""
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        reason = lost(trial, owner, now)
        if reason is None:
            continue
        retry = trial.user_attrs.get(TrialKey.RETRY, 0)
        again = retry < MAX_RETRIES
        tid = trial_id(storage, study.study_name, trial.number)
        try:
            storage.set_trial_user_attr(tid, TrialKey.STATUS, str(TrialStatus.ORPHANED))
            storage.set_trial_user_attr(
                tid, TrialKey.MESSAGE, f"its tuner died ({reason}); " +
                ("re-queued" if again else "not re-queued: it was already a retry"))
            storage.set_trial_state_values(tid, TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue  # another tuner recovered it first
        if again:
            requeue(study, trial, retry + 1)
        note(f"trial {trial.number} lost its tuner ({reason})" + (": re-queued" if again else ""))


def lost(trial: FrozenTrial, owner: str, now: float) -> str | None:
    """Why a RUNNING trial has no live tuner, or None while it has one (or is `owner`'s)."""
    its_owner = trial.user_attrs.get(TrialKey.OWNER, "")
    if its_owner == owner:
        return None
    host, _, pid = its_owner.rpartition(":")
    if host == socket.gethostname() and pid.isdigit() and not alive(int(pid)):
        return "its process exited"
    interval = trial.user_attrs.get(TrialKey.HEARTBEAT_S, DEFAULT_HEARTBEAT_S)
    start = trial.datetime_start.timestamp() if trial.datetime_start else now
    silent = now - trial.user_attrs.get(TrialKey.HEARTBEAT, start)
    if silent > STALE_HEARTBEATS * interval:
        return f"no heartbeat for {silent:.0f} s"
    return None


def requeue(study: optuna.Study, trial: FrozenTrial, retry: int) -> None:
    """Queue the trial's configuration again, remembering what it re-runs."""
    attrs = {TrialKey.REQUEUED_FROM: trial.number, TrialKey.RETRY: retry}
    for key in (TrialKey.ROLE, TrialKey.CHANGED):
        if trial.user_attrs.get(key):
            attrs[key] = trial.user_attrs[key]
    study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def alive(pid: int) -> bool:
    """Whether a process of this host is running (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True
