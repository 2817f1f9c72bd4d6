"""`autotune verify`: the study's answer measured again, now, against the baseline, in fresh
paired rounds (which of the two runs first alternates), and recorded in the study with whether
the claim still holds: the user's own check before they change their training, and what a
careful engineer runs on the target machine after tuning elsewhere."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna

from autotune.config import TrainConfig
from autotune.errors import ConfigError, ContractError, UsageError
from autotune.hardware import describe, parse_device
from autotune.options import VerifyOptions
from autotune.search.confirm import Candidate, paired, run_of
from autotune.search.events import StudyView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob, ProcessRunner
from autotune.search.worker import Measure
from autotune.study.confirmation import Confirmation
from autotune.study.records import StudyKey
from autotune.study.results import study_summary
from autotune.study.verification import Verification


def claim(study: optuna.Study) -> tuple[dict[str, Any], float | None,
                                        tuple[float, float] | None]:
    """What the study claims, to check: the recommendation and its speedup over the baseline,
    or, where the baseline was kept, the closest contender and its figure."""
    summary = study_summary(study)
    baseline = summary.baseline_config
    if not summary.best_config or baseline is None:
        raise ConfigError(f"study {study.study_name!r} has no answer to verify yet")
    if summary.best_config != baseline:
        interval = summary.confirmation.speedup_ci if summary.confirmation else None
        return summary.best_config, summary.speedup, interval
    stored = study.user_attrs.get(StudyKey.CONFIRMATION)
    contender = Confirmation.from_json(stored).contender if stored else None
    if contender is None:
        raise ConfigError(f"study {study.study_name!r} kept your settings and measured no "
                          "contender against them: nothing to verify")
    return contender.config, contender.speedup, contender.speedup_ci


def verify(study: optuna.Study, measure: Measure, scoring: Scoring, view: StudyView, *,
           rounds: int, time_limit_s: float, device: str, machine: str) -> Verification:
    """`rounds` fresh paired rounds of the claim's configuration and the baseline; the
    verification is appended to the study's and returned."""
    subject, claimed, claimed_ci = claim(study)
    baseline = study.user_attrs[StudyKey.BASELINE_CONFIG]
    pair = [Candidate(subject, None, True), Candidate(baseline, None, True)]
    for round_ in range(rounds):
        for index in (0, 1) if round_ % 2 == 0 else (1, 0):
            view.note(f"verifying: round {round_ + 1} of {rounds}, "
                      f"{'the answer' if index == 0 else 'your settings'}")
            job = MeasureJob(f"verify-{index}-{round_}", time_limit_s, device, profile=False,
                             round_run=True)
            pair[index].runs.append(
                run_of(measure(TrainConfig.from_dict(pair[index].config), job), scoring))
    ratio = paired(*pair, "samples_per_sec")
    verification = Verification(
        at=time.time(), machine=machine, subject=subject, baseline=baseline, rounds=rounds,
        speedup=ratio.value if ratio.rounds else None,
        speedup_ci=(ratio.low, ratio.high) if ratio.low is not None else None,
        claimed=claimed, claimed_ci=claimed_ci)
    study.set_user_attr(StudyKey.VERIFICATIONS, [
        *study.user_attrs.get(StudyKey.VERIFICATIONS, []), verification.to_json()])
    return verification


def verify_study(study: optuna.Study, options: VerifyOptions, directory: Path,
                 view: StudyView) -> Verification:
    """`autotune verify`: the study's model file measured in fresh processes through a fork
    server, on the device asked for (else the study's kind of device), within no memory limit
    but the device's own (the machine may not be the one that tuned)."""
    identity = study.user_attrs.get(StudyKey.IDENTITY) or {}
    model = identity.get("model_path")
    if not model or not Path(model).is_file():
        raise ContractError(f"study {study.study_name!r} was made for the model file {model}, "
                            "which is not here")
    try:
        device = parse_device(options.device or identity.get("device_type"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runner = ProcessRunner(model, identity.get("model_args") or {}, directory,
                           vars(options.settings), memory_limit_bytes=None, core_shares=None,
                           on_phase=lambda text, number: view.phase(text, number),
                           nproc_per_node=identity.get("nproc_per_node", 1))
    try:
        return verify(study, runner.measure, Scoring(device.type, None, 0.0, 0.0), view,
                      rounds=options.rounds, time_limit_s=options.time_limit_s,
                      device=str(device), machine=describe(device).name)
    finally:
        runner.close()
