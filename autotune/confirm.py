"""Confirmation: the reported samples/sec of the winner comes from fresh runs, not from the
luckiest search trial.

When the budget ends, the top configurations and the baseline are re-measured in fresh
processes, interleaved; the winner is the best median among those that fitted every time. The
baseline is a candidate too, so autotune never recommends something slower than what the user
has. Of several tuners ending together on one study, exactly one confirms.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.measure import time_to_train_s
from autotune.outcome import Scoring
from autotune.results import median_or_none
from autotune.trials import Role, StudyKey, TrialStatus, config_key, trial_records
from autotune.views import StudyView
from autotune.worker import Measure, MeasureJob

# Tuners ending together each claim the confirmation; the claim standing after this wins.
CLAIM_SETTLE_S = 1.0


def should_confirm(study: optuna.Study, owner: str, view: StudyView) -> bool:
    """Whether this tuner confirms: no other tuner is still running trials, nobody confirmed
    since the last trial, and this tuner's claim stood."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if any(t.user_attrs.get("owner") != owner for t in running):
        view.note("another tuner is still running trials of this study; the last one to "
                  "finish confirms the best")
        return False
    confirmed = (study.user_attrs.get(StudyKey.CONFIRMATION) or {}).get("at", 0)
    last = max((t.datetime_complete.timestamp() for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)) if t.datetime_complete), default=0)
    if confirmed > last:
        view.note("another tuner has confirmed the best since the last trial")
        return False
    study.set_user_attr(StudyKey.CONFIRMATION_CLAIM, owner)
    time.sleep(CLAIM_SETTLE_S)
    return study.user_attrs.get(StudyKey.CONFIRMATION_CLAIM) == owner


def candidates(study: optuna.Study, baseline: TrainConfig, top: int) -> dict[str, dict]:
    """The `top` best distinct feasible configurations, and the baseline (the reference for the
    speedup; the winner only if it also fitted in the search)."""
    chosen: dict[str, dict[str, Any]] = {}
    feasible = sorted((r for r in trial_records(study) if r.score is not None),
                      key=lambda r: r.value, reverse=True)
    for r in feasible:
        key = config_key(r.config)
        if len(chosen) < top and key not in chosen:
            chosen[key] = {"config": r.config, "trial": r.number, "feasible": True, "runs": []}
    key = config_key(baseline)
    if key not in chosen:
        measured = next((r for r in trial_records(study) if r.role == Role.BASELINE
                         and r.state == TrialState.COMPLETE.name), None)
        chosen[key] = {"config": baseline.to_dict(),
                       "trial": measured.number if measured else None,
                       "feasible": bool(measured and measured.feasible), "runs": []}
    return chosen


def confirm(study: optuna.Study, baseline: TrainConfig, scoring: Scoring, measure: Measure,
            view: StudyView, *, top: int, repeats: int, time_limit_s: float, device: str,
            directory: Path) -> dict[str, Any]:
    """Re-measure the top configurations and the baseline `repeats` times each, interleaved;
    stored in the study and returned."""
    entries = candidates(study, baseline, top)
    traces = directory / "traces"
    start = time.monotonic()
    for repeat in range(repeats):
        for index, entry in enumerate(entries.values()):
            view.note(f"confirming {index + 1}/{len(entries)}, run {repeat + 1}/{repeats}")
            job = MeasureJob(f"confirm-{index}-{repeat}", time_limit_s, device,
                             trace=traces / f"candidate-{index}.json" if repeat == 0 else None)
            result = measure(TrainConfig.from_dict(entry["config"]), job)
            status = scoring.classify(result)[0]
            ok = status == TrialStatus.OK
            entry["runs"].append({"status": str(status), **{
                k: result.metrics.get(k) for k in ("samples_per_sec", "peak_memory_bytes",
                                                   "mfu", "step_time_median_s")},
                "objective": scoring.objective_rate(result.metrics) if ok else None,
                "time_to_train_s": time_to_train_s(result.metrics, scoring.train_steps)
                if ok and scoring.train_steps else None})
            if repeat == 0:
                entry["trace"] = result.metrics.get("trace_path")
    for entry in entries.values():
        rates = [r["samples_per_sec"] for r in entry["runs"] if r["status"] == TrialStatus.OK]
        entry["ok"] = len(rates) == len(entry["runs"])
        entry["median"] = statistics.median(rates) if rates else None
        entry["spread"] = (max(rates) - min(rates)) / 2 if rates else None
        entry["objective"] = median_or_none([r["objective"] for r in entry["runs"]])
        entry["time_to_train_s"] = median_or_none([r["time_to_train_s"] for r in entry["runs"]])
    ranked = sorted((e for e in entries.values() if e["ok"] and e["feasible"]),
                    key=lambda e: e["objective"], reverse=True)
    reference = entries[config_key(baseline)]
    winner = ranked[0] if ranked else None
    confirmation = {"candidates": list(entries.values()), "repeats": repeats, "winner": winner,
                    "baseline": reference,
                    "speedup": (winner["median"] / reference["median"]
                                if winner and reference["median"] else None),
                    "wall_s": time.monotonic() - start, "at": time.time()}
    study.set_user_attr(StudyKey.CONFIRMATION, confirmation)
    return confirmation
