"""A study's results, read from its storage alone: what `show`, `export`, `studies` and the
report print. Nothing here runs a trial or needs the tuner."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from autotune.config import ConfigError
from autotune.formatting import format_disturbance, short_config
from autotune.memory_model import prediction_errors
from autotune.storage import JOURNAL_FILE, open_storage, study_dir
from autotune.trials import (
    RAN_OUT,
    Role,
    StudyKey,
    TrialRecord,
    TrialStatus,
    rankable,
    study_machines,
    trial_records,
)


def load_study(name: str, studies_dir: str | Path = "studies",
               storage: str | None = None) -> optuna.Study:
    """An existing study, read from the storage alone."""
    backend = open_storage(storage, study_dir(studies_dir, name), create=False)
    try:
        return optuna.load_study(study_name=name, storage=backend)
    except KeyError:
        raise ConfigError(f"no study named {name!r} in this storage") from None


def list_studies(studies_dir: str | Path = "studies",
                 storage: str | None = None) -> list[dict[str, Any]]:
    """The studies in a storage URL, or in every study folder of the embedded storage. A study
    folder that cannot be read is listed with the reason (`error`), the others as usual."""
    if storage:
        return _study_rows(open_storage(storage, Path(studies_dir)))
    rows = []
    for journal in sorted(Path(studies_dir).glob(f"*/{JOURNAL_FILE}")):
        try:
            rows += _study_rows(open_storage(None, journal.parent, create=False))
        except Exception as exc:  # one unreadable study never hides the others
            rows.append({"study": journal.parent.name, "trials": None, "created": None,
                         "model": None, "confirmed": None,
                         "error": str(exc) or type(exc).__name__})
    return rows


def _study_rows(backend: optuna.storages.BaseStorage) -> list[dict[str, Any]]:
    rows = []
    for s in optuna.get_all_study_summaries(backend, include_best_trial=False):
        rows.append({"study": s.study_name, "trials": s.n_trials,
                     "created": s.datetime_start.isoformat(timespec="seconds")
                     if s.datetime_start else None,
                     "model": s.user_attrs.get(StudyKey.IDENTITY, {}).get("model_path"),
                     "confirmed": bool((s.user_attrs.get(StudyKey.CONFIRMATION) or {})
                                       .get("winner"))})
    return rows


def study_summary(study: optuna.Study) -> dict[str, Any]:
    """Everything `show` prints, from the storage alone."""
    records = trial_records(study)
    states = Counter(r.state for r in records)
    statuses = Counter(r.status for r in records)
    attrs = study.user_attrs
    confirmation = attrs.get(StudyKey.CONFIRMATION)
    baseline_config = attrs.get(StudyKey.BASELINE_CONFIG)
    identity = attrs.get(StudyKey.IDENTITY, {})
    best = max(rankable(records), key=lambda r: r.value, default=None)
    disturbed = [r.number for r in records if r.disturbed and not r.duplicate]
    baseline_trial = next((r for r in records if r.role == Role.BASELINE and r.finished), None)
    probe = (attrs.get(StudyKey.PROBE) or {}).get("report") or {}
    summary: dict[str, Any] = {
        "study": study.study_name,
        "model": identity.get("model_path"),
        "model_args": identity.get("model_args"),
        "device": attrs.get(StudyKey.DEVICE_NAME),
        "devices": study_machines(attrs),
        "confirmed": bool(confirmation and confirmation.get("winner")),
        "best_config": None, "best_samples_per_sec": None, "best_spread": None,
        "best_trial": None, "best_peak_memory_bytes": None, "best_mfu": None,
        "baseline_config": baseline_config, "baseline_samples_per_sec": None,
        "speedup": None,
        "trials": dict(states), "statuses": dict(statuses),
        "oom_trials": sum(statuses.get(s, 0) for s in RAN_OUT),
        "retried_trials": sum(1 for r in records if r.retry > 0),
        "tuning_wall_s": attrs.get(StudyKey.TUNING_WALL_S),
        "free_batch": attrs.get(StudyKey.FREE_BATCH, False),
        "train_steps": (attrs.get(StudyKey.OBJECTIVE) or {}).get("train_steps"),
        "memory_predictions": prediction_errors(r for r in records if not r.duplicate),
        "loader_rates": attrs.get(StudyKey.LOADER_RATES),
        "baseline_trial": {"number": baseline_trial.number, "status": baseline_trial.status,
                           "message": baseline_trial.message} if baseline_trial else None,
        # knob values the capability probe found failing or pointless here, with the reason
        "left_out": probe.get("left_out", []),
        "warnings": [],
        "disturbed_trials": disturbed,
        "best_disturbed": bool(best and best.disturbed),
    }
    if summary["confirmed"]:
        winner, baseline = confirmation["winner"], confirmation["baseline"]
        fastest = confirmation.get("fastest") or winner
        ok_runs = [r for r in winner["runs"] if r["status"] == TrialStatus.OK]
        summary.update(
            best_config=winner["config"], best_samples_per_sec=winner["median"],
            best_spread=winner["spread"], best_trial=winner["trial"],
            best_runs=[r["samples_per_sec"] for r in ok_runs],
            best_peak_memory_bytes=max((r["peak_memory_bytes"] or 0) for r in ok_runs) or None,
            best_mfu=median_or_none([r["mfu"] for r in ok_runs]),
            baseline_samples_per_sec=baseline["median"], baseline_spread=baseline["spread"],
            speedup=confirmation["speedup"], speedup_ci=confirmation.get("speedup_ci"),
            no_measurable_difference=confirmation.get("no_measurable_difference"),
            confirmation_repeats=confirmation["repeats"],
            # the search's figure for the recommendation beside the confirmed one: the gap is
            # the winner's curse (the search keeps the luckiest measurement)
            best_search_samples_per_sec=winner.get("search_samples_per_sec"),
            fastest_config=fastest["config"], fastest_speedup=fastest.get("speedup"),
            fastest_speedup_ci=fastest.get("speedup_ci"),
            best_time_to_train_s=winner.get("time_to_train_s"),
            baseline_time_to_train_s=baseline.get("time_to_train_s"))
        summary["warnings"] += _confirmation_warnings(confirmation)
    elif best is not None:
        baseline = next((r for r in records if r.role == Role.BASELINE
                         and r.status == TrialStatus.OK), None)
        best_sps = best.samples_per_sec
        base_sps = baseline.samples_per_sec if baseline else None
        summary.update(
            best_config=best.config, best_samples_per_sec=best_sps, best_trial=best.number,
            best_peak_memory_bytes=best.peak_memory_bytes, best_mfu=best.get("mfu"),
            baseline_samples_per_sec=base_sps,
            speedup=best_sps / base_sps if best_sps and base_sps else None)
        if baseline is not None and baseline.disturbed and not best.disturbed:
            summary["warnings"].append(
                f"baseline trial #{baseline.number} {format_disturbance(baseline.other_cpu_share)}"
                "; its rate is low and the speedup overstated")
    summary["compile_payoff"] = compile_payoff(records, summary["best_trial"])
    if summary["free_batch"] and summary["best_config"] and baseline_config:
        best_eb = summary["best_config"]["micro_batch_size"] * \
            summary["best_config"]["grad_accum_steps"]
        base_eb = baseline_config["micro_batch_size"] * baseline_config["grad_accum_steps"]
        if best_eb != base_eb:
            summary["warnings"].append(f"the effective batch changed from {base_eb} to "
                                       f"{best_eb}: the learning rate may need rescaling")
    if len(summary["devices"]) > 1:
        summary["warnings"].append(
            f"trials were measured on {len(summary['devices'])} machines "
            f"({'; '.join(summary['devices'])}): rates from different machines are not "
            "comparable")
    if summary["best_disturbed"] and not summary["confirmed"]:
        summary["warnings"].append(
            "other processes used the CPUs while every trial that fitted was timed: the "
            "figures are low and their ranking uncertain; measure again on a quiet machine")
    return summary


def _confirmation_warnings(confirmation: dict[str, Any]) -> list[str]:
    """What the confirmation rounds say about the answer that a reader must not miss."""
    out = []
    fastest, winner = confirmation.get("fastest"), confirmation.get("winner")
    if confirmation.get("no_measurable_difference") is None and fastest and winner and \
            fastest["config"] != winner["config"]:
        rounds = confirmation["rounds"]
        out.append(f"the confirmation had time for {rounds} paired round"
                   f"{'s' if rounds != 1 else ''}, too few for an interval: whether the "
                   f"fastest measured ({fastest['speedup']:.2f}x in "
                   f"{'it' if rounds == 1 else 'them'}) is faster than the baseline is not "
                   "known, so the baseline is kept; give the run more time (--timeout) to "
                   "confirm it")
    if confirmation.get("disturbed_rounds"):
        out.append(f"{confirmation['disturbed_rounds']} of {confirmation['rounds']} confirmation "
                   "rounds ran while other processes used the CPUs (the machine stayed busy): "
                   "the figures are low; the speedup compares runs of the same rounds")
    drift = confirmation.get("drift")
    if drift and drift["beyond_noise"]:
        change = drift["end_samples_per_sec"] / drift["start_samples_per_sec"] - 1
        out.append(f"the machine drifted: the baseline measured "
                   f"{drift['start_samples_per_sec']:,.0f} samples/s at the start of the search "
                   f"and {drift['end_samples_per_sec']:,.0f} ({drift['end_range'][0]:,.0f}-"
                   f"{drift['end_range'][1]:,.0f}) in the confirmation rounds ({change:+.0%}, "
                   "beyond their spread); the speedup compares runs of the same rounds")
    return out


def compile_payoff(records: Sequence[TrialRecord],
                   best_trial: int | None) -> dict[str, Any] | None:
    """What compiling cost and gained, and after how many steps it pays for itself: for the
    best configuration when it is compiled, else for the compiled one that gained most."""
    rows = compile_rows(records)
    row = next((r for r in rows if r["trial"] == best_trial), None) or \
        max(rows, key=lambda r: r["gain"], default=None)
    if row is None:
        return None
    return {k: row[k] for k in ("trial", "reference", "compile_s", "gain", "break_even_steps")}


def compile_rows(records: Sequence[TrialRecord]) -> list[dict[str, Any]]:
    """For each measured compiled configuration: what compiling cost at start-up, what it
    gains per step, and the training steps after which it has paid for itself.

    The reference is the same configuration uncompiled when it was measured, else the fastest
    uncompiled one with the same precision and micro-batch, else with the same precision; a
    compiled trial with none of these is left out rather than credited with precision's gain.
    """
    ok = [r for r in records if r.status == TrialStatus.OK and not r.duplicate and r.config
          and r.samples_per_sec and r.time_to_first_step_s is not None]
    plain = [r for r in ok if r.config["compile_mode"] == "none"]
    rows = []
    for rec in ok:
        config = rec.config
        if config["compile_mode"] == "none":
            continue
        ref, how = _reference(rec, plain)
        if ref is None:
            continue
        compile_s = rec.time_to_first_step_s - ref.time_to_first_step_s
        gain = rec.samples_per_sec / ref.samples_per_sec - 1
        per_step = config["micro_batch_size"] * config["grad_accum_steps"]
        saved = per_step * (1 / ref.samples_per_sec - 1 / rec.samples_per_sec)
        rows.append({
            "label": f"#{rec.number} {config['compile_mode']}", "trial": rec.number,
            "config": short_config(config), "reference": f"#{ref.number} ({how})",
            "compile_s": compile_s, "gain": gain,
            "break_even_steps": max(0.0, compile_s) / saved if saved > 0 else None})
    return rows


def _twin_key(config: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(v for k, v in sorted(config.items()) if k != "compile_mode")


def _reference(rec: TrialRecord,
               plain: Sequence[TrialRecord]) -> tuple[TrialRecord | None, str]:
    config = rec.config

    def fastest(candidates: list[TrialRecord]) -> TrialRecord:
        return max(candidates, key=lambda r: r.samples_per_sec)

    twin = [r for r in plain if _twin_key(r.config) == _twin_key(config)]
    if twin:
        return fastest(twin), "same knobs, uncompiled"
    same = [r for r in plain if r.config["precision"] == config["precision"]]
    near = [r for r in same if r.config["micro_batch_size"] == config["micro_batch_size"]]
    if near:
        return fastest(near), "same precision and micro-batch"
    if same:
        return fastest(same), "same precision"
    return None, ""


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
