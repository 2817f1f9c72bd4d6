"""A study's results, read from its storage alone: what `show`, `export`, `studies` and the
report print. Nothing here runs a trial or needs the tuner."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import CONDITIONS, DISTRIBUTED_KNOBS, TrainConfig, knob_names
from autotune.errors import ConfigError
from autotune.formatting import format_disturbance, format_seconds, mfu_basis, short_config
from autotune.study.bottleneck import Diagnosis, before_and_after, diagnose, holds_larger_batch
from autotune.study.checks import ruled_out_status
from autotune.study.confirmation import Confirmation, stored_confirmation
from autotune.study.records import (
    MEASURED_PEAK,
    RAN_OUT,
    Role,
    StudyKey,
    TrialRecord,
    rankable,
    study_machines,
    trial_records,
)
from autotune.study.storage import JOURNAL_FILE, open_storage, study_dir
from autotune.study.summary import (
    BaselineTrial,
    CompilePayoff,
    CompileRow,
    ConfirmedFigures,
    MemoryPredictions,
    ProcessGroupFigures,
    RuledOut,
    StudySummary,
    TrialTimes,
)
from autotune.study.verdict import checks_verdict, confirmed_verdict, search_verdict
from autotune.study.verification import Verification
from autotune.trial.protocol import (
    LeftOut,
    LoaderRate,
    ScriptAnswer,
    StudyIdentity,
    TrialStatus,
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
                     "model": identity.target.path if (identity := _identity(s.user_attrs))
                     else None,
                     "confirmed": stored_confirmation(s.user_attrs.get(StudyKey.CONFIRMATION))
                     is not None})
    return rows


def study_identity(study: optuna.Study) -> StudyIdentity | None:
    """What the study measures, or None for a study whose first run has not recorded it."""
    return _identity(study.user_attrs)


def _identity(attrs: dict[str, Any]) -> StudyIdentity | None:
    stored = attrs.get(StudyKey.IDENTITY)
    return StudyIdentity.from_json(stored) if stored else None


def trial_times(records: Iterable[TrialRecord]) -> tuple[TrialTimes, ...]:
    """Each measured trial's wall time, phase by phase (trials that recorded them)."""
    return tuple(
        TrialTimes(r.number, r.wall_s, max(0.0, r.wall_s - r.measurement.measure_wall_s)
                   if r.wall_s and r.measurement.measure_wall_s is not None else None,
                   r.measurement.phases)
        for r in records if not r.duplicate and r.measurement and r.measurement.phases)


