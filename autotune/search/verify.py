"""`autotune verify`: the study's answer measured again, now, against the baseline, in paired
rounds (which of the two runs first alternates) of warm turns where memory holds both, else of
fresh processes, and recorded in the study with whether
the claim still holds: the user's own check before they change their training, and what a
careful engineer runs on the target machine after tuning elsewhere."""

from __future__ import annotations

import time
from pathlib import Path

import optuna

from autotune.config import TrainConfig
from autotune.errors import ConfigError, ContractError, UsageError
from autotune.hardware import describe, parse_device
from autotune.options import VerifyOptions
from autotune.search.contenders import Candidate, paired, rate, run_of
from autotune.search.events import StudyView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob, ProcessRunner
from autotune.search.warm import (
    WARM_ROUNDS_PER_ROUND,
    WARM_WORTH_ROUNDS,
    PairJudge,
    WarmRounds,
    WarmStart,
    warm_or_why,
    warm_start,
)
from autotune.search.worker import Measure
from autotune.study.confirmation import FRESH_ROUNDS, WARM_TURNS, Run, stored_confirmation
from autotune.study.records import StudyKey, config_key, trial_records
from autotune.study.results import study_identity, study_summary
from autotune.study.verification import Verification
from autotune.trial.protocol import ProbeReport

# A round of warm turns that is not a pair (`PairJudge`) is taken again at most this many
# times (then kept: a verification has no time cap to wait a load out in).
RETAKES = 3


def claim(study: optuna.Study
          ) -> tuple[TrainConfig, float | None, tuple[float, float] | None, bool]:
    """What the study claims, to check: the recommendation and its speedup over the baseline,
    or, where the baseline was kept (the last, True), the closest contender and its figure."""
    summary = study_summary(study)
    baseline = summary.baseline_config
    if not summary.best_config or baseline is None:
        raise ConfigError(f"study {study.study_name!r} has no answer to verify yet")
    if summary.best_config != baseline:
        interval = summary.confirmation.speedup_ci if summary.confirmation else None
        return summary.best_config, summary.speedup, interval, False
    confirmation = stored_confirmation(study.user_attrs.get(StudyKey.CONFIRMATION))
    contender = confirmation.contender if confirmation else None
    if contender is None:
        raise ConfigError(f"study {study.study_name!r} kept your settings and measured no "
                          "contender against them: nothing to verify")
    return contender.config, contender.speedup, contender.speedup_ci, True


def verify(study: optuna.Study, measure: Measure, scoring: Scoring, view: StudyView, *,
           rounds: int, time_limit_s: float, device: str, machine: str,
           warm: WarmStart | None = None) -> Verification:
    """`rounds` paired rounds of the claim's configuration and the baseline (which runs first
    alternates): `WARM_ROUNDS_PER_ROUND` times as many in warm turns where `warm` starts them,
    memory holds both and more than `WARM_WORTH_ROUNDS` are asked, else in fresh processes;
    the verification is appended to the study's and returned."""
    subject, claimed, claimed_ci, kept = claim(study)
    baseline = TrainConfig.from_dict(study.user_attrs[StudyKey.BASELINE_CONFIG])
    pair = [Candidate(subject, None, True), Candidate(baseline, None, True)]
    turns = None
    if rounds > WARM_WORTH_ROUNDS:  # one or two fresh rounds cost less than warm processes
        turns, why = warm_or_why(warm, [subject, baseline],
                                 [_search_peak(study, subject), _search_peak(study, baseline)],
                                 "verify")
        view.note(why)
    try:
        rounds = rounds * WARM_ROUNDS_PER_ROUND if turns is not None else rounds
        judge = PairJudge()
        for round_ in range(rounds):
            order = (0, 1) if round_ % 2 == 0 else (1, 0)
            for retake in range(RETAKES + 1):  # warm turns that are not a pair (`PairJudge`)
                runs = {index: _measure(pair[index].config, index, round_, rounds, turns,
                                        measure, scoring, view, time_limit_s, device)
                        for index in order}
                if turns is None or judge.keeps(list(runs.values())) or retake == RETAKES:
                    break
            for index in order:
                pair[index].runs.append(runs[index])
    finally:
        if turns is not None:
            turns.close()
    ratio = paired(*pair, rate)
    verification = Verification(
        at=time.time(), machine=machine, subject=subject, baseline=baseline, rounds=rounds,
        speedup=ratio.value if ratio.rounds else None,
        speedup_ci=(ratio.low, ratio.high) if ratio.low is not None else None,
        claimed=claimed, claimed_ci=claimed_ci,
        measured=WARM_TURNS if turns is not None else FRESH_ROUNDS, kept=kept)
    study.set_user_attr(StudyKey.VERIFICATIONS, [
        *study.user_attrs.get(StudyKey.VERIFICATIONS, []), verification.to_json()])
    return verification


def _measure(config: TrainConfig, index: int, round_: int, rounds: int,
             turns: WarmRounds | None, measure: Measure, scoring: Scoring, view: StudyView,
             time_limit_s: float, device: str) -> Run | None:
    """One run of the pair: a warm turn, or a fresh process with a note."""
    if turns is not None:
        return turns.turn(index)
    view.note(f"verifying: round {round_ + 1} of {rounds}, "
              f"{'the answer' if index == 0 else 'your settings'}")
    job = MeasureJob(f"verify-{index}-{round_}", time_limit_s, device, profile=False,
                     round_run=True)
    return run_of(measure(config, job), scoring)


def _search_peak(study: optuna.Study, config: TrainConfig) -> float | None:
    """The largest peak memory the study measured for `config` (what its warm process needs):
    in its trials, or in the confirmation's rounds (an answer less some changes has no trial
    of its own)."""
    peaks = [r.measurement.peak_memory_bytes for r in trial_records(study)
             if r.measurement is not None and config_key(r.config) == config_key(config)]
    confirmation = stored_confirmation(study.user_attrs.get(StudyKey.CONFIRMATION))
    peaks += [run.peak_memory_bytes for c in (confirmation.candidates if confirmation else ())
              if c.config == config for run in c.ok_runs()]
    return max((p for p in peaks if p), default=None)


def verify_study(study: optuna.Study, options: VerifyOptions, directory: Path,
                 view: StudyView) -> Verification:
    """`autotune verify`: the study's model file measured in fresh processes through a fork
    server, on the device asked for (else the study's kind of device), within no memory limit
    but the device's own (the machine may not be the one that tuned)."""
    identity = study_identity(study)
    if identity is None:
        raise ContractError(f"study {study.study_name!r} does not record what it was made for "
                            "(its first run ended before it did)")
    if not Path(identity.target.path).is_file():
        raise ContractError(f"study {study.study_name!r} was made for the "
                            f"{identity.target.noun} {identity.target.path}, which is not here")
    try:
        device = parse_device(options.device or identity.device_type)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    runner = ProcessRunner(identity.target, directory, options.settings,
                           memory_limit_bytes=None, core_shares=None,
                           on_phase=lambda text, number: view.phase(text, number),
                           nproc_per_node=identity.nproc_per_node)
    probe = (study.user_attrs.get(StudyKey.PROBE) or {}).get("report")
    if probe:
        runner.preload(ProbeReport.from_dict(probe))
    try:
        return verify(study, runner.measure, Scoring(device.type, None, 0.0, 0.0), view,
                      rounds=options.rounds, time_limit_s=options.time_limit_s,
                      device=str(device), machine=describe(device).name,
                      warm=warm_start(runner, str(device), options.time_limit_s))
    finally:
        runner.close()