def study_summary(study: optuna.Study) -> StudySummary:
    """Everything `show` prints, from the storage alone."""
    every = trial_records(study)
    # A trial left queued (WAITING) is no run's work in progress: it runs when the same command
    # runs again, and is listed as such, not counted among the trials.
    records = [r for r in every if r.state != TrialState.WAITING.name]
    statuses = Counter(r.label for r in records)
    attrs = study.user_attrs
    confirmation = stored_confirmation(attrs.get(StudyKey.CONFIRMATION))
    stored_baseline = attrs.get(StudyKey.BASELINE_CONFIG)
    baseline_config = TrainConfig.from_dict(stored_baseline) if stored_baseline else None
    identity = _identity(attrs)
    best = max(rankable(records), key=lambda r: r.value, default=None)
    baseline_trial = next((r for r in records if r.role == Role.BASELINE and r.finished), None)
    probe = (attrs.get(StudyKey.PROBE) or {}).get("report") or {}
    rates = attrs.get(StudyKey.LOADER_RATES)
    warnings: list[str] = []
    if confirmation is not None:
        figures = _confirmed_figures(confirmation)
        warnings += _confirmation_warnings(confirmation)
    else:
        figures = _search_figures(records, best, warnings)
    best_config = figures.pop("best_config")
    verdict = confirmed_verdict(confirmation, baseline_config or confirmation.baseline.config) \
        if confirmation is not None else \
        search_verdict(best_config, figures["speedup"], baseline_config,
                       tried=any(r.role != Role.BASELINE for r in records))
    best_trial = figures["best_trial"]
    payoff = compile_payoff(records, best_trial, best_config)
    if confirmation is not None:
        payoff = confirmed_payoff(payoff, confirmation, best_config)
    if said := compile_sentence(best_config, baseline_config, payoff):
        verdict = f"{verdict.rstrip('.')}. {said}"
    if confirmation is not None and (said := checks_verdict(
            confirmation, baseline_config or confirmation.baseline.config)):
        verdict = f"{verdict.rstrip('.')}. {said}"
    if unknown := _left_unknown(attrs.get(StudyKey.SHORT_BUDGET), figures.get("confirmation")):
        verdict = f"{verdict.rstrip('.')}. {unknown}"
    limit = (attrs.get(StudyKey.MEMORY) or {}).get("limit_bytes")
    space = attrs.get(StudyKey.SPACE)
    diagnosis = _diagnosis(baseline_trial, limit, space)
    answer_diagnosis = _diagnosis(_profiled(records, best_config), limit, space) \
        if best_config is not None and best_config != baseline_config else None
    if diagnosis and (words := before_and_after(diagnosis, answer_diagnosis)):
        verdict = f"{words[0].upper()}{words[1:]}. {verdict}"
    devices = study_machines(attrs)
    objective = attrs.get(StudyKey.OBJECTIVE) or {}
    warnings += _run_warnings(attrs, best_config, baseline_config, baseline_trial, payoff,
                              probe.get("script_run_steps"))
    best_disturbed = bool(best and best.disturbed)
    if best_disturbed and confirmation is None:
        warnings.append(
            "other processes used the CPUs while every trial that fitted was timed: the "
            "figures are low and their ranking uncertain; measure again on a quiet machine")
    return StudySummary(
        study=study.study_name, target=identity.target if identity else None,
        device=attrs.get(StudyKey.DEVICE_NAME), devices=tuple(devices),
        nproc_per_node=identity.nproc_per_node if identity else 1,
        best_config=best_config, baseline_config=baseline_config,
        knobs=applicable_knobs(attrs.get(StudyKey.SPACE), best_config, baseline_config,
                               identity.nproc_per_node if identity else 1),
        verdict=verdict,
        trials=dict(Counter(r.state for r in records)), statuses=dict(statuses),
        oom_trials=sum(statuses.get(s, 0) for s in RAN_OUT),
        retried_trials=sum(1 for r in records if r.retry > 0),
        tuning_wall_s=attrs.get(StudyKey.TUNING_WALL_S),
        free_batch=attrs.get(StudyKey.FREE_BATCH, False),
        train_steps=objective.get("train_steps"),
        memory_predictions=prediction_errors(r for r in records if not r.duplicate),
        loader_rates=tuple(LoaderRate(**r) for r in rates) if rates is not None else None,
        baseline_trial=BaselineTrial(baseline_trial.number, baseline_trial.label,
                                     baseline_trial.message) if baseline_trial else None,
        # knob values the capability probe found failing or pointless here, with the reason
        left_out=tuple(LeftOut(**x) for x in probe.get("left_out", [])),
        convolutional=bool(probe.get("convolutional")),
        warnings=tuple(warnings),
        queued_trials=tuple(r.number for r in every if r.state == TrialState.WAITING.name),
        disturbed_trials=tuple(r.number for r in records if r.disturbed and not r.duplicate),
        best_disturbed=best_disturbed, compile_payoff=payoff,
        diagnosis=diagnosis, answer_diagnosis=answer_diagnosis,
        device_type=identity.device_type if identity else None,
        best_mfu_basis=_mfu_basis(records, best_trial)
        if identity and identity.device_type == "cuda" else None,
        trial_times=trial_times(records),
        probe_s=(attrs.get(StudyKey.PROBE) or {}).get("wall_s"),
        verifications=tuple(Verification.from_json(v)
                            for v in attrs.get(StudyKey.VERIFICATIONS, [])),
        process_group=process_group_figures(
            next((r for r in records if r.number == best_trial), None)),
        script_answer=script_answer(records, best_config, confirmation),
        **figures)


def _run_warnings(attrs: dict, best_config: TrainConfig | None,
                  baseline_config: TrainConfig | None, baseline_trial: TrialRecord | None,
                  payoff: CompilePayoff | None, script_run_steps: int | None) -> list[str]:
    """What the study's runs leave a reader to know beside the verdict: an effective batch
    that changed, trials measured on several machines, a run shorter than what was measured."""
    warnings = []
    if attrs.get(StudyKey.FREE_BATCH, False) and best_config and baseline_config:
        best_eb, base_eb = best_config.effective_batch_size, baseline_config.effective_batch_size
        if best_eb != base_eb:
            warnings.append(f"the effective batch changed from {base_eb} to {best_eb}: the "
                            "learning rate may need rescaling")
    devices = study_machines(attrs)
    if len(devices) > 1:
        warnings.append(f"trials were measured on {len(devices)} machines "
                        f"({'; '.join(devices)}): rates from different machines are not "
                        "comparable")
    train_steps = (attrs.get(StudyKey.OBJECTIVE) or {}).get("train_steps")
    measured = baseline_trial.measurement if baseline_trial else None
    short = shorter_than_measured(
        script_run_steps,
        1 + measured.warmup_steps + measured.window_steps if measured else None,
        train_steps) or _short_run(script_run_steps, best_config, payoff, train_steps)
    if short:
        warnings.append(short)
    return warnings


def _diagnosis(record: TrialRecord | None, memory_limit: int | None,
               space: Mapping[str, Any] | None) -> Diagnosis | None:
    """Where `record`'s step goes, the memory left pointing to a larger micro-batch only where
    the study's space (`space`, as stored) holds one."""
    if record is None or not record.measurement or record.config is None:
        return None
    micros = ((space or {}).get("domains") or {}).get("micro_batch_size")
    return diagnose(record.measurement, memory_limit,
                    holds_larger_batch(micros, record.config.micro_batch_size))


def _profiled(records: Iterable[TrialRecord], config: TrainConfig) -> TrialRecord | None:
    """The last trial of `config` measured with a profile: where its step's time goes."""
    return next((r for r in reversed(list(records)) if r.config == config and r.measurement
                 and r.measurement.host_syncs_per_step is not None and not r.duplicate), None)


def script_answer(records: list[TrialRecord], config: TrainConfig | None,
                  confirmation: Confirmation | None = None) -> ScriptAnswer | None:
    """A script study's answer in the script's own terms: what the last measured trial of
    `config` found the script must change to run it, else what its confirmation rounds said
    (an answer less some changes of the race's best has no trial of its own)."""
    answers = [r.measurement.script_answer for r in records
               if r.config == config and r.measurement is not None
               and r.measurement.script_answer is not None]
    said = [c.script_answer for c in (confirmation.candidates if confirmation else ())
            if c.config == config and c.script_answer is not None]
    return answers[-1] if answers else said[0] if said else None


def applicable_knobs(space: Mapping[str, Any] | None, best: TrainConfig | None,
                     baseline: TrainConfig | None, nproc_per_node: int) -> tuple[str, ...]:
    """The knobs worth a row: the batch, those the study searched (more than one value) that
    mean something for the baseline or the best (`CONDITIONS`), and any the best changes. A
    study from before the space was stored shows all but a process group's knobs, which one
    process has not."""
    configs = [c.to_dict() for c in (baseline, best) if c is not None]
    domains = (space or {}).get("domains")
    shown = []
    for knob in knob_names():
        changed = len({json.dumps(c[knob]) for c in configs}) > 1
        if domains is None:
            searched = nproc_per_node > 1 or knob not in DISTRIBUTED_KNOBS
        else:
            searched = knob in ("micro_batch_size", "grad_accum_steps") or \
                len(domains.get(knob, ())) > 1
        meaningful = knob not in CONDITIONS or any(CONDITIONS[knob].holds(c) for c in configs)
        if changed or (searched and meaningful):
            shown.append(knob)
    return tuple(shown)


def process_group_figures(record: TrialRecord | None) -> ProcessGroupFigures | None:
    """The ranks' own figures of a process group's trial (None for a trial of one process)."""
    m = record.measurement if record else None
    if m is None or m.world_size <= 1:
        return None
    return ProcessGroupFigures(
        world_size=m.world_size, rank_samples_per_sec=m.rank_samples_per_sec,
        rank_peak_memory_bytes=m.rank_peak_memory_bytes,
        communication_fraction=m.communication_fraction, straggler_rank=m.straggler_rank)


def _left_unknown(short: Mapping[str, Any] | None, confirmed: ConfirmedFigures | None) -> str:
    """What a budget too short for an answer (the default grown its most, or a given
    `--budget`) left unknown, and the flag that would answer it; nothing where the rounds gave
    an interval anyway."""
    if not short or (confirmed is not None and confirmed.speedup_ci is not None):
        return ""
    kept = (f"--budget {format_seconds(short['budget_s'])}" if short.get("fixed") else
            f"the default budget grown to {format_seconds(short['budget_s'])}, its most")
    return (f"Left unknown: the speedup's interval (an answer needs "
            f"{format_seconds(short['needed_s'])}, the run kept {kept}); "
            f"`{short.get('flag') or '--timeout ' + short['timeout']}` would answer it.")


def _mfu_basis(records: Sequence[TrialRecord], number: int | None) -> str | None:
    """What the best trial's MFU divided by what (the confirmation's runs of it divide the
    same FLOPs a sample by the same peak)."""
    m = next((r.measurement for r in records if r.number == number), None)
    if m is None:
        return None
    return mfu_basis(m.flops_per_sample, m.flops_source, m.peak_flops, m.peak_flops_source)


def _confirmed_figures(confirmation: Confirmation) -> dict[str, Any]:
    """The recommendation's and the baseline's figures from the paired rounds."""
    winner, baseline = confirmation.winner, confirmation.baseline
    fastest = confirmation.fastest or winner
    ok_runs = winner.ok_runs()
    worst = winner.worst_batch
    return {
        "best_config": winner.config, "best_samples_per_sec": winner.median,
        "best_spread": winner.spread, "best_trial": winner.trial,
        # the larger of its rounds' peaks and its worst batch's: what a whole run needs
        "best_peak_memory_bytes": winner.peak_memory_bytes,
        "best_worst_batch_peak_bytes": worst.peak_memory_bytes if worst else None,
        "best_worst_batch_headroom_bytes": worst.headroom_bytes if worst else None,
        "best_mfu": median_or_none([r.mfu for r in ok_runs]),
        "baseline_samples_per_sec": baseline.median, "speedup": confirmation.speedup,
        "confirmation": ConfirmedFigures(
            best_runs=tuple(r.samples_per_sec for r in ok_runs),
            baseline_spread=baseline.spread, speedup_ci=confirmation.speedup_ci,
            no_measurable_difference=confirmation.no_measurable_difference,
            confirmation_repeats=confirmation.answer_rounds or confirmation.rounds,
            # the search's figure for the recommendation beside the confirmed one: the gap is
            # the winner's curse (the search keeps the luckiest measurement)
            best_search_samples_per_sec=winner.search_samples_per_sec,
            fastest_config=fastest.config, fastest_speedup=fastest.speedup,
            fastest_speedup_ci=fastest.speedup_ci, best_time_to_train_s=winner.time_to_train_s,
            baseline_time_to_train_s=baseline.time_to_train_s,
            confirmation_measured=confirmation.measured,
            taken_back=confirmation.taken_back,
            taken_from_config=confirmation.taken_from.config
            if confirmation.taken_from else None,
            worst_batch=worst, loss_check=winner.loss_check, checks=confirmation.checks,
            ruled_out=tuple(RuledOut(c.config, ruled_out_status(c.worst_batch, c.loss_check),
                                     c.excluded, c.worst_batch, c.loss_check)
                            for c in confirmation.ruled_out))}


def _search_figures(records: Sequence[TrialRecord], best: TrialRecord | None,
                    warnings: list[str]) -> dict[str, Any]:
    """The best search trial's figures against the baseline's trial, unconfirmed."""
    figures: dict[str, Any] = {
        "best_config": None, "best_samples_per_sec": None, "best_spread": None,
        "best_trial": None, "best_peak_memory_bytes": None, "best_mfu": None,
        "baseline_samples_per_sec": None, "speedup": None}
    if best is None:
        return figures
    baseline = next((r for r in records if r.role == Role.BASELINE
                     and r.status == TrialStatus.OK), None)
    best_sps = best.samples_per_sec
    base_sps = baseline.samples_per_sec if baseline else None
    figures.update(
        best_config=best.config, best_samples_per_sec=best_sps, best_trial=best.number,
        best_peak_memory_bytes=best.peak_memory_bytes, best_mfu=best.measurement.mfu,
        baseline_samples_per_sec=base_sps,
        speedup=best_sps / base_sps if best_sps and base_sps else None)
    if baseline is not None and baseline.disturbed and not best.disturbed:
        warnings.append(
            f"baseline trial #{baseline.number} "
            f"{format_disturbance(baseline.measurement.other_cpu_share)}"
            "; its rate is low and the speedup overstated")
    return figures


def _confirmation_warnings(confirmation: Confirmation) -> list[str]:
    """What the confirmation rounds say about the answer that a reader must not miss."""
    out = []
    fastest, rounds = confirmation.fastest, confirmation.rounds
    if confirmation.difference_unknown:
        out.append(f"the confirmation had time for {rounds} paired round"
                   f"{'s' if rounds != 1 else ''}, too few for an interval: whether the "
                   f"fastest measured ({fastest.speedup:.2f}x in "
                   f"{'it' if rounds == 1 else 'them'}) is faster than the baseline is not "
                   "known, so the baseline is kept; give the run more time (--timeout) to "
                   "confirm it")
    if confirmation.disturbed_rounds:
        out.append(f"{confirmation.disturbed_rounds} of {rounds} confirmation "
                   "rounds ran while other processes used the CPUs (the machine stayed busy): "
                   "the figures are low; the speedup compares runs of the same rounds")
    if confirmation.widened and confirmation.contender is not None:
        low, high = confirmation.speedup_ci
        out.append(f"the search measured the contender at {confirmation.search_speedup:.2f}x "
                   "your settings, outside the interval of the rounds: the machine's speed "
                   "moved between the search and the rounds, so the interval is widened to "
                   f"[{low:.2f}-{high:.2f}] to hold both")
    drift = confirmation.drift
    if drift and drift.beyond_noise:
        change = drift.end_samples_per_sec / drift.start_samples_per_sec - 1
        low, high = drift.end_range
        out.append(f"the machine drifted: the baseline measured "
                   f"{drift.start_samples_per_sec:,.0f} samples/s at the start of the search "
                   f"and {drift.end_samples_per_sec:,.0f} ({low:,.0f}-{high:,.0f}) in the "
                   f"confirmation rounds ({change:+.0%}, beyond their spread); the speedup "
                   "compares runs of the same rounds")
    return out


def prediction_errors(trials: Iterable[TrialRecord]) -> MemoryPredictions | None:
    """How far the predictions made before trials ran were from the peaks they measured."""
    errors = [(t.peak_memory_bytes - t.predicted_peak_bytes) / t.peak_memory_bytes
              for t in trials if t.predicted_peak_bytes and t.peak_memory_bytes
              and t.status in MEASURED_PEAK]
    if not errors:
        return None
    absolute = [abs(e) for e in errors]
    return MemoryPredictions(checked=len(errors), median_abs_error=statistics.median(absolute),
                             max_abs_error=max(absolute), median_error=statistics.median(errors))


def shorter_than_measured(run_steps: int | None, measured_steps: int | None,
                          train_steps: int | None) -> str | None:
    """Where the script's own run ends before the steps a trial measures (its first step,
    the warm-up and a timed window): the trials rank steady steps the run never reaches
    (`--train-steps` ranks by the run's own wall time)."""
    if not run_steps or not measured_steps or train_steps or run_steps >= measured_steps:
        return None
    return (f"the script's own run is {run_steps:,} optimizer steps at its settings, fewer "
            f"than a trial measures ({measured_steps:,}: its first step, the warm-up and a "
            "timed window): the trials rank steady steps that run never reaches; "
            f"`--train-steps {run_steps}` ranks by the run's whole wall time, start-up "
            "included")


def _short_run(run_steps: int | None, best: TrainConfig | None,
               payoff: CompilePayoff | None, train_steps: int | None) -> str | None:
    """Where the answer compiles and the script's own run ends before compiling pays for
    itself: the steady ranking does not hold for that run (`--train-steps` ranks by it)."""
    if not run_steps or train_steps or best is None or best.compile_mode == "none" or \
            payoff is None:
        return None
    even = payoff.break_even_steps
    if even is not None and even <= run_steps:
        return None
    after = f"after {even:,.0f} steps" if even is not None else "never, here"
    return (f"the script's own run is {run_steps:,} optimizer steps at its settings, and "
            f"torch.compile in the answer pays for its start-up {after}: for a run this "
            f"short the answer ranks steady steps, not the run; `--train-steps {run_steps}` "
            "ranks by the run's whole wall time, start-up and compile included")


def compile_payoff(records: Sequence[TrialRecord], best_trial: int | None,
                   best_config: TrainConfig | None = None) -> CompilePayoff | None:
    """What compiling cost and gained, and after how many steps it pays for itself: for the
    best configuration when it is compiled (its trial, else a trial of the same configuration:
    an answer the confirmation made has no trial of its own, else the compiled one of its mode
    that gained most), else for the compiled one that gained most."""
    rows = compile_rows(records)
    same = {r.number for r in records if best_config is not None and r.config == best_config}
    mode = {r.number for r in records if best_config is not None and r.config is not None
            and r.config.compile_mode == best_config.compile_mode}
    row = next((r for r in rows if r.trial == best_trial), None) or \
        next((r for r in rows if r.trial in same), None) or \
        max((r for r in rows if r.trial in mode), key=lambda r: r.gain, default=None) or \
        max(rows, key=lambda r: r.gain, default=None)
    if row is None:
        return None
    return CompilePayoff(trial=row.trial, reference=row.reference, compile_s=row.compile_s,
                         gain=row.gain, break_even_steps=row.break_even_steps)


def confirmed_payoff(payoff: CompilePayoff | None, confirmation: Confirmation,
                     best: TrainConfig | None) -> CompilePayoff | None:
    """The payoff of the answer's compile with its gain per step from the confirmation's paired
    rounds, where they took it back: its start-up from the search's trials, its gain from the
    answer against the answer without compile, measured in the same rounds."""
    back = next((t for t in confirmation.taken_back if t.knobs == ("compile_mode",)
                 and t.kept and t.ratio), None)
    rate = confirmation.winner.median if confirmation.winner else None
    if payoff is None or back is None or best is None or not rate or \
            best.compile_mode == "none":
        return payoff
    saved = best.effective_batch_size * (1 / (rate * back.ratio) - 1 / rate)
    return replace(payoff, reference="the answer without compile, in the paired rounds",
                   gain=1 / back.ratio - 1,
                   break_even_steps=max(0.0, payoff.compile_s) / saved if saved > 0 else None)


def compile_sentence(best: TrainConfig | None, baseline: TrainConfig | None,
                     payoff: CompilePayoff | None) -> str:
    """Where the answer compiles and the user's settings do not: what compiling costs at
    start-up and the steps after which it pays for itself, in one sentence for the verdict."""
    if best is None or payoff is None or best.compile_mode == "none" or \
            (baseline is not None and baseline.compile_mode == best.compile_mode):
        return ""
    even = payoff.break_even_steps
    pays = f"pays for itself after {even:,.0f} steps" if even is not None else \
        "never pays for itself here"
    return f"torch.compile costs {format_seconds(payoff.compile_s)} at start-up and {pays}"


def compile_rows(records: Sequence[TrialRecord]) -> list[CompileRow]:
    """For each measured compiled configuration: what compiling cost at start-up, what it
    gains per step, and the training steps after which it has paid for itself.

    The reference is the same configuration uncompiled when it was measured, else the fastest
    uncompiled one with the same precision and micro-batch, else with the same precision; a
    compiled trial with none of these is left out rather than credited with precision's gain.
    """
    ok = [r for r in records if r.status == TrialStatus.OK and not r.duplicate and r.config
          and r.samples_per_sec and r.measurement.time_to_first_step_s is not None]
    plain = [r for r in ok if r.config.compile_mode == "none"]
    rows = []
    for rec in ok:
        config = rec.config
        if config.compile_mode == "none":
            continue
        ref, how = _reference(rec, plain)
        if ref is None:
            continue
        compile_s = rec.measurement.time_to_first_step_s - ref.measurement.time_to_first_step_s
        gain = rec.samples_per_sec / ref.samples_per_sec - 1
        saved = config.effective_batch_size * (1 / ref.samples_per_sec - 1 / rec.samples_per_sec)
        rows.append(CompileRow(
            label=f"#{rec.number} {config.compile_mode}", trial=rec.number,
            config=short_config(config), reference=f"#{ref.number} ({how})",
            compile_s=compile_s, gain=gain,
            break_even_steps=max(0.0, compile_s) / saved if saved > 0 else None))
    return rows


def _twin_key(config: TrainConfig) -> tuple[Any, ...]:
    return tuple(v for k, v in sorted(config.to_dict().items()) if k != "compile_mode")


def _reference(rec: TrialRecord,
               plain: Sequence[TrialRecord]) -> tuple[TrialRecord | None, str]:
    config = rec.config

    def fastest(candidates: list[TrialRecord]) -> TrialRecord:
        return max(candidates, key=lambda r: r.samples_per_sec)

    twin = [r for r in plain if _twin_key(r.config) == _twin_key(config)]
    if twin:
        return fastest(twin), "same knobs, uncompiled"
    same = [r for r in plain if r.config.precision == config.precision]
    near = [r for r in same if r.config.micro_batch_size == config.micro_batch_size]
    if near:
        return fastest(near), "same precision and micro-batch"
    if same:
        return fastest(same), "same precision"
    return None, ""


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
